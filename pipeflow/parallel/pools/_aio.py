"""Coroutine functions in ``parallel_map``: event loops in threads of this process.

``parallel_map(async_fn, workers=n)`` runs *n* asyncio event loops, each in its own thread,
and keeps up to ``max_in_flight`` coroutines in flight over all of them: each loop's runner
runs at most its share and starts the next waiting task as one ends, while the stage's
generator (:func:`pipeflow.parallel._run._results`) keeps up to twice ``max_in_flight`` items
out, so the loops always have the next ones at hand. (With fewer ``max_in_flight`` than
loops, only that many loops get a share, and items.) :class:`LoopPool` keeps the
:class:`~pipeflow.parallel.pools._protocol.Pool` protocol; what each loop does is
:class:`~pipeflow.parallel.pools._aio_worker.LoopRunner`'s. With ``backend="process"`` the same
runner runs in each worker process of a :class:`~pipeflow.parallel.pools._processes.ProcessPool`
instead (:func:`~pipeflow.parallel.pools._aio_worker.aio_process_main`).

Closing the pool cancels every coroutine in flight, so their ``finally`` blocks run, and
stops the loops within :data:`~pipeflow.parallel.pools._protocol.STOP_GRACE`.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import inspect
import itertools
import operator
import os
import queue
import threading
import time
from collections.abc import Sequence
from typing import Any

from pipeflow.parallel.pools._aio_worker import CANCEL_GRACE, LoopRunner
from pipeflow.parallel.pools._protocol import LIVE, STOP_GRACE, InProcessPool
from pipeflow.parallel.pools._worker import WorkerSpec
from pipeflow.parallel.transport._wire import Reply, Task, reply, tasks
from pipeflow.worker_info import WorkerInfo, set_thread_worker_info

__all__ = ["LoopPool"]

_worker = operator.attrgetter("worker")  # of a Reply, over a list of them in C


class LoopPool(InProcessPool):
    """Event loops in threads: each item a coroutine on the least busy loop."""

    worker_kind = "event-loop thread"
    resizable = True  # workers="auto": see resize()

    def __init__(self, spec: WorkerSpec, *, name: str, round_robin: bool) -> None:
        """*spec*: what each loop starts with (its ``worker_id`` set per loop)."""
        workers = spec.num_workers
        super().__init__(name, workers, round_robin)
        self.load = [0] * workers  # items of this pass on each loop
        self.limit = workers  # workers="auto": the loops given items are those below it
        self.usable = list(range(workers))  # the loops with a share of max_in_flight
        self._rr = itertools.cycle(self.usable)
        self.loops = [
            _Loop(spec._replace(worker_id=wid), self.results, name) for wid in range(workers)
        ]
        LIVE.add(self)

    def backlog(self, in_flight: int) -> int:
        """Twice *in_flight*: as many items again wait on the loops, to start as coroutines
        end, as run; so a loop does not wait for this thread (which has to take the GIL from
        it) to hand it more."""
        return 2 * in_flight

    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.outstanding.clear()
        self.load = [0] * self.workers
        self._share(max_in_flight)

    def _share(self, max_in_flight: int) -> None:
        """Give each loop below the limit its share of *max_in_flight*, and items; a loop
        above it keeps its share (what it holds runs to its end) but gets no new item."""
        share, extra = divmod(max_in_flight, self.limit)
        for wid, lp in enumerate(self.loops[: self.limit]):  # an int, read by the loop's thread
            lp.runner.limit = max(share + (wid < extra), 1 if self.load[wid] else 0)
        self.usable = [wid for wid, lp in enumerate(self.loops[: self.limit]) if lp.runner.limit]
        self._rr = itertools.cycle(self.usable)

    def resize(self, count: int, in_flight: int) -> None:
        """Give items to loops ``0 .. count - 1`` from now on (``workers="auto"``); a loop
        above them finishes what it holds and sits idle until the pool closes."""
        self.limit = count
        self._share(in_flight)

    def can_submit(self) -> bool:
        return True

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        if self.workers == 1:
            wid = 0
        elif self.round_robin:
            wid = next(self._rr)
        else:
            wid = min(self.usable, key=self.load.__getitem__)
        self.loops[wid].put(Task(self.pass_id, seq, epoch, item))
        self.outstanding[seq] = item
        self.load[wid] += 1
        return True

    def submit_many(self, items: list[tuple[int, Any]], epoch: int) -> int:
        if self.workers > 1:
            for seq, item in items:
                self.submit(seq, epoch, item)
            return len(items)
        self.loops[0].put_many(tasks(self.pass_id, epoch, items))
        self.outstanding.update(items)
        self.load[0] += len(items)
        return len(items)

    def busy_since(self) -> float | None:
        """When the item running longest on a loop began (``None``: none runs). Items waiting
        on a loop for a coroutine of its share to end do not count."""
        return min(filter(None, (lp.runner.oldest() for lp in self.loops)), default=None)

    def collect(self, timeout: float | None) -> list[Reply] | None:
        try:
            batch = self.results.get(timeout=timeout)
        except queue.Empty:
            return None
        out: list[Reply] = []
        while True:
            out += self._mine_all(batch)
            try:
                batch = self.results.get_nowait()
            except queue.Empty:
                break
        if self.workers == 1:
            self.load[0] -= len(out)
        else:
            for wid in map(_worker, out):
                self.load[wid] -= 1
        return out

    def close(self) -> None:
        """Cancel the coroutines in flight and stop every loop (threads joined)."""
        if self.closed:
            return
        self.closed = True
        LIVE.discard(self)
        for lp in self.loops:
            lp.stop()
        # After a timeout a loop may be stuck in blocking code: the error must not wait on it.
        deadline = time.monotonic() + (0.0 if self.broken else STOP_GRACE)
        for lp in self.loops:
            lp.thread.join(max(0.0, deadline - time.monotonic()))
        # A loop stuck in blocking user code can't be stopped; its thread is a daemon.


class _Loop:
    """One event loop and its thread. Tasks reach it through a deque, and the loop is woken
    once per batch of them; replies go back in one list per turn of the loop. Waking a thread
    per item would hand the GIL back and forth per item, which costs more than the item."""

    def __init__(
        self, spec: WorkerSpec, results: queue.SimpleQueue[list[Reply]], name: str
    ) -> None:
        job, wid = spec.job, spec.worker_id
        self.wid = wid
        self.results = results
        self.worker_init = spec.worker_init
        seed = spec.base_seed + wid
        self.info = WorkerInfo(wid, spec.num_workers, seed, job.dataset, "thread", os.getpid())
        self.inbox: collections.deque[Task] = collections.deque()
        self.woken = False
        self.ready = False  # worker_init has run: tasks may start
        self.stopped = False
        self.outbox: list[Reply] = []
        self.loop = asyncio.new_event_loop()
        self.runner = LoopRunner(job, self._deliver)
        self.thread = threading.Thread(target=self._main, name=f"pipeflow-{name}-loop-{wid}")
        self.thread.daemon = True
        self.thread.start()

    def put(self, task: Task) -> None:
        """Hand *task* to the loop (from the main thread)."""
        self.put_many((task,))

    def put_many(self, tasks: Sequence[Task]) -> None:
        """Hand *tasks* to the loop, waking it once."""
        self.inbox.extend(tasks)
        if not self.woken:
            self.woken = True
            self.loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        self.woken = False  # before draining: a task put from now on wakes the loop again
        if not self.ready:  # an async worker_init still runs: _main drains after it
            return
        inbox, start = self.inbox, self.runner.start
        while inbox:
            start(inbox.popleft())

    def _deliver(self, task: Task, kind: str, took: int, value: Any) -> None:
        if not self.outbox:
            self.loop.call_soon(self._flush)  # after the other callbacks of this turn
        if kind == "err":  # in a box the pool empties as it raises it (see _wire.Reply)
            value = [value]
        self.outbox.append(reply(task.pass_id, kind, task.seq, self.wid, took, value))

    def _flush(self) -> None:
        batch, self.outbox = self.outbox, []
        self.results.put(batch)

    def stop(self) -> None:
        self.stopped = True
        with contextlib.suppress(RuntimeError):  # the loop is closed already
            self.loop.call_soon_threadsafe(self.loop.stop)

    def _main(self) -> None:
        loop = self.loop
        asyncio.set_event_loop(loop)
        set_thread_worker_info(self.info)
        init = None
        try:
            if self.worker_init is not None:
                started = self.worker_init(self.wid)
                if inspect.isawaitable(started):  # an async worker_init: on this loop, first
                    init = asyncio.ensure_future(started, loop=loop)
                    loop.run_until_complete(init)
        except BaseException as e:
            self.results.put([Reply(None, "init", -1, self.wid, 0, e)])
        self.ready = True
        loop.call_soon(self._drain)  # what arrived while worker_init ran
        try:
            if init is not None and not init.done():  # stopped while worker_init ran
                init.cancel()
                loop.run_until_complete(asyncio.wait([init], timeout=CANCEL_GRACE))
            elif not self.stopped:
                loop.run_forever()
        finally:
            try:
                loop.run_until_complete(self.runner.stop())
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.run_until_complete(_shutdown_executor(loop))
            finally:
                loop.close()
                asyncio.set_event_loop(None)
                set_thread_worker_info(None)


async def _shutdown_executor(loop: asyncio.AbstractEventLoop) -> None:
    """Join the threads of ``asyncio.to_thread`` calls, waiting at most a moment for them."""
    with contextlib.suppress(asyncio.TimeoutError):
        await asyncio.wait_for(loop.shutdown_default_executor(), CANCEL_GRACE / 2)
