"""Batching: group items into lists, and flatten them back."""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow._context import Context
from pipeflow._permutation import Permuted
from pipeflow._stage import Stage

__all__ = ["batch", "unbatch"]

T = TypeVar("T")

_BLOCK = 65536  # positions cut into batches at a time


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
    size = _checks.integer("batch", "size", size, low=1)
    _checks.boolean("batch", "drop_last", drop_last)
    config = {"size": size, "drop_last": drop_last}
    return Stage(_batch, "batch", config, length=_batch_length, skip=_batch_skip)


def _batch(
    items: Iterable[T], size: int, drop_last: bool, *, context: Context
) -> Iterator[list[Any]]:
    """Lists of *size* items, as torch's BatchSampler yields.

    When the input is known without reading it (the positions ``0 .. n - 1`` of ``indices``,
    or a full shuffle's permutation of them: see :class:`~pipeflow.Context`), the batches are
    cut from it in blocks, a list slice each: the stages above hand on nothing.
    """
    fact = context.facts.get("input")
    if isinstance(fact, Permuted):  # the shuffle above starts where this pass does
        blocks = map(_tolist, fact.permutation().blocks(context.offset))
        return _cut(blocks, size, drop_last)
    if context.positions is not None:
        n = context.positions
        return _cut((range(a, min(a + _BLOCK, n)) for a in range(0, n, _BLOCK)), size, drop_last)
    return _read(items, size, drop_last)


def _cut(blocks: Iterable[Sequence[int]], size: int, drop_last: bool) -> Iterator[list[int]]:
    rest: list[int] = []
    for block in blocks:
        xs = rest + list(block) if rest else list(block)
        end = len(xs) - len(xs) % size
        for i in range(0, end, size):
            yield xs[i : i + size]
        rest = xs[end:]
    if rest and not drop_last:
        yield rest


def _tolist(block: Any) -> list[int]:
    return block.tolist()  # type: ignore[no-any-return]


def _read(items: Iterable[T], size: int, drop_last: bool) -> Iterator[list[T]]:
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
