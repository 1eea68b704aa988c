"""Many machines: split each epoch across the ranks of a ``torch.distributed`` job."""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._context import Context
from pipeflow.engine._plan import Positions
from pipeflow.engine._stage import Stage, Traits
from pipeflow.errors import SplitTwiceError
from pipeflow.worker_info import current_info, in_replica, split_reads

__all__ = ["rank_and_world_size", "shard"]

T = TypeVar("T")


def rank_and_world_size() -> tuple[int, int]:
    """This process's rank and the world size.

    From an initialised ``torch.distributed`` process group, else from the ``RANK`` and
    ``WORLD_SIZE`` environment variables that ``torchrun`` sets, else ``(0, 1)``. torch is
    consulted only when the program has imported it.

    Examples:
        >>> rank_and_world_size()
        (0, 1)
    """
    import sys

    torch = sys.modules.get("torch")
    if torch is not None:
        dist = torch.distributed
        if dist.is_available() and dist.is_initialized():
            return int(dist.get_rank()), int(dist.get_world_size())
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    return 0, 1


def shard(
    rank: int | None = None, world_size: int | None = None, *, drop_last: bool = False
) -> Stage[T, T]:
    """Keep this rank's share of every epoch, as ``DistributedSampler`` splits a dataset.

    Items ``rank, rank + world_size, rank + 2 * world_size, ...`` of the (shuffled, the same
    way on every rank) stream. Every rank gets the same number of items, so DDP never waits
    on a rank that ran out: the last, incomplete round is completed with items from the
    start of the epoch (``drop_last=False``, as ``DistributedSampler`` pads) or dropped
    (``drop_last=True``). It streams: it holds at most ``world_size`` items, and works on
    endless streams too.

    Right after ``indices(n)``, or after a full ``shuffle`` of them, the loader computes the
    indices at this rank's positions instead of reading the others (the planning step,
    :mod:`pipeflow.engine._plan`), so a rank's first index comes at once whatever ``n``, and a
    resumed pass starts where it stopped. It tells the stages after it
    where its items lie in the epoch (``facts["shard"] == (rank, world_size)``: output ``j``
    is the epoch's item ``rank + j * world_size``), so :func:`~pipeflow.random_map` draws
    from the same generators for a sample whatever the world size.

    Inside :func:`~pipeflow.parallel_source`, each worker of each rank takes its own share:
    the stream is split over ``world_size * num_workers`` readers, with no duplicates. The
    source before it must then read everything: one that splits itself by worker (it reads
    ``get_worker_info().num_workers``, pipeflow's or torch's, as a WebDataset does) would be
    split twice, so the shard raises :class:`~pipeflow.errors.SplitTwiceError` at its first
    item, saying what to write instead.

    Args:
        rank: this rank; ``None`` asks ``torch.distributed`` (when initialised), else the
            ``RANK`` environment variable (``torchrun`` sets it), else 0 — when each pass
            starts, so the stage can be built before the process group.
        world_size: the number of ranks, found the same way (``WORLD_SIZE``).
        drop_last: drop the incomplete last round instead of padding it.

    Raises:
        TypeError, ValueError: for a rank or world size that is not an integer in range.
        SplitTwiceError: in a ``parallel_source`` worker, after a source that split itself.

    Examples:
        >>> import pipeflow as pf
        >>> [list(pf.indices(10) | pf.shard(r, 3)) for r in range(3)]
        [[0, 3, 6, 9], [1, 4, 7, 0], [2, 5, 8, 1]]
        >>> [list(pf.indices(10) | pf.shard(r, 3, drop_last=True)) for r in range(3)]
        [[0, 3, 6], [1, 4, 7], [2, 5, 8]]
    """
    rank = _checks.optional_integer("shard", "rank", rank, low=0)
    world_size = _checks.optional_integer("shard", "world_size", world_size, low=1)
    if rank is not None and world_size is not None and rank >= world_size:
        msg = f"shard: rank must be below world_size (got rank={rank}, world_size={world_size})"
        raise ValueError(msg)
    _checks.boolean("shard", "drop_last", drop_last)
    config = {"rank": rank, "world_size": world_size, "drop_last": drop_last}
    return Stage(_shard, "shard", config, length=_shard_length, traits=_TRAITS)


def _computed(
    upstream: Any, rank: int | None, world_size: int | None, drop_last: bool
) -> Positions | None:
    """Over positions: this rank's share of them, resolved when each pass starts."""
    if not isinstance(upstream, Positions):
        return None
    return upstream.sharded(functools.partial(_shares, rank, world_size), drop_last)


def _publish(context: Context, rank: int | None, world_size: int | None, **_: Any) -> Context:
    """Publish ``facts["shard"] = (first, step)``: output ``j`` of this stage is item
    ``first + j * step`` of the epoch before any shard (composed with an earlier one)."""
    r, w, k, m = _shares(rank, world_size)
    first, step = context.facts.get("shard", (0, 1))
    mine = (first + step * (r + k * w), step * w * m)
    return replace(context, facts={**context.facts, "shard": mine})


#: ``shard`` over positions the planning step computes; it publishes how it numbers its
#: outputs.
_TRAITS = Traits(compute=_computed, publish=_publish)


def is_shard(stage: Stage[Any, Any]) -> bool:
    """Whether *stage* is a ``shard`` (it splits the epoch by rank and worker)."""
    return stage.traits.publish is _publish


def _resolve(rank: int | None, world_size: int | None) -> tuple[int, int]:
    auto_rank, auto_world = rank_and_world_size()
    r = auto_rank if rank is None else rank
    w = auto_world if world_size is None else world_size
    if not 0 <= r < w:
        msg = f"shard: rank {r} is not below world_size {w}"
        raise ValueError(msg)
    return r, w


def _shares(rank: int | None, world_size: int | None) -> tuple[int, int, int, int]:
    """``(rank, world_size, worker, workers)``: in a ``parallel_source`` worker, the rank's
    share is split again between its workers (worker *k* of *m* keeps the rank's items
    ``k, k + m, ...``, so that the workers interleaved round-robin give the rank's share in
    its order); elsewhere ``worker, workers`` are ``0, 1``."""
    r, w = _resolve(rank, world_size)
    info = current_info()
    if info is not None and in_replica():
        return r, w, info.id, info.num_workers
    return r, w, 0, 1


def _shard_length(n: int, rank: int | None, world_size: int | None, drop_last: bool) -> int:
    _, w, k, m = _shares(rank, world_size)
    count = n // w if drop_last else -(-n // w)
    return len(range(k, count, m))


def _shard(
    items: Iterable[T],
    rank: int | None,
    world_size: int | None,
    drop_last: bool,
) -> Iterator[Any]:
    r, w, k, m = _shares(rank, world_size)
    if m == 1 and not in_replica():
        return _stream(items, r, w, drop_last)
    # A parallel_source worker: the rank's share (padded as the rank's), this worker's of it.
    return itertools.islice(_stream(_split_once(items, k, m, w * m), r, w, drop_last), k, None, m)


def _split_once(items: Iterable[T], worker: int, workers: int, step: int) -> Iterator[T]:
    """*items*, unless the source before this shard split its stream by worker already: it
    read ``num_workers`` (from pipeflow's ``get_worker_info()`` or torch's) between the start
    of this worker's pass and its first item."""
    it = iter(items)
    for first in it:
        if split_reads():
            raise SplitTwiceError(_twice(worker, workers, step))
        yield first
        yield from it


def _twice(worker: int, workers: int, step: int) -> str:
    return (
        f"shard: in parallel_source worker {worker} of {workers}, the source split its stream "
        "by worker already (it read get_worker_info().num_workers), and shard would split "
        f"what it kept again, into {step} shares (ranks x workers), losing the rest of the "
        "epoch. Split once: let shard do it (the source reads everything, shard keeps this "
        "rank's and this worker's share), or let the source split by rank too and drop shard "
        "(WebDataset: nodesplitter=wds.split_by_node), or put pf.shard() after "
        "parallel_source(..., ordered=True), where it splits the workers' stream by rank only"
    )


def _stream(items: Iterable[T], r: int, w: int, drop_last: bool) -> Iterator[T]:
    head: list[T] = []  # the epoch's first items: what pads the last round
    group: list[T] = []
    for item in items:
        if len(head) < w:
            head.append(item)
        group.append(item)
        if len(group) == w:
            yield group[r]
            group.clear()
    if group and not drop_last:
        missing = w - len(group)
        filler = (head * -(-missing // len(head)))[:missing]  # repeats head if it is short
        yield (group + filler)[r]
