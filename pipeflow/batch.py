"""Batching: group items into lists, and flatten them back."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow._plan import Batches, Positions
from pipeflow._stage import Stage

__all__ = ["batch", "unbatch"]

T = TypeVar("T")


def batch(size: int, *, drop_last: bool = False) -> Stage[T, list[T]]:
    """Group items into lists of *size* items.

    Args:
        size: items per batch.
        drop_last: drop a last batch shorter than *size* instead of yielding it.

    Raises:
        ValueError: if *size* < 1 — when the stage is built, not on the first ``next()``.
        TypeError: if *size* is not an integer or *drop_last* not a bool.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.indices(5) | pf.batch(2))
        [[0, 1], [2, 3], [4]]
        >>> list(pf.indices(5) | pf.batch(2, drop_last=True))
        [[0, 1], [2, 3]]
        >>> pf.batch(0)
        Traceback (most recent call last):
        ...
        ValueError: batch: size must be at least 1 (got 0)
    """
    size = _checks.integer("batch", "size", size, low=1, high=sys.maxsize)
    _checks.boolean("batch", "drop_last", drop_last)
    config = {"size": size, "drop_last": drop_last}
    return Stage(_read, "batch", config, length=_batch_length, skip=_batch_skip, compute=_computed)


def _computed(upstream: Any, size: int, drop_last: bool) -> Batches | None:
    """The planning step's question: over positions, batches cut from their own blocks."""
    return Batches(upstream, size, drop_last) if isinstance(upstream, Positions) else None


def _read(items: Iterable[T], size: int, drop_last: bool) -> Iterator[list[T]]:
    """Lists of *size* items, as torch's BatchSampler yields."""
    # islice reads exactly one batch per next(): nothing is read ahead (toolz's partition_all
    # holds a whole batch back to find the last one).
    it = iter(items)
    while chunk := list(itertools.islice(it, size)):
        if drop_last and len(chunk) < size:
            return
        yield chunk


def _batch_length(n: int, size: int, drop_last: bool) -> int:
    return n // size if drop_last else -(-n // size)


def _batch_skip(k: int, size: int, drop_last: bool) -> int:
    return k * size  # the first k batches are full ones


def unbatch() -> Stage[Iterable[T], T]:
    """Flatten batches back into items: ``batch(n) | unbatch()`` is the identity.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.from_iterable([[1, 2], [3]]) | pf.unbatch())
        [1, 2, 3]
    """
    return Stage(_unbatch, "unbatch")


def _unbatch(batches: Iterable[Iterable[T]]) -> Iterator[T]:
    return itertools.chain.from_iterable(batches)
