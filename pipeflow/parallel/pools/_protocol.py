"""The small protocol both worker pools keep, and what they share.

A pool runs tasks on its workers and hands back :class:`~pipeflow.parallel.transport._wire.Reply`
records; the parallel stage's generator (:mod:`pipeflow.parallel._run`) drives it through
these methods only, whether the workers are threads or processes.
"""

from __future__ import annotations

import atexit
import operator
import queue
import weakref
from collections import deque
from itertools import repeat
from typing import Any, Protocol

from pipeflow.errors import describe_indices
from pipeflow.parallel.transport._wire import Reply, describe_item

__all__ = ["LIVE", "STOP_GRACE", "InProcessPool", "Pool", "PoolDefaults", "held", "named"]

_pass_of, _seq = operator.attrgetter("pass_id"), operator.attrgetter("seq")  # of a Reply

#: How long workers get to finish their current item after being told to stop.
STOP_GRACE = 1.0
#: Every pool not closed yet: interpreter exit closes them, so nothing is left behind.
LIVE: weakref.WeakSet[Any] = weakref.WeakSet()


@atexit.register
def _close_live_pools() -> None:
    from pipeflow.parallel.pools._reap import join_all

    join_all(exiting=True)  # from now on a pool's close() reaps its workers itself
    for pool in list(LIVE):
        pool.close()


class Pool(Protocol):
    """Workers that run tasks (see :mod:`pipeflow.parallel.pools._threads` and ``_processes``)."""

    name: str
    workers: int
    closed: bool
    broken: bool  # a worker died: the pool can't be reused
    plain: bool  # an "ok" reply's payload is the result itself (nothing to decode or free)
    trims: bool  # end_pass gives back memory kept for reuse (shared memory)
    resizable: bool  # workers="auto" may change how many workers it uses mid-pass

    def resize(self, count: int, in_flight: int) -> None:
        """Use *count* of the workers from now on (``workers="auto"``), *in_flight* items at
        once at most; a worker no longer used leaves once it has no item."""

    def start_pass(self, max_in_flight: int) -> None:
        """Forget the tasks of an earlier pass; the next tasks belong to a new one."""

    def rotate(self, first: int, ended: Any) -> None:
        """Round robin: the pass's first task goes to worker *first* (a resumed pass starts
        where the uninterrupted one stood), and the workers in *ended* take none."""

    def can_submit(self) -> bool:
        """Whether any worker still takes tasks (source workers drop out when they end)."""

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        """Send item number *seq*; ``False`` (nothing sent) when no worker has room now."""

    def backlog(self, in_flight: int) -> int:
        """How many items may be out at once (sent, not yet consumed) when *in_flight* may
        run at once."""

    def submit_many(self, items: list[tuple[int, Any]], epoch: int) -> int:
        """Send ``(seq, item)`` pairs in turn; how many were sent (the first ones) before no
        worker had room."""

    def busy_since(self) -> float | None:
        """Since when (``time.monotonic()``) the worker that has held an item longest without
        finishing it has held it; ``None`` while no worker holds one. An item counts from
        when its worker started on it: one queued for a worker busy with another, or waiting
        for a worker to start, does not count yet. The stage's ``timeout`` counts from here
        (see ``_Watch`` in :mod:`pipeflow.parallel._run`)."""

    def collect(self, timeout: float | None) -> list[Reply] | None:
        """Wait for replies; ``None`` when *timeout* passed with none (a list, maybe empty,
        otherwise). Raises :class:`~pipeflow.WorkerDiedError` when a worker died."""

    def value(self, reply: Reply) -> Any:
        """The result a ``"ok"`` reply carries; raises the exception an ``"err"`` one does."""

    def drop(self, reply: Reply) -> None:
        """A reply that will not be delivered (the pass was abandoned): free what it holds."""

    def in_flight(self) -> str:
        """The items out now, in words, for a timeout's message."""

    def end_pass(self) -> None:
        """A kept pool sat idle after a pass: give back what it keeps for reuse (called
        from a timer thread, while no pass runs: see :class:`~pipeflow.parallel._kept.Kept`)."""

    def close(self) -> None:
        """Stop every worker and release everything (idempotent)."""


def held(items: dict[int, Any]) -> str:
    """Name the items a worker held: sample indices where they are indices.

    Examples:
        >>> held({3: [6, 7], 2: [4, 5]}), held({0: "a.jpg"}), held({})
        ('sample indices [4, 5, 6, 7]', 'items [0]', 'no items')
    """
    flat, indices = named(items)
    if not flat:
        return "no items"
    return f"sample indices {describe_indices(flat)}" if indices else f"items {flat}"


def named(items: dict[int, Any]) -> tuple[list[Any], bool]:
    """The sample indices of *items* (number -> item), in the order of their numbers, and
    ``True``; or, when some item is not an index or a batch of them, the numbers and
    ``False``."""
    flat: list[Any] = []
    for seq, item in sorted(items.items()):
        where = describe_item(item, seq)
        if "index" in where:
            flat.append(where["index"])
        elif "batch" in where:
            flat.extend(where["batch"])
        else:
            return sorted(items), False
    return flat, True


class PoolDefaults:
    """What a pool has unless it does better: items sent one by one, as many out as may run."""

    plain = False
    trims = False
    #: ``workers="auto"`` may change how many of its workers it uses while a pass runs
    resizable = False

    def resize(self, count: int, in_flight: int) -> None:
        """Use *count* of the workers from now on, *in_flight* items at once at most."""

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        raise NotImplementedError

    def submit_many(self, items: list[tuple[int, Any]], epoch: int) -> int:
        for sent, (seq, item) in enumerate(items):
            if not self.submit(seq, epoch, item):
                return sent
        return len(items)

    def backlog(self, in_flight: int) -> int:
        return in_flight

    def rotate(self, first: int, ended: Any) -> None:
        pass

    def end_pass(self) -> None:
        pass


class TakingTurns(PoolDefaults):
    """A pool whose workers take items in turn from ``rr_next`` (``active``: those that have
    not run out this pass): a resumed pass starts at the worker whose turn was next."""

    rr_next: int
    active: list[bool]

    def rotate(self, first: int, ended: Any) -> None:
        self.rr_next = first
        for wid in ended:
            self.active[wid] = False

    def can_submit(self) -> bool:
        return any(self.active)


class InProcessPool(PoolDefaults):
    """What pools whose workers are threads of this process share (worker threads, event-loop
    threads): results are the workers' own objects, nothing to decode or give back."""

    backend = "thread"
    plain = True
    #: what a failed ``worker_init``'s note calls a worker, before its number
    worker_kind = "thread worker"

    def __init__(self, name: str, workers: int, round_robin: bool) -> None:
        self.name = name
        self.workers = workers
        self.round_robin = round_robin
        self.closed = False
        self.broken = False
        self.pass_id = 0
        self.outstanding: dict[int, Any] = {}  # seq -> item, for the items out now
        self.results: queue.SimpleQueue[Any] = queue.SimpleQueue()

    def _mine(self, reply: Reply) -> bool:
        """Whether *reply* belongs to this pass (else it is dropped); a failed
        ``worker_init``'s is raised, with a note naming the worker."""
        if reply.kind == "init":
            reply.payload.add_note(
                f"pipeflow: worker_init in {self.worker_kind} {reply.worker} failed"
            )
            raise reply.payload
        if reply.pass_id != self.pass_id:
            return False
        self.outstanding.pop(reply.seq, None)
        return True

    def _mine_all(self, replies: list[Reply]) -> list[Reply]:
        """:meth:`_mine` over a list: in C when all are this pass's (as they mostly are)."""
        if len(set(map(_pass_of, replies))) == 1 and replies[0].pass_id == self.pass_id:
            deque(map(self.outstanding.pop, map(_seq, replies), repeat(None)), 0)
            return replies
        return [reply for reply in replies if self._mine(reply)]

    def value(self, reply: Reply) -> Any:
        if reply.kind == "err":
            error = reply.payload.pop()  # the box empties: no reply keeps the exception
            try:
                raise error
            finally:  # nor this frame, which its traceback keeps
                del error
        return reply.payload

    def drop(self, reply: Reply) -> None:
        pass

    def in_flight(self) -> str:
        return held(self.outstanding)
