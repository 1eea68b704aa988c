"""The event-loop side of coroutine workers: a job that awaits, a runner per loop, and the
process worker whose loop reads its tasks from the pipe.

One :class:`LoopRunner` lives on each event loop, in a thread of this process
(:mod:`pipeflow.parallel.pools._aio`) or in a worker process (:func:`aio_process_main`). It
starts a task for every :class:`~pipeflow.parallel.transport._wire.Task` it is given and
hands each outcome on when its coroutine finishes, so a loop holds many items at once; the
main process bounds how many (``max_in_flight``). Tasks of an abandoned pass are cancelled
when the next pass's first task arrives; stopping cancels every task, so the coroutines'
``finally`` blocks run.

Like :mod:`pipeflow.parallel.pools._worker`, this module keeps to the standard library (plus what
the user's job brings), so a spawned worker imports torch only when the user's code does.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import inspect
import os
import pickle
import socket
import struct
import sys
import time
from collections.abc import Callable
from typing import Any

from pipeflow.errors import annotate
from pipeflow.parallel.pools._fork import Pickled
from pipeflow.parallel.pools._worker import (
    MapJob,
    WorkerSpec,
    _tell_torch,
    _wait_for_stop,
    start_process_worker,
)
from pipeflow.parallel.transport import _segments
from pipeflow.parallel.transport._shm import Writer
from pipeflow.parallel.transport._wire import (
    Encoded,
    Reply,
    Task,
    Trim,
    describe_item,
    remote_error,
)

__all__ = ["CoroutineJob", "LoopRunner", "aio_process_main"]

#: How long cancelled coroutines get to run their ``finally`` blocks when a loop stops.
CANCEL_GRACE = 0.5

#: ``deliver(task, kind, took_ns, value)``: *kind* ``"ok"`` (value: the result) or ``"err"``.
Deliver = Callable[[Task, str, int, Any], None]


class CoroutineJob(MapJob):
    """Await a coroutine function on one item; an event loop runs many of these at once."""

    async def arun(self, item: Any, epoch: int, seq: int) -> Any:
        try:
            return await self.fn(item)  # type: ignore[operator]
        except Exception as e:
            annotate(e, self.name, epoch, **describe_item(item, seq))
            raise

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        """``workers=0``: one item at a time, on a fresh event loop, in the calling thread."""
        return asyncio.run(self.arun(item, epoch, seq))


class LoopRunner:
    """One event loop's share of the work: a task per item, each outcome delivered once.

    With a *limit*, at most that many coroutines run at once: further tasks wait here, in
    order, and each starts as soon as a running one ends, on the loop, without waiting for
    the thread or process that sends the tasks. So the loop stays busy while its results
    wait to be consumed.
    """

    def __init__(self, job: CoroutineJob, deliver: Deliver, limit: int | None = None) -> None:
        self.job = job
        self.fn: Any = job.fn
        self.deliver = deliver
        self.limit = limit
        self.loop: asyncio.AbstractEventLoop | None = None
        #: the pass's running items: seq -> the asyncio task (a dict for each pass, so that an
        #: item allocates no key; an abandoned pass's dict lives until its tasks are over)
        self.running: dict[int, asyncio.Task[None]] = {}
        self.records: dict[int, Task] = {}  # seq -> the task record, for the same items
        #: seq -> when each began (``time.monotonic()``), for the same items, in that order
        self.began: dict[int, float] = {}
        self.waiting: collections.deque[Task] = collections.deque()  # over the limit
        self.pass_id = 0
        self.stopping = False
        self.winding: list[dict[int, asyncio.Task[None]]] = []  # abandoned passes' running

    def oldest(self) -> float | None:
        """When the pass's longest-running item began (``None``: none runs); safe to call
        from another thread (one copy, in C, of what the loop's thread changes)."""
        return next(iter(self.began.copy().values()), None)

    def count(self) -> int:
        """Coroutines running now, the abandoned passes' included."""
        return len(self.running) + sum(map(len, self.winding))

    def start(self, task: Task) -> None:
        """Start *task* on the running loop, or queue it behind the limit (called in the
        loop's thread)."""
        if task.pass_id > self.pass_id:  # a new pass: the old one was abandoned
            self.pass_id = task.pass_id
            self._abandon()
        elif task.pass_id < self.pass_id:  # queued before the pass was abandoned
            self.deliver(task, "err", 0, asyncio.CancelledError())
            return
        limit = self.limit
        if limit is not None and (
            len(self.running) >= limit or (self.winding and self.count() >= limit)
        ):
            self.waiting.append(task)
            return
        self._begin(task)

    def _abandon(self) -> None:
        """Cancel the running pass's coroutines; answer its waiting tasks at once."""
        old, records = self.running, self.records
        self.running, self.records, self.began = {}, {}, {}
        if old:
            self.winding.append(old)
            for seq, t in list(old.items()):
                t.cancel()
                t.add_done_callback(functools.partial(self._unstarted, old, records[seq]))
        while self.waiting:  # never started
            self.deliver(self.waiting.popleft(), "err", 0, asyncio.CancelledError())

    def _begin(self, task: Task) -> None:
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        running = self.running
        running[task.seq] = self.loop.create_task(self._one(task, running))
        self.records[task.seq] = task
        self.began[task.seq] = time.monotonic()

    def _ended(self, task: Task, running: dict[int, asyncio.Task[None]]) -> bool:
        """*task*'s coroutine is over: the next waiting task, if any, starts. Whether it was
        still running (its outcome not delivered yet)."""
        if running.pop(task.seq, None) is None:
            return False
        if running is self.running:
            del self.records[task.seq], self.began[task.seq]
        elif not running:  # the last of an abandoned pass
            self.winding.remove(running)
        if self.waiting and not self.stopping:
            self._begin(self.waiting.popleft())
        return True

    def _unstarted(self, running: dict[int, asyncio.Task[None]], task: Task, _: Any) -> None:
        """A task cancelled before its coroutine ran: no ``finally`` of ours answered it."""
        if self._ended(task, running):
            self.deliver(task, "err", 0, asyncio.CancelledError())

    async def _one(self, task: Task, running: dict[int, asyncio.Task[None]]) -> None:
        started = time.perf_counter_ns()
        try:  # the user's coroutine awaited here, not through CoroutineJob.arun: one frame less
            out = await self.fn(task.item)
        except asyncio.CancelledError as e:
            if self.stopping:
                raise
            self.deliver(task, "err", 0, e)  # an abandoned pass: the main process counts it
        except BaseException as e:  # SystemExit too: it would end the loop, and the pass hang
            if isinstance(e, Exception):
                annotate(e, self.job.name, task.epoch, **describe_item(task.item, task.seq))
            self.deliver(task, "err", 0, e)
        else:
            self.deliver(task, "ok", time.perf_counter_ns() - started, out)
        finally:  # not a done callback: that would be one more loop callback per item
            self._ended(task, running)

    async def stop(self, grace: float = CANCEL_GRACE) -> None:
        """Cancel every task and give their ``finally`` blocks up to *grace* seconds."""
        self.stopping = True
        self.waiting.clear()
        tasks = [t for running in (self.running, *self.winding) for t in running.values()]
        for t in tasks:
            t.cancel()
        if tasks:
            await asyncio.wait(tasks, timeout=grace)


# -- process workers -------------------------------------------------------------------------
def aio_process_main(conn: Any, spec: WorkerSpec) -> None:
    """A coroutine worker process: set up as :func:`~pipeflow.parallel.pools._worker.process_main`
    does, then run one event loop that reads tasks from the pipe while items are in flight."""
    init = None if spec.worker_init is None else _Init(spec.worker_init)
    started = start_process_worker(conn, spec._replace(worker_init=init), defer_torch=False)
    if started is None:
        return
    job, worker_id = started[0], spec.worker_id
    writer = Writer(spec.prefix, keep_bytes=_segments.keep_budget(spec.num_workers))
    loop = asyncio.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        if init is not None and init.pending is not None:  # an async worker_init, first
            try:
                loop.run_until_complete(init.pending)
            except BaseException as e:
                conn.send_bytes(
                    pickle.dumps(Reply(None, "init", -1, worker_id, 0, remote_error(e)))
                )
                _wait_for_stop(conn)
                return
        loop.run_until_complete(_serve(conn, job, worker_id, writer))
        loop.run_until_complete(loop.shutdown_asyncgens())
    finally:
        loop.close()
        writer.close()
        conn.close()


class _Init:
    """``worker_init`` as :func:`start_process_worker` calls it; a coroutine function's
    coroutine is kept, for the worker's loop to await before its first item."""

    def __init__(self, worker_init: Any) -> None:
        self.worker_init = worker_init
        self.pending: Any = None

    def __call__(self, worker_id: int) -> None:
        init = self.worker_init
        if isinstance(init, Pickled):
            init = init.load()
        started = init(worker_id)
        if inspect.isawaitable(started):
            self.pending = started


async def _serve(conn: Any, job: CoroutineJob, worker_id: int, writer: Writer) -> None:
    """Read tasks until told to stop (or the pipe closes), then cancel what is in flight."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future[None] = loop.create_future()
    sock = socket.socket(fileno=os.dup(conn.fileno()))  # the pipe's socket, for the loop
    sock.setblocking(False)
    link = _Link(job, worker_id, writer, done)
    transport, _ = await loop.connect_accepted_socket(lambda: link, sock)
    try:
        await done
        await link.runner.stop()
    finally:
        transport.close()


class _Link(asyncio.Protocol):
    """The worker's end of the pipe, in the framing of ``multiprocessing.Connection``: a
    4-byte big-endian length (or -1 and 8 bytes), then a pickle. Replies are written without
    blocking, so a worker never waits on the main process while it is sending tasks."""

    def __init__(
        self, job: CoroutineJob, worker_id: int, writer: Writer, done: asyncio.Future[None]
    ) -> None:
        self.worker_id = worker_id
        self.writer = writer
        self.done = done
        self.buffer = bytearray()
        self.outbox: list[Reply] = []  # replies to send, in one frame, after this turn
        self.transport: Any = None
        self.runner = LoopRunner(job, self._reply)
        self.job = job
        self.told_torch = "torch" in sys.modules

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buffer
        buf += data
        while len(buf) >= 4:
            (size,) = struct.unpack_from("!i", buf)
            head = 4
            if size == -1:
                if len(buf) < 12:
                    return
                (size,) = struct.unpack_from("!Q", buf, 4)
                head = 12
            if len(buf) < head + size:
                return
            tasks: list[Task | Trim] | None = pickle.loads(buf[head : head + size])  # one send's
            del buf[: head + size]
            if tasks is None:
                self._finish()
                return
            if not self.told_torch and "torch" in sys.modules:
                from pipeflow.worker_info import current_info

                info = current_info()
                self.told_torch = info is not None and _tell_torch(info)
            start, release = self.runner.start, self.writer.release
            for task in tasks:
                if isinstance(task, Trim):  # the pass ended: nothing kept in /dev/shm
                    self.writer.trim()
                    continue
                if task.freed:
                    release(task.freed)
                start(task)

    def connection_lost(self, exc: Exception | None) -> None:
        self._finish()

    def _finish(self) -> None:
        if not self.done.done():
            self.done.set_result(None)

    def _reply(self, task: Task, kind: str, took: int, value: Any) -> None:
        if kind == "ok":
            try:
                reply = Reply(
                    task.pass_id, "ok", task.seq, self.worker_id, took, _encode(self, value)
                )
            except Exception as e:
                where = describe_item(task.item, task.seq)
                annotate(
                    e, self.job.name, task.epoch, extra="the result could not be sent back", **where
                )
                reply = Reply(task.pass_id, "err", task.seq, self.worker_id, 0, remote_error(e))
        else:
            reply = Reply(task.pass_id, "err", task.seq, self.worker_id, 0, remote_error(value))
        if not self.outbox:  # one message per turn of the loop, not one per reply
            asyncio.get_running_loop().call_soon(self._flush)
        self.outbox.append(reply)

    def _flush(self) -> None:
        replies, self.outbox = self.outbox, []
        if self.transport is None or self.transport.is_closing():
            for reply in replies:  # nobody will read them: their segments go now
                if reply.kind == "ok" and reply.payload.segment is not None:
                    _segments.discard(reply.payload.segment.name)
            return
        data = pickle.dumps(replies, protocol=5)
        size = len(data)
        head = struct.pack("!i", size) if size <= 0x7FFFFFFF else struct.pack("!iQ", -1, size)
        self.transport.writelines((head, data))


def _encode(link: _Link, value: Any) -> Encoded:
    return Encoded(*link.writer.encode(value))
