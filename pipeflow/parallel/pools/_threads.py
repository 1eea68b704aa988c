"""Worker threads: a shared task queue for maps, one queue per thread for round-robin and
sources. Items and results are shared, nothing is pickled."""

from __future__ import annotations

import itertools
import operator
import os
import queue
import threading
import time
from collections import deque
from collections.abc import Callable
from functools import partial
from typing import Any

from pipeflow.errors import WorkerDiedError, _add_note, annotate, is_annotated
from pipeflow.parallel.pools._protocol import LIVE, STOP_GRACE, InProcessPool
from pipeflow.parallel.pools._reap import in_background
from pipeflow.parallel.pools._worker import Snapshotter, SourceJob, WorkerSpec, restore_worker
from pipeflow.parallel.transport._wire import Exhausted, Reply, Task, describe_item, tasks
from pipeflow.worker_info import WorkerInfo, set_thread_worker_info

__all__ = ["DIED", "ThreadPool"]

_kind = operator.attrgetter("kind")  # of a Reply, over a list of them in C

#: How often a wait for replies looks whether every worker thread still runs: one that ended
#: without a word (it reports whatever it dies of, unless reporting fails too) ends the pass.
_LOOK_EVERY = 0.5

#: The attribute that marks the exception a worker thread died of (its worker id), so that
#: ``parallel_source`` can name where that worker stood in its stream.
DIED = "_pipeflow_thread_died"


class ThreadPool(InProcessPool):
    """Worker threads: a shared task queue for maps, one queue per thread for sources."""

    resizable = True  # workers="auto": see resize()

    def __init__(self, spec: WorkerSpec, *, name: str, round_robin: bool) -> None:
        """*spec*: what each worker starts with (its ``worker_id`` set per thread). Threads
        start as work arrives: a task for a thread not started yet (round robin), or, on the
        shared queue, a thread per task out, up to the pool's size (an item may block its
        thread, on I/O: a thread per item in flight is what lets them all wait at once)."""
        workers = spec.num_workers
        super().__init__(name, workers, round_robin)
        self.spec = spec
        self.current = [0]  # shared with the threads: tasks of other passes are skipped
        self.active = [True] * workers
        shared: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.queues = [queue.SimpleQueue() if round_robin else shared for _ in range(workers)]
        self._rr = itertools.cycle(range(workers))
        self.threads: list[threading.Thread] = []
        #: when each thread took the task it runs now (0.0: none), written by the threads
        self.busy = [0.0] * workers
        self.died = False  # a worker thread is gone: the pool is broken, its others joined
        # workers="auto" (shared queue only): how many threads take items, and the threads
        # told to leave when it went down
        self.limit = workers
        self.running = 0  # threads started and not told to leave
        self.leaving = Leaving()
        LIVE.add(self)

    def _start(self, wid: int) -> None:
        """Start thread *wid* (threads start in order of their ids; after a resize down,
        the lowest id a thread left, or, while those that left still end, one past the
        pool's size: ``workers="auto"`` on the shared queue)."""
        spec, job = self.spec, self.spec.job
        own_job = job.clone() if isinstance(job, SourceJob) else job
        restore = spec.restore[wid] if spec.restore and wid < len(spec.restore) else None
        own = spec._replace(job=own_job, worker_id=wid, restore=restore)
        tasks = self.queues[wid] if self.round_robin else self.queues[0]
        if wid >= len(self.busy):  # the same list, which the threads share
            self.busy.extend([0.0] * (wid + 1 - len(self.busy)))
        t = threading.Thread(
            target=thread_main,
            args=(tasks, self.results, own, self.current, self.busy, self.leaving),
            name=f"pipeflow-{self.name}-{wid}",
            daemon=True,
        )
        t.start()
        if wid < len(self.threads):
            self.threads[wid] = t
        else:
            self.threads.append(t)
        self.running += 1

    def _grow(self) -> None:
        """Shared queue: one thread more while fewer run than there are tasks out."""
        if self.running < min(self.limit, len(self.outstanding)):
            if self.leaving.cancel():  # a thread told to leave stays instead
                self.running += 1
            else:
                self._start(self._free_id())

    def _free_id(self) -> int:
        """The id of the next thread: the lowest one whose thread left, else a new one."""
        left = self.leaving.left
        for wid in sorted(left):
            if not self.threads[wid].is_alive():
                left.remove(wid)
                return wid
        return len(self.threads)

    def resize(self, count: int, in_flight: int) -> None:
        """Use *count* threads from now on (``workers="auto"``): more start as items come;
        the ones too many leave as each ends the item it runs (:class:`Leaving`)."""
        self.limit = count
        if self.running > count:
            self.leaving.add(self.running - count)
            self.running = count

    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.current[0] = self.pass_id
        self.active = [True] * self.workers
        self.outstanding.clear()
        self._rr = itertools.cycle(range(self.workers))  # each pass starts at worker 0

    def rotate(self, first: int, ended: Any) -> None:
        self._rr = itertools.cycle([*range(first, self.workers), *range(first)])
        for wid in ended:
            self.active[wid] = False

    def can_submit(self) -> bool:
        return any(self.active)

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        wid = -1
        if self.round_robin:
            for _ in range(self.workers):
                wid = next(self._rr)
                if self.active[wid]:
                    break
            while len(self.threads) <= wid:  # in order: the ids below it get their own soon
                self._start(len(self.threads))
        self.queues[max(wid, 0)].put(Task(self.pass_id, seq, epoch, item))
        self.outstanding[seq] = item
        if not self.round_robin and self.running < self.limit:
            self._grow()
        return True

    def submit_many(self, items: list[tuple[int, Any]], epoch: int) -> int:
        if self.round_robin:
            for seq, item in items:
                self.submit(seq, epoch, item)
            return len(items)
        todo = iter(tasks(self.pass_id, epoch, items))
        put = self.queues[0].put
        self.outstanding.update(items)
        for task in todo:  # each task out first, so the threads started work while more start
            put(task)
            if self.running >= self.limit:
                break
            self._grow()
        deque(map(put, todo), 0)
        return len(items)

    def busy_since(self) -> float | None:
        """When the task run longest by a thread now was taken (``None``: none runs one).
        Tasks in a queue, not taken yet, do not count."""
        return min(filter(None, self.busy), default=None)

    def collect(self, timeout: float | None) -> list[Reply] | None:
        first = self._wait(timeout)
        if first is None:
            return None
        got: list[Reply] = [first]
        while True:
            try:
                got.append(self.results.get_nowait())
            except queue.Empty:
                break
        if "init" in map(_kind, got):  # a worker thread's last words: it failed to start, or died
            self._raise_death(next(r for r in got if r.kind == "init"))
        out = self._mine_all(got)
        if "end" in map(_kind, out):  # source workers that ran out
            for reply in out:
                if reply.kind == "end":
                    self.active[reply.worker] = False
        return out

    def _wait(self, timeout: float | None) -> Reply | None:
        """The next reply, or ``None`` after *timeout* (``None``: no limit). While it waits
        it looks, every :data:`_LOOK_EVERY` seconds, whether a worker thread ended: one that
        ended without a reply ends the pass with :class:`WorkerDiedError`, never a hang."""
        get: Callable[..., Reply] = self.results.get
        if timeout is not None and timeout <= _LOOK_EVERY:
            try:
                return get(timeout=timeout)
            except queue.Empty:
                return self._last_words()
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            wait = _LOOK_EVERY if deadline is None else deadline - time.monotonic()
            try:
                return get(timeout=max(0.0, min(wait, _LOOK_EVERY)))
            except queue.Empty:
                pass
            last = self._last_words()
            if last is not None or (deadline is not None and time.monotonic() >= deadline):
                return last

    def _last_words(self) -> Reply | None:
        """Nothing came: if a worker thread has ended (none does before :meth:`close`), its
        reply if it sent one just before, else a :class:`WorkerDiedError`; ``None`` while
        every thread runs."""
        gone = set(self.leaving.left)  # read once: a thread may leave while this looks
        dead = [w for w, t in enumerate(self.threads) if not t.is_alive() and w not in gone]
        if not dead or self.closed:
            return None
        try:
            last: Reply = self.results.get_nowait()
        except queue.Empty:
            pass
        else:
            return last
        self.died = self.broken = True
        msg = (
            f"parallel stage {self.name!r}: thread worker {dead[0]} of {self.workers} ended "
            "without a reply"
        )
        error = WorkerDiedError(msg)
        error.worker = dead[0]  # parallel_source names where the worker stood in its stream
        raise error

    def _raise_death(self, reply: Reply) -> None:
        """Raise what a worker thread's last reply says: its ``worker_init`` (or set-up)
        failed (``pass_id`` ``None``), or it died of an error outside an item's own code
        (see :func:`thread_main`). That thread is gone: the pool is not reused."""
        self.died = self.broken = True
        error = reply.payload
        if reply.pass_id is None:
            _add_note(error, f"pipeflow: worker_init in {self.worker_kind} {reply.worker} failed")
        raise error

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        LIVE.discard(self)
        for q in {id(q): q for q in self.queues}.values():
            for _ in range(max(self.workers, len(self.threads))):
                q.put(None)
        # After a timeout a thread may be stuck in user code: the error must not wait on it.
        # Else the reaper waits for them (interpreter exit waits for it), not the consumer.
        if not self.broken or self.died:
            in_background(partial(_join, self.threads, STOP_GRACE))
        # A thread stuck in user code can't be stopped; it is a daemon and holds no process.


class Leaving:
    """How many threads of a shared queue are still to leave (``workers="auto"`` went
    down), and the ids of those that left. A thread looks between two items: one that runs
    an item ends it first, and an idle one leaves after its next item (or at close)."""

    __slots__ = ("due", "left", "lock")

    def __init__(self) -> None:
        self.due = 0
        self.left: list[int] = []
        self.lock = threading.Lock()

    def add(self, count: int) -> None:
        """*count* more threads are to leave."""
        with self.lock:
            self.due += count

    def take(self, wid: int) -> bool:
        """Thread *wid* ended an item: whether it is one to leave (its id then goes to
        :attr:`left`)."""
        with self.lock:
            if self.due <= 0:
                return False
            self.due -= 1
            self.left.append(wid)
            return True

    def cancel(self) -> bool:
        """One thread fewer to leave (the count went up again): whether there was one."""
        with self.lock:
            if self.due <= 0:
                return False
            self.due -= 1
            return True


def _join(threads: list[threading.Thread], grace: float) -> None:
    deadline = time.monotonic() + grace
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))


# -- thread workers -------------------------------------------------------------------------
def thread_main(
    tasks: queue.SimpleQueue[Any],
    results: queue.SimpleQueue[Any],
    spec: WorkerSpec,
    current: list[int],
    busy: list[float],
    leaving: Leaving | None = None,
) -> None:
    """A thread worker: the same protocol as a process worker, through queues, no pickling;
    tasks whose pass is not ``current[0]`` (an abandoned pass's) are skipped. While it runs a
    task, ``busy[worker_id]`` says since when (for the stage's ``timeout``). Between two
    items it leaves when *leaving* says one thread is to (``workers="auto"`` went down).

    Whatever it dies of (an error outside an item's own code: taking its replica's state for
    ``state_dict()``, say), its last reply says so (kind ``"init"``, with the task's pass),
    and the consumer raises that error instead of waiting for a reply that never comes."""
    job, worker_id = spec.job, spec.worker_id
    seed = spec.base_seed + worker_id
    info = WorkerInfo(worker_id, spec.num_workers, seed, job.dataset, "thread", os.getpid())
    set_thread_worker_info(info)
    task: Task | None = None
    try:
        try:
            if spec.worker_init is not None:
                spec.worker_init(worker_id)
            restore_worker(job, spec.restore)
        except BaseException as e:
            results.put(Reply(None, "init", -1, worker_id, 0, e))
            return
        # A thread's replica of a source is its own; a map's dataset and the global
        # generators are the process's, shared by every thread: nothing of them is the
        # worker's to report, and nothing is taken per item.
        snap = Snapshotter(job, None, own=True) if isinstance(job, SourceJob) else _nothing
        while True:
            task = tasks.get()
            if task is None:
                break
            if task.pass_id != current[0]:
                continue  # a task of an abandoned pass
            busy[worker_id] = time.monotonic()
            started = time.perf_counter_ns()
            try:
                out = job.run(task.item, task.epoch, task.seq)
            except Exhausted:
                reply = Reply(task.pass_id, "end", task.seq, worker_id, 0, None, snap())
            except BaseException as e:
                # in a box the pool empties when it raises: a reply the consumer's frames
                # still hold must not hold the exception, whose traceback holds those frames
                reply = Reply(task.pass_id, "err", task.seq, worker_id, 0, [e], snap())
            else:
                took = time.perf_counter_ns() - started
                reply = Reply(task.pass_id, "ok", task.seq, worker_id, took, out, snap())
            busy[worker_id] = 0.0  # before its reply: the consumer never sees it busy after
            results.put(reply)
            del reply  # nor is a failure's exception kept here, while the thread waits
            if leaving is not None and leaving.due and leaving.take(worker_id):
                task = None
                break
    except BaseException as e:
        results.put(_death(job, task, worker_id, e))
    finally:
        set_thread_worker_info(None)


def _nothing() -> None:
    """What a thread worker of a map reports of its state with each reply: nothing."""


def _death(job: Any, task: Task | None, worker_id: int, error: BaseException) -> Reply:
    """The last reply of a worker thread that dies of *error* (while it ran *task*, when it
    had one): the error, named as the process backend names a worker's."""
    try:
        extra = "the worker thread died of it, so the pass ends"
        if task is not None and not is_annotated(error):
            annotate(error, job.name, task.epoch, extra=extra, **describe_item(task.item, task.seq))
        if not is_annotated(error):
            _add_note(error, f"pipeflow: stage {job.name!r}: thread worker {worker_id}: {extra}")
        setattr(error, DIED, worker_id)
    except Exception:
        pass
    pass_id = -1 if task is None else task.pass_id  # not None: that is worker_init's
    return Reply(pass_id, "init", -1 if task is None else task.seq, worker_id, 0, error)
