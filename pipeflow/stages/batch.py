"""Batching: group items into lists, and flatten them back."""

from __future__ import annotations

import itertools
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._context import Context
from pipeflow.engine._plan import Batches, Positions
from pipeflow.engine._stage import Stage
from pipeflow.resume._restarts import RESTARTS, Clean, restarting
from pipeflow.stages._budget import budget_batch

__all__ = ["batch", "unbatch"]

T = TypeVar("T")


def batch(
    size: int | None = None,
    *,
    drop_last: bool = False,
    max_tokens: int | None = None,
    length: Callable[[T], int] | None = None,
    window: int | None = None,
    seed: int | None = None,
) -> Stage[T, list[T]]:
    """Group items into lists of *size* items, or into batches within a token budget.

    With *max_tokens*, a batch holds as many items as keep its padded size — its item count
    times its longest item, by *length* — within *max_tokens* (and its count within *size*,
    when given): the batches ``collate(pad=...)`` pads stay under one memory budget. Without
    *window* the batches are cut in arrival order. With *window* the stage reads that many
    items ahead, sorts them by length and cuts them into batches of like lengths (so little
    is padding), and yields a window's batches in an order drawn from ``(seed, epoch)``: at
    most *window* items are held, and a resumed pass re-reads at most one window. The number
    of batches is then only known by running (the loader has no ``len()``).

    Args:
        size: items per batch; with *max_tokens*, the most items per batch (``None``: no cap).
        drop_last: drop a last batch shorter than *size* instead of yielding it (fixed-size
            batches only).
        max_tokens: the budget for a batch's padded size; ``None``: batches of *size* items.
        length: with *max_tokens*, a function giving an item's length (``len``, or
            ``lengths.__getitem__`` over dataset indices, before ``fetch``).
        window: with *max_tokens*, how many items to read ahead and sort (``None``: none,
            batches in arrival order).
        seed: with *window*, the seed of the batches' order; ``None`` draws one when the
            stage is built (it is in the repr).

    Raises:
        ValueError: if *size* < 1, *max_tokens* < 1 or *window* < 1, or for options that go
            only with *max_tokens* or only without it — when the stage is built, not on the
            first ``next()``; at run time, for an item longer than *max_tokens*.
        TypeError: if *size* is not an integer or *drop_last* not a bool, if *length* is not
            callable, or if neither *size* nor *max_tokens* is given.

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
        >>> words = ["a", "bb", "cccc", "dd", "eeeeee", "f"]
        >>> list(pf.from_iterable(words) | pf.batch(max_tokens=6, length=len))
        [['a', 'bb'], ['cccc'], ['dd'], ['eeeeee'], ['f']]
        >>> list(pf.from_iterable(words) | pf.batch(max_tokens=6, length=len, window=6, seed=0))
        [['cccc'], ['eeeeee'], ['a', 'f', 'bb'], ['dd']]
    """
    if max_tokens is not None:
        return budget_batch(max_tokens, length, size, window, seed, drop_last)
    _plain_only(length=length, window=window, seed=seed)
    if size is None:
        msg = "batch: pass size (items per batch), or max_tokens= and length="
        raise TypeError(msg)
    size = _checks.integer("batch", "size", size, low=1, high=sys.maxsize)
    _checks.boolean("batch", "drop_last", drop_last)
    config = {"size": size, "drop_last": drop_last}
    return Stage(_read, "batch", config, length=_batch_length, skip=_batch_skip, compute=_computed)


def _plain_only(**options: Any) -> None:
    """Refuse the options that go only with ``max_tokens``, naming the first one given."""
    for name, value in options.items():
        if value is not None:
            msg = f"batch: {name} goes with max_tokens=; pass max_tokens too (got {name}={value!r})"
            raise ValueError(msg)


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
    return Stage(_unbatch, "unbatch", {}, resume=RESTARTS)


@restarting
def _unbatch(batches: Iterable[Iterable[T]], context: Context, stats: Any) -> Iterator[Any]:
    """Every batch's items; before each batch, a restart point (a resumed pass restarts at
    the batch the consumer stood in, and skips the items of it that were consumed)."""
    read = context.offset
    for batch in batches:
        yield Clean(read)
        read += 1
        yield from batch
