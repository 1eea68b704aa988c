"""``cache``: keep what the stages above it made of each sample, so that later epochs skip them."""

from __future__ import annotations

import os
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._memo import Home
from pipeflow.engine._stage import Stage, Traits
from pipeflow.resume.state import Rule

__all__ = ["cache"]

T = TypeVar("T")


def cache(
    path: str | os.PathLike[str] | None = None, *, max_bytes: int | None = None
) -> Stage[T, T]:
    """Keep what the stages above it made of each sample; from the second pass on, those
    stages do not run for the samples it has, and the output is the same, item for item.

    Its *segment* is the run of one-to-one stages right above it (``fetch``, ``map``, an
    ordered ``parallel_map``, ``collate``). Each value is kept under the input that entered
    the segment: the dataset index that :func:`~pipeflow.indices` produced, whatever the
    shuffle, never the position in the epoch. Each pass still follows the order of its
    ``(seed, epoch)``: the samples the cache has come from it, the others from the segment,
    which runs on those alone (a parallel map in it works ahead on the misses only).

    Where it goes:

    - after the stages it spares, in the main process: ``pf.indices(ds) | pf.shuffle(seed=0)
      | pf.parallel_map(pf.fetch(ds) | pf.map(decode), workers=8) | pf.cache() | ...``;
    - inside a parallel map's workers, in a batched pipeline: ``pf.batch(64) |
      pf.parallel_map(pf.fetch(ds) | pf.cache() | pf.collate(), workers=8)``: it keeps
      samples, not batches, shared by the workers (files in ``/dev/shm``, mapped by every
      worker process: one copy in all, and each sample computed once in all, whichever
      worker gets its index).

    A stage before the cache that draws randomness (``random_map``, a stage that takes
    ``epoch``) is refused when the loader is built: a cache would freeze its draws. Put the
    cache before it; random stages after the cache draw as they would without it. (A
    function that draws from the global generators, ``random`` or ``np.random``, can't be
    seen: draw with ``random_map``'s generator instead.)

    A kept numpy array is read-only (the next epoch gets the same one): a stage after the
    cache that writes into a sample must copy it first.

    The cache is not part of the loader's state: a state taken with it resumes exactly in a
    fresh loader, warm or cold, since the stages it spares give the same values; its *path*
    and *max_bytes* may differ there (another machine's scratch directory).

    Args:
        path: a directory that keeps the cache on disk: reused by later runs of the same
            pipeline, under a subdirectory named by a digest of the stages above the cache
            (their names, their configuration, their functions' code, their datasets' class,
            length and attributes) and the dataset's length. A change there starts a new
            subdirectory: an entry is never served stale. Each entry is written whole and
            renamed into place, with a checksum that is checked on every read, so a cache a
            crash left half written is safe to reuse (what is missing is recomputed). A
            dataset whose files change in place, with the same length and attributes, is not
            seen: delete the directory, or give another path.
        max_bytes: a cap on the memory the cache holds (the values' array, tensor and
            string bytes, estimated for other objects). Values are kept until the cap is
            reached; the rest go to *path* when given, else are recomputed every epoch. The
            output is the same either way.

    Raises:
        TypeError, ValueError: a bad *path* or *max_bytes*, when the stage is built.

    Examples:
        >>> import pipeflow as pf
        >>> calls = []
        >>> def decode(i):
        ...     calls.append(i)
        ...     return i * 10
        ...
        >>> loader = pf.indices(4) | pf.shuffle(seed=0) | pf.map(decode) | pf.cache()
        >>> first, second = list(loader), list(loader)
        >>> len(calls)  # the second epoch decoded nothing
        4
        >>> sorted(second) == sorted(first) and second != first  # another order
        True
    """
    if path is not None:
        if not isinstance(path, (str, os.PathLike)):
            msg = f"cache: path must be a directory path or None (got {type(path).__name__})"
            raise TypeError(msg)
        path = os.fspath(path)
        if os.path.exists(path) and not os.path.isdir(path):
            msg = f"cache: path must be a directory (got {path!r}, a file)"
            raise ValueError(msg)
    max_bytes = _checks.optional_integer("cache", "max_bytes", max_bytes, low=1)
    config = {"path": path, "max_bytes": max_bytes}
    return Stage(
        _unwired,
        "cache",
        config,
        length="same",
        resume=_RULE,
        traits=Traits(failures="pass", memo=_store),
    )


def _identity(stage: Stage[Any, Any]) -> list[str]:
    """What a state compares: that there is a cache here, not where it keeps its entries or
    how many (a run resumes on another machine, with another scratch directory)."""
    return ["cache()"]


#: One out per one in, in order; its path and cap are not part of the pipeline's identity.
_RULE = Rule.below("same", identity=_identity)


def _unwired(items: Iterable[Any], path: str | None, max_bytes: int | None) -> Iterator[Any]:
    """The cache applied on its own, outside a loader: nothing above it to spare."""
    yield from items


def _store(
    segment: tuple[Stage[Any, Any], ...],
    home: Home,
    slot: str,
    path: str | None,
    max_bytes: int | None,
) -> Any:
    """The engine's door to the cache's store (see :attr:`pipeflow.Traits.memo`)."""
    from pipeflow.stages._cache_store import open_store

    return open_store(segment, home, slot, path, max_bytes)
