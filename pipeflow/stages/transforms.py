"""Per-item transforms: ``map`` and ``filter``."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._stage import Stage
from pipeflow.resume.state import Kept, Rule

__all__ = ["filter", "map", "random_map"]

T = TypeVar("T")
U = TypeVar("U")


def map(fn: Callable[[T], U]) -> Stage[T, U]:
    """Apply *fn* to every item.

    For process workers, make *fn* a module-level function or a frozen dataclass so it pickles.

    Raises:
        TypeError: if *fn* is not callable.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.indices(3) | pf.map(str))
        ['0', '1', '2']
    """
    _checks.function("map", "fn", fn)
    return Stage(_map, "map", {"fn": fn}, length="same", skip="same")


def _map(items: Iterable[T], fn: Callable[[T], U]) -> Iterator[U]:
    return builtins.map(fn, items)


def filter(predicate: Callable[[T], Any]) -> Stage[T, T]:
    """Keep the items for which *predicate* is true.

    The loader loses its ``len()`` after a filter: how many items pass is only known by
    running it. A state taken after it records how many inputs its outputs took, so a
    resumed pass neither tests nor reads again what was consumed.

    Raises:
        TypeError: if *predicate* is not callable.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.indices(6) | pf.filter(lambda i: i % 2 == 0))
        [0, 2, 4]
    """
    _checks.function("filter", "predicate", predicate)
    return Stage(_filter, "filter", {"predicate": predicate}, resume=_FILTER)


#: A filter: what its outputs took of its inputs is in the pass's record (:class:`Kept`).
_FILTER = Rule.recorded(Kept)


def _filter(
    items: Iterable[T], predicate: Callable[[T], Any], *, record: Kept | None = None
) -> Iterator[T]:
    """``builtins.filter`` (which goes on after the predicate raised: the item's error is
    its output), noting each drop in *record*."""
    if record is None:
        return builtins.filter(predicate, items)
    note = record.note

    def judged(item: T) -> Any:
        try:
            keep = predicate(item)
        except BaseException:
            note(True)  # its error is its output
            raise
        note(bool(keep))
        return keep

    return builtins.filter(judged, items)


def random_map(
    fn: Callable[[T, Any], U], *, seed: int | None = None, generator: str = "numpy"
) -> Stage[T, U]:
    """Apply ``fn(item, rng)`` with a generator made for that item alone.

    The generator is determined by ``(seed, epoch, position)``, where *position* is the item's
    place in the epoch's stream at this stage — after a :func:`~pipeflow.shard`, its place
    before sharding (``rank + j * world_size`` for the rank's item ``j``), so no two ranks
    draw the same stream. It does not depend on the worker that runs it, nor on how many
    workers there are, nor on where a resumed pass started: random augmentation gives
    bit-identical results with 0, 1 or 8 workers, threads or processes.

    numpy generators are ``Generator(PCG64(SeedSequence([seed % 2**32, seed >> 32, epoch,
    position])))``; torch generators are seeded with the first two 32-bit words of that
    ``SeedSequence``. numpy keeps both algorithms stable across releases, and pipeflow keeps
    this derivation stable across its own: a change would be announced as breaking.

    Args:
        fn: called as ``fn(item, rng)``.
        seed: the seed; ``None`` draws one when the stage is built (it is in the repr).
        generator: ``"numpy"`` (a ``numpy.random.Generator``) or ``"torch"`` (a
            ``torch.Generator``).

    Raises:
        TypeError: if *fn* is not callable or *seed* not an integer.
        ValueError: if *generator* is neither ``"numpy"`` nor ``"torch"``.

    Examples:
        >>> import pipeflow as pf
        >>> jitter = pf.random_map(lambda x, rng: x + int(rng.integers(100)), seed=0)
        >>> a = list(pf.indices(4) | jitter)
        >>> a == list(pf.indices(4) | jitter)  # same seed, same epoch: same numbers
        True
    """
    from pipeflow._random import check_seed, fresh_seed

    _checks.function("random_map", "fn", fn)
    _checks.one_of("random_map", "generator", generator, ("numpy", "torch"))
    seed = fresh_seed() if seed is None else check_seed("random_map", seed)
    config = {"fn": fn, "seed": seed, "generator": generator}
    return Stage(_random_map, "random_map", config, length="same", skip="same")


def _random_map(
    items: Iterable[T],
    fn: Callable[[T, Any], U],
    seed: int,
    generator: str,
    *,
    context: Any,
) -> Iterator[U]:
    from pipeflow._random import numpy_rng, seed_sequence_state, seed_words

    epoch = context.epoch
    if generator == "torch":
        import torch

        def make(position: int) -> Any:
            lo, hi = seed_sequence_state(seed_words(seed, epoch, position), 2)
            return torch.Generator().manual_seed(lo | (hi << 32))

    else:

        def make(position: int) -> Any:
            return numpy_rng(seed, epoch, position)

    # After a shard, item j of this rank is item first + j * step of the epoch: the draw is
    # keyed by that, so ranks never share a stream and a sample's draw is the same for any
    # world size.
    first, step = context.facts.get("shard", (0, 1))
    for j, item in enumerate(items, context.offset):
        yield fn(item, make(first + j * step))
