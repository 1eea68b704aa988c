"""Sequence packing: 1-D sequences into rows of a fixed length, with what attention masking needs.

Each row is a dict of three arrays of the row's length:

- ``"tokens"``: the packed tokens, then the pad value;
- ``"segment_ids"``: 0 on padding, and 1, 2, ... for the first, second, ... segment of the row;
- ``"positions"``: each token's place in its segment, from 0 (0 on padding).

A *segment* is the part of one sequence that lies in one row: a sequence longer than the row,
or (``concat``) one split where a row ends, makes a segment in each row it spans, and every
segment's positions restart at 0. Every token of every sequence lands in exactly one row, once;
an empty sequence makes no segment.

Two methods, both holding a bounded buffer and resumable where it was empty
(:mod:`pipeflow.resume._restarts`), so a resumed pass re-reads at most one buffer:

- ``"first_fit"`` (Grain's ``FirstFitPackIterDataset``): up to ``window`` rows are open; each
  sequence (a long one, each row-length piece of it) goes into the first open row with room,
  or a new one; when none has room and ``window`` rows are open, they are all yielded, in the
  order they were opened, and packing starts again with that sequence;
- ``"concat"``: the sequences are concatenated and cut into rows, a sequence that does not fit
  continuing in the next row; after ``window`` rows, the row in progress is padded and yielded
  where the next sequence starts, so that the buffer is empty again (at most one padded row
  per ``window`` rows).

The share of real tokens in the rows is the stage's ``efficiency`` in ``loader.stats()``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np

from pipeflow import _checks
from pipeflow.engine._context import Context
from pipeflow.engine._stage import Stage
from pipeflow.resume._restarts import RESTARTS, Clean, restarting
from pipeflow.stages import _lengths

__all__ = ["pack"]


def pack(
    length: int, *, window: int = 64, method: str = "first_fit", pad: int = 0
) -> Stage[Any, dict[str, Any]]:
    """Pack 1-D sequences into rows of *length* tokens (see the module's text).

    Args:
        length: the tokens per row.
        window: ``"first_fit"``: the rows open at once; ``"concat"``: the rows between two
            moments its buffer is empty. Both bound the memory held and what a resumed pass
            re-reads.
        method: ``"first_fit"`` (no sequence is split unless it is longer than a row) or
            ``"concat"`` (no padding but one partial row per *window* rows).
        pad: the token that fills the rest of a row.

    Raises:
        TypeError, ValueError: for a bad argument, when the stage is built; at run time, for
            an item that is not a 1-D sequence.

    Examples:
        >>> import pipeflow as pf
        >>> rows = list(pf.from_iterable([[1, 2, 3], [4, 5], [6, 7, 8, 9]]) | pf.pack(5))
        >>> for row in rows:
        ...     print(row["tokens"], row["segment_ids"], row["positions"])
        ...
        [1 2 3 4 5] [1 1 1 2 2] [0 1 2 0 1]
        [6 7 8 9 0] [1 1 1 1 0] [0 1 2 3 0]
        >>> rows = list(pf.from_iterable([[1, 2, 3], [4, 5, 6, 7]]) | pf.pack(5, method="concat"))
        >>> [row["tokens"].tolist() for row in rows], rows[1]["positions"].tolist()
        ([[1, 2, 3, 4, 5], [6, 7, 0, 0, 0]], [0, 1, 0, 0, 0])
    """
    length = _checks.integer("pack", "length", length, low=1)
    window = _checks.integer("pack", "window", window, low=1)
    _checks.one_of("pack", "method", method, ("first_fit", "concat"))
    pad = _checks.integer("pack", "pad", pad)
    config = {"length": length, "window": window, "method": method, "pad": pad}
    maker = _first_fit if method == "first_fit" else _concat
    return Stage(maker, "pack", config, resume=RESTARTS)


def _sequence(item: Any) -> np.ndarray[Any, Any]:
    """*item* as a 1-D array (a tensor on the CPU is viewed, not copied)."""
    seq: np.ndarray[Any, Any] = item
    if not isinstance(item, np.ndarray):
        seq = item.numpy() if hasattr(item, "numpy") else np.asarray(item)
    if seq.ndim != 1:
        msg = f"pack: every item must be a 1-D sequence of tokens (got shape {seq.shape})"
        raise ValueError(msg)
    return seq


def _row(pieces: list[np.ndarray[Any, Any]], length: int, pad: int) -> dict[str, Any]:
    """One row of *pieces* (each a segment), padded to *length*."""
    sizes = [len(p) for p in pieces]
    used = sum(sizes)
    tokens = np.empty(length, dtype=np.result_type(*pieces))
    np.concatenate(pieces, out=tokens[:used])
    tokens[used:] = pad
    segment_ids = np.zeros(length, dtype=np.int64)
    positions = np.zeros(length, dtype=np.int64)
    ids = np.arange(1, len(pieces) + 1, dtype=np.int64)
    segment_ids[:used] = np.repeat(ids, sizes)
    starts = np.cumsum([0, *sizes[:-1]])
    positions[:used] = np.arange(used, dtype=np.int64) - np.repeat(starts, sizes)
    return {"tokens": tokens, "segment_ids": segment_ids, "positions": positions}


def _flush(
    bins: list[list[Any]], used: list[int], length: int, pad: int, stats: Any
) -> Iterator[Any]:
    """Yield the open rows, in the order they were opened."""
    for pieces, n in zip(bins, used):
        _lengths.count(stats, n, length)
        yield _row(pieces, length, pad)


@restarting
def _first_fit(
    items: Iterable[Any], context: Context, stats: Any, length: int, window: int, method: str,
    pad: int,
) -> Iterator[Any]:  # fmt: skip
    """First fit over up to *window* open rows; all yielded when a sequence fits none."""
    read = context.offset
    bins: list[list[np.ndarray[Any, Any]]] = []
    used: list[int] = []
    for item in items:
        seq = _sequence(item)
        for start in range(0, len(seq), length):
            piece = seq[start : start + length]
            n = len(piece)
            room = length - n
            b = next((i for i, u in enumerate(used) if u <= room), -1)
            if b < 0:
                if len(bins) == window:
                    yield from _flush(bins, used, length, pad, stats)
                    bins, used = [], []
                b = len(bins)
                bins.append([])
                used.append(0)
            if start == 0 and len(bins) == 1 and not used[0]:
                yield Clean(read)  # nothing held before this sequence: a restart point
            bins[b].append(piece)
            used[b] += n
        read += 1
    yield from _flush(bins, used, length, pad, stats)


@restarting
def _concat(
    items: Iterable[Any], context: Context, stats: Any, length: int, window: int, method: str,
    pad: int,
) -> Iterator[Any]:  # fmt: skip
    """Concatenate, then cut into rows; the row in progress is closed every *window* rows."""
    read = context.offset
    pieces: list[np.ndarray[Any, Any]] = []
    used = rows = 0  # tokens in the row in progress; rows since the buffer was last empty
    for item in items:
        seq = _sequence(item)
        if rows >= window and pieces:  # close the row in progress: the buffer empties
            _lengths.count(stats, used, length)
            yield _row(pieces, length, pad)
            pieces, used = [], 0
        if not pieces:
            rows = 0
            yield Clean(read)
        start = 0
        while start < len(seq):
            piece = seq[start : start + length - used]
            pieces.append(piece)
            used += len(piece)
            start += len(piece)
            if used == length:
                _lengths.count(stats, used, length)
                yield _row(pieces, length, pad)
                pieces, used, rows = [], 0, rows + 1
        read += 1
    if pieces:
        _lengths.count(stats, used, length)
        yield _row(pieces, length, pad)
