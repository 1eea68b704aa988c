"""Length buckets: items of like lengths batched together, so that little of a batch is padding.

``bucket`` puts each item in the bucket its length falls in and batches each bucket on its own.
Two ways, by what is known up front:

- ``lengths=``, a table of lengths by dataset index: the stage reads an epoch of indices
  (before ``fetch``, so no sample is read to be bucketed), shuffles each bucket and the
  batches from ``(seed, BUCKET, epoch)``, and yields lists of indices. The batches depend only
  on the set of indices it reads, not their order, and when it reads every index of the table
  once, the epoch's number of batches is known (``len(loader)``) and a resumed pass starts at
  its batch at once.
- ``length=``, a function of an item: the stage reads ``window`` items at a time, buckets and
  batches them in arrival order, and yields a window's batches in an order drawn from
  ``(seed, BUCKET, epoch, the window's first input)``; a resumed pass re-reads at most one
  window (:mod:`pipeflow.resume._restarts`). The number of batches is known only by running.

Bucket ``i`` holds the lengths ``boundaries[i - 1] < n <= boundaries[i]``; the last one, the
lengths above the last boundary.
"""

from __future__ import annotations

import bisect
import hashlib
import itertools
import random
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import numpy as np

from pipeflow import _checks
from pipeflow._random import BUCKET, check_seed, derive, fresh_seed, numpy_rng
from pipeflow.engine._context import Context
from pipeflow.engine._stage import Stage
from pipeflow.resume._restarts import RESTARTS, Clean, restarting
from pipeflow.resume.state import Rule
from pipeflow.stages import _lengths

__all__ = ["bucket"]


class Lengths:
    """A table of lengths by dataset index: a read-only ``int64`` array, compared by value,
    shown by its size (a stage's repr stays short however long the table)."""

    __slots__ = ("array",)

    def __init__(self, values: Any) -> None:
        try:
            array = np.array(values, dtype=np.int64)
        except (TypeError, ValueError, OverflowError):
            array = None
        if array is None or array.ndim != 1 or (array.size and array.min() < 0):
            msg = (
                f"bucket: lengths must be a 1-D sequence of non-negative integers (got {values!r})"
            )
            raise ValueError(msg)
        array.flags.writeable = False
        self.array = array

    def __len__(self) -> int:
        return len(self.array)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Lengths) and np.array_equal(self.array, other.array)

    def __hash__(self) -> int:
        return hash(len(self.array))

    def __repr__(self) -> str:
        return f"<{len(self.array)} lengths>"

    def digest(self) -> str:
        """A short digest of the values: two tables of one size differ in it."""
        return hashlib.blake2b(self.array.tobytes(), digest_size=8).hexdigest()

    def __reduce__(self) -> tuple[Any, ...]:
        return (Lengths, (self.array,))


def bucket(
    boundaries: Sequence[int] | int,
    *,
    length: Callable[[Any], int] | None = None,
    lengths: Sequence[int] | None = None,
    batch_size: int | Sequence[int] | None = None,
    max_tokens: int | None = None,
    window: int | None = None,
    seed: int | None = None,
    drop_last: bool = False,
) -> Stage[Any, list[Any]]:
    """Batch items of like lengths together: each bucket of lengths is batched on its own.

    Give *lengths* (a table by dataset index; the stage then reads indices, before ``fetch``)
    or *length* (a function of an item, read in windows of *window* items); see the module's
    text for what each does. Batches hold *batch_size* items (one for all buckets, or one per
    bucket), or as many as keep a batch's padded size within *max_tokens*: ``max_tokens //``
    the bucket's longest item (over the table, or over the window).

    Args:
        boundaries: increasing lengths; bucket ``i`` holds ``boundaries[i - 1] < n <=
            boundaries[i]``, and one more bucket the rest. With *lengths*, a count of buckets
            instead: the boundaries are then the table's quantiles (shown in the repr).
        length: a function giving an item's length (``len``, or one reading a field).
        lengths: the length of every dataset index (a list or a 1-D array).
        batch_size: items per batch: one number, or one per bucket.
        max_tokens: instead of *batch_size*, the budget for a batch's padded size.
        window: with *length*, how many items are bucketed at a time.
        seed: the seed of the order of the batches (and, with *lengths*, within buckets);
            ``None`` draws one when the stage is built (it is in the repr).
        drop_last: drop the batches shorter than their bucket's batch size.

    Raises:
        TypeError, ValueError: for a bad argument or combination, when the stage is built;
            at run time, for an index outside the table, or an item longer than *max_tokens*.

    Examples:
        >>> import pipeflow as pf
        >>> table = [3, 9, 4, 10, 2, 8]  # the length of each sample
        >>> loader = pf.indices(6) | pf.bucket([5], lengths=table, batch_size=2, seed=0)
        >>> len(loader), sorted(sorted(b) for b in loader)
        (4, [[0, 4], [1, 3], [2], [5]])
        >>> words = ["aaa", "b", "cccc", "dd", "eeeee", "f"]
        >>> by_len = pf.bucket([2], length=len, batch_size=2, window=6, seed=1)
        >>> list(pf.from_iterable(words) | by_len)
        [['eeeee'], ['b', 'dd'], ['aaa', 'cccc'], ['f']]
    """
    table = _source_of_lengths(length, lengths, window)
    boundaries = _boundaries(boundaries, table)
    sizes = _batch_sizes(batch_size, max_tokens, len(boundaries) + 1)
    longest = int(table.array.max()) if table is not None and len(table) else 0
    if max_tokens is not None and longest > max_tokens:
        raise _lengths.over_budget("bucket", longest, max_tokens)
    seed = fresh_seed() if seed is None else check_seed("bucket", seed)
    _checks.boolean("bucket", "drop_last", drop_last)
    config: dict[str, Any] = {"boundaries": boundaries, **sizes, "seed": seed}
    if table is not None:
        config = {"boundaries": boundaries, "lengths": table, **sizes, "seed": seed}
        config["drop_last"] = drop_last
        length_ = _index_length
        return Stage(_by_index, "bucket", config, length=length_, resume=_BY_INDEX)  # type: ignore[arg-type]
    config = {"boundaries": boundaries, "length": length, **sizes, "window": window}
    config.update(seed=seed, drop_last=drop_last)
    return Stage(_by_window, "bucket", config, resume=RESTARTS)


def _source_of_lengths(
    length: Callable[[Any], int] | None, lengths: Sequence[int] | None, window: int | None
) -> Lengths | None:
    """The table of lengths (``lengths=``), or ``None`` for a function (``length=``, read in
    windows): exactly one of them, and *window* with the function only."""
    if (length is None) == (lengths is None):
        msg = (
            "bucket: pass lengths= (the length of every dataset index) or length= (a "
            "function of an item), exactly one of them"
        )
        raise TypeError(msg)
    if lengths is not None:
        if window is not None:
            msg = (
                "bucket: window goes with length=; with lengths= it reads whole epochs "
                f"(got window={window!r})"
            )
            raise ValueError(msg)
        return lengths if isinstance(lengths, Lengths) else Lengths(lengths)
    _checks.function("bucket", "length", length)
    if window is None:
        msg = "bucket: length= reads items in windows; pass window= (the items held at once)"
        raise TypeError(msg)
    _checks.integer("bucket", "window", window, low=1)
    return None


def _boundaries(boundaries: Any, table: Lengths | None) -> tuple[int, ...]:
    """Increasing boundaries: as given, or the table's quantiles for a count of buckets."""
    if isinstance(boundaries, bool) or not isinstance(boundaries, (int, Sequence)):
        msg = (
            "bucket: boundaries must be a list of lengths or a count of buckets "
            f"(got {boundaries!r})"
        )
        raise TypeError(msg)
    if isinstance(boundaries, int):
        count = _checks.integer("bucket", "boundaries", boundaries, low=1)
        if table is None:
            msg = (
                f"bucket: boundaries as a count of buckets (got {count}) needs lengths=, the "
                "table whose quantiles it takes"
            )
            raise ValueError(msg)
        if not len(table):
            return ()
        cuts = np.quantile(table.array, [i / count for i in range(1, count)], method="lower")
        return tuple(sorted({int(c) for c in cuts}))
    values = tuple(_checks.integer("bucket", "boundaries", b, low=0) for b in boundaries)
    if any(a >= b for a, b in itertools.pairwise(values)):
        msg = f"bucket: boundaries must increase (got {list(values)})"
        raise ValueError(msg)
    return values


def _batch_sizes(batch_size: Any, max_tokens: Any, buckets: int) -> dict[str, Any]:
    """``{"batch_size": ..., "max_tokens": ...}``, checked: exactly one of them given."""
    if (batch_size is None) == (max_tokens is None):
        msg = "bucket: pass batch_size= or max_tokens=, exactly one of them"
        raise TypeError(msg)
    if max_tokens is not None:
        max_tokens = _checks.integer("bucket", "max_tokens", max_tokens, low=1)
        return {"batch_size": None, "max_tokens": max_tokens}
    if isinstance(batch_size, Sequence):
        sizes = tuple(_checks.integer("bucket", "batch_size", b, low=1) for b in batch_size)
        if len(sizes) != buckets:
            msg = f"bucket: batch_size needs one size per bucket, {buckets} (got {len(sizes)})"
            raise ValueError(msg)
        return {"batch_size": sizes, "max_tokens": None}
    batch_size = _checks.integer("bucket", "batch_size", batch_size, low=1)
    return {"batch_size": batch_size, "max_tokens": None}


def _size(batch_size: Any, max_tokens: int | None, which: int, longest: int) -> int:
    """Bucket *which*'s batch size, its longest item being *longest*."""
    if max_tokens is not None:
        return max(1, max_tokens // max(longest, 1))
    return int(batch_size[which] if isinstance(batch_size, tuple) else batch_size)


def _cuts(count: int, size: int, drop_last: bool) -> range:
    """Where a bucket of *count* items is cut into batches of *size*."""
    return range(0, count - count % size if drop_last else count, size)


# -- with a table of lengths: an epoch of indices at a time -----------------------------------
def _table_identity(stage: Stage[Any, Any]) -> list[str]:
    """Its repr, and the digest of its table: a state from another table is refused."""
    return [f"{stage!r} # lengths {stage.config['lengths'].digest()}"]


#: ``bucket(lengths=...)`` reads a whole epoch, so it starts at any batch (it seeks:
#: reading the indices again is cheap).
_BY_INDEX = Rule.seek(identity=_table_identity)


def _table_sizes(
    table: np.ndarray[Any, Any], boundaries: tuple[int, ...], batch_size: Any, max_tokens: Any
) -> tuple[np.ndarray[Any, Any], list[int]]:
    """Each table entry's bucket, and each bucket's batch size (from the whole table, so that
    ``len()`` holds whichever indices the epoch reads)."""
    which = np.searchsorted(np.asarray(boundaries, dtype=np.int64), table, side="left")
    longest = np.ones(len(boundaries) + 1, dtype=np.int64)
    np.maximum.at(longest, which, table)
    sizes = [_size(batch_size, max_tokens, b, int(n)) for b, n in enumerate(longest)]
    return which, sizes


def _index_length(
    n: int, boundaries: tuple[int, ...], lengths: Lengths, batch_size: Any, max_tokens: Any,
    seed: int, drop_last: bool,
) -> int | None:  # fmt: skip
    """Batches per epoch, when the stage reads every index of the table once."""
    if n != len(lengths):
        return None
    which, sizes = _table_sizes(lengths.array, boundaries, batch_size, max_tokens)
    counts = np.bincount(which, minlength=len(sizes))
    return sum(len(_cuts(int(c), s, drop_last)) for c, s in zip(counts, sizes))


def _read_indices(items: Iterable[Any], size: int) -> np.ndarray[Any, Any]:
    """The epoch's indices, each checked against the table; when there are as many as the
    table has entries, each must come once (``len()`` counted on it)."""
    try:
        idx = np.fromiter(items, dtype=np.int64)
    except (TypeError, ValueError) as e:
        msg = (
            "bucket: with lengths=, its items must be dataset indices (integers); put it "
            "before fetch"
        )
        raise TypeError(msg) from e
    if idx.size and (idx.min() < 0 or idx.max() >= size):
        bad = int(idx[(idx < 0) | (idx >= size)][0])
        msg = f"bucket: index {bad} is outside lengths= ({size} entries)"
        raise ValueError(msg)
    if idx.size == size and size and np.bincount(idx, minlength=size).max() > 1:
        twice = int(np.flatnonzero(np.bincount(idx, minlength=size) > 1)[0])
        msg = (
            f"bucket: its {size} items must be the indices 0..{size - 1} of lengths=, each "
            f"once, for the epoch's length to hold (index {twice} came more than once)"
        )
        raise ValueError(msg)
    return idx


def _by_index(
    items: Iterable[Any], *, context: Context, stats: Any, boundaries: tuple[int, ...],
    lengths: Lengths, batch_size: Any, max_tokens: Any, seed: int, drop_last: bool,
) -> Iterator[list[int]]:  # fmt: skip
    """An epoch's batches of indices, from its batch ``context.start`` on."""
    table = lengths.array
    idx = np.sort(_read_indices(items, len(table)))  # the batches depend on the set only
    which_all, sizes = _table_sizes(table, boundaries, batch_size, max_tokens)
    which = which_all[idx]
    grouped = idx[np.argsort(which, kind="stable")]  # by bucket, each in index order
    ends = np.cumsum(np.bincount(which, minlength=len(sizes)))
    rng = numpy_rng(seed, BUCKET, context.epoch)
    batches: list[np.ndarray[Any, Any]] = []
    for b, size in enumerate(sizes):
        members = grouped[ends[b - 1] if b else 0 : ends[b]]
        members = members[rng.permutation(len(members))]
        batches += [members[a : a + size] for a in _cuts(len(members), size, drop_last)]
    for i in rng.permutation(len(batches))[context.start :]:
        got = table[batches[i]]
        _lengths.count(stats, int(got.sum()), len(got) * max(int(got.max()), 1))
        yield batches[i].tolist()


# -- with a function of an item: a window at a time -------------------------------------------
@restarting
def _by_window(
    items: Iterable[Any], context: Context, stats: Any, boundaries: tuple[int, ...],
    length: Callable[[Any], Any], batch_size: Any, max_tokens: Any, window: int, seed: int,
    drop_last: bool,
) -> Iterator[Any]:  # fmt: skip
    """Per window: each bucket batched in arrival order, the batches in a drawn order."""
    it = iter(items)
    read = context.offset
    while chunk := list(itertools.islice(it, window)):
        lens = [_lengths.measure("bucket", length, x) for x in chunk]
        groups: list[list[int]] = [[] for _ in range(len(boundaries) + 1)]
        for i, n in enumerate(lens):
            groups[bisect.bisect_left(boundaries, n)].append(i)
        parts: list[list[int]] = []
        for b, members in enumerate(groups):
            longest = max((lens[i] for i in members), default=0)
            if max_tokens is not None and longest > max_tokens:
                raise _lengths.over_budget("bucket", longest, max_tokens)
            size = _size(batch_size, max_tokens, b, longest)
            parts += [members[a : a + size] for a in _cuts(len(members), size, drop_last)]
        random.Random(derive(seed, BUCKET, context.epoch, read)).shuffle(parts)
        for part in parts:
            got = [lens[i] for i in part]
            _lengths.count(stats, sum(got), len(got) * max(max(got), 1))
            yield [chunk[i] for i in part]
        read += len(chunk)
        yield Clean(read)
