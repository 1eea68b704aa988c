"""``batch(max_tokens=..., length=...)``: batches whose padded size stays within a token budget.

Two ways to cut them, both resumable at a restart point (:mod:`pipeflow.resume._restarts`):

- in arrival order (``window=None``): a batch ends where the next item would take its
  padded size over the budget; every batch boundary is a restart point;
- from a look-ahead of ``window`` items: each window is sorted by length (ties in arrival
  order), cut into batches, and its batches are yielded in an order drawn from
  ``(seed, TOKEN_BATCH, epoch, the window's first input)``; every window's start is a
  restart point, so a resumed pass re-reads at most one window.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeflow import _checks
from pipeflow._random import TOKEN_BATCH, check_seed, derive, fresh_seed
from pipeflow.engine._context import Context
from pipeflow.engine._stage import Stage
from pipeflow.resume._restarts import RESTARTS, Clean, restarting
from pipeflow.stages import _lengths

__all__ = ["budget_batch"]


def budget_batch(
    max_tokens: Any,
    length: Any,
    size: Any,
    window: Any,
    seed: Any,
    drop_last: bool,
) -> Stage[Any, list[Any]]:
    """The stage ``batch(size, max_tokens=..., length=..., window=..., seed=...)`` builds
    (its arguments checked here, naming ``batch``)."""
    max_tokens = _checks.integer("batch", "max_tokens", max_tokens, low=1)
    if length is None:
        msg = "batch: max_tokens needs length=, the function that gives an item's length"
        raise TypeError(msg)
    _checks.function("batch", "length", length)
    size = _checks.optional_integer("batch", "size", size, low=1)
    window = _checks.optional_integer("batch", "window", window, low=1)
    if drop_last:
        msg = "batch: drop_last applies to batches of a fixed size, not to max_tokens"
        raise ValueError(msg)
    config = {"max_tokens": max_tokens, "length": length, "size": size, "window": window}
    if window is None:
        if seed is not None:
            msg = (
                f"batch: seed orders the batches of a window; pass window= too (got "
                f"seed={seed!r}, window=None)"
            )
            raise ValueError(msg)
        return Stage(_in_order, "batch", config, resume=RESTARTS)
    config["seed"] = fresh_seed() if seed is None else check_seed("batch", seed)
    return Stage(_by_window, "batch", config, resume=RESTARTS)


@restarting
def _in_order(
    items: Iterable[Any],
    context: Context,
    stats: Any,
    max_tokens: int,
    length: Callable[[Any], Any],
    size: int | None,
    window: None,
) -> Iterator[Any]:
    """Batches in arrival order, each ending where the next item would break the budget."""
    read = context.offset
    batch: list[Any] = []
    longest = real = 0
    for item in items:
        n = _lengths.measure("batch", length, item)
        if n > max_tokens:
            raise _lengths.over_budget("batch", n, max_tokens)
        longer = max(longest, n, 1)
        full = size is not None and len(batch) == size
        if batch and (full or (len(batch) + 1) * longer > max_tokens):
            _lengths.count(stats, real, len(batch) * longest)
            yield batch
            yield Clean(read)  # the next batch starts with this item
            batch, real, longer = [], 0, max(n, 1)
        batch.append(item)
        longest, real, read = longer, real + n, read + 1
    if batch:
        _lengths.count(stats, real, len(batch) * longest)
        yield batch


@restarting
def _by_window(
    items: Iterable[Any],
    context: Context,
    stats: Any,
    max_tokens: int,
    length: Callable[[Any], Any],
    size: int | None,
    window: int,
    seed: int,
) -> Iterator[Any]:
    """Per window of items: sorted by length, cut by the budget, batches in a drawn order."""
    it = iter(items)
    read = context.offset
    while chunk := list(itertools.islice(it, window)):
        lengths = [_lengths.measure("batch", length, x) for x in chunk]
        order = sorted(range(len(chunk)), key=lengths.__getitem__)
        ordered = [lengths[i] for i in order]
        spans = _lengths.cut(ordered, max_tokens, size, "batch")
        random.Random(derive(seed, TOKEN_BATCH, context.epoch, read)).shuffle(spans)
        for a, b in spans:
            _lengths.count(stats, sum(ordered[a:b]), (b - a) * max(ordered[b - 1], 1))
            yield [chunk[i] for i in order[a:b]]
        read += len(chunk)
        yield Clean(read)
