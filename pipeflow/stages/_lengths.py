"""What the sequence stages share: an item's length, cutting by a token budget, and counting
how much of what they make is real tokens (``stats()``'s efficiency line).

A batch's *padded size* is its item count times its longest item (an empty item counts as
one token: it still takes a row of the padded batch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["count", "cut", "measure", "over_budget"]


def measure(stage: str, length: Callable[[Any], Any], item: Any) -> int:
    """``length(item)``, which must be a non-negative integer."""
    n = length(item)
    if isinstance(n, bool) or not hasattr(type(n), "__index__") or n.__index__() < 0:
        msg = f"{stage}: length(item) must be a non-negative integer (got {n!r})"
        raise ValueError(msg)
    return int(n.__index__())


def over_budget(stage: str, n: int, max_tokens: int) -> ValueError:
    """The error for an item that no batch under *max_tokens* can hold."""
    msg = (
        f"{stage}: an item of length {n} is longer than max_tokens={max_tokens}, so no batch "
        "under the budget can hold it; crop long items in a map before this stage, or raise "
        "max_tokens"
    )
    return ValueError(msg)


def cut(
    lengths: Sequence[int], max_tokens: int, size: int | None, stage: str
) -> list[tuple[int, int]]:
    """``(start, stop)`` of consecutive batches over *lengths*: each as long as its padded size
    stays within *max_tokens* and its count within *size* (``None``: no cap).

    Examples:
        >>> cut([2, 2, 3, 5, 1], 8, None, "batch")
        [(0, 2), (2, 3), (3, 4), (4, 5)]
        >>> cut([1, 1, 1], 8, 2, "batch")
        [(0, 2), (2, 3)]
    """
    out: list[tuple[int, int]] = []
    start = longest = 0
    for i, n in enumerate(lengths):
        if n > max_tokens:
            raise over_budget(stage, n, max_tokens)
        longer = max(longest, n, 1)
        count = i - start + 1
        if i > start and (count * longer > max_tokens or (size is not None and count > size)):
            out.append((start, i))
            start, longer = i, max(n, 1)
        longest = longer
    if start < len(lengths):
        out.append((start, len(lengths)))
    return out


def count(stats: Any, real: int, padded: int) -> None:
    """Add a batch's or row's *real* tokens and its *padded* size to the stage's statistics
    (a :class:`~pipeflow.stats.StageRecord`, or ``None`` when they are not recorded)."""
    if stats is not None:
        stats.real_tokens += real
        stats.padded_tokens += padded
