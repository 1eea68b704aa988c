"""Worker pools (threads or processes) behind one small interface, and the driver loop.

The driver keeps at most ``max_in_flight`` items out at once (backpressure), delivers results
in order or as they complete, and turns every failure into an exception in the consumer: the
user's own exception (same type, worker traceback chained, a note naming stage, item, worker
and pid), :class:`~pipeflow.errors.WorkerDiedError` when a process dies, and
:class:`~pipeflow.errors.WorkerTimeoutError` when nothing arrives within ``timeout``.
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import itertools
import multiprocessing
import multiprocessing.connection
import os
import pickle
import queue
import signal
import sys
import threading
import time
import weakref
from collections.abc import Iterable, Iterator
from typing import Any

from pipeflow.errors import (
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
    _RemoteTraceback,
    describe_indices,
)
from pipeflow.parallel import _shm
from pipeflow.parallel._worker import SourceJob, describe_item, process_main, thread_main

__all__ = ["ProcessPool", "ThreadPool", "drive"]

#: How long workers get to finish their current item after being told to stop.
STOP_GRACE = 1.0
#: How long the other workers wait to start while the first makes its first result.
START_STAGGER = 0.05
_POOL_IDS = itertools.count()
_LIVE: weakref.WeakSet[Any] = weakref.WeakSet()
_FREEZE_HOLDERS = 0  # live fork pools that froze the heap
_USER_FROZE = False  # the heap was frozen before any pool of ours froze it


@atexit.register
def _close_live_pools() -> None:  # interpreter exit: nothing left behind
    for pool in list(_LIVE):
        pool.close()


def _what(items: dict[int, Any]) -> str:
    """Name the items a worker held: sample indices where they are indices."""
    flat: list[Any] = []
    for seq, item in sorted(items.items()):
        where = describe_item(item, seq)
        if "index" in where:
            flat.append(where["index"])
        elif "batch" in where:
            flat.extend(where["batch"])
        else:
            return f"items {sorted(items)}"
    return f"sample indices {describe_indices(flat)}" if flat else "no items"


def _warm_source_cache() -> None:
    """Read, once, the source files a forked worker's ``torch.manual_seed`` will read.

    Until CUDA (XPU, MTIA) is initialised, ``torch.manual_seed`` queues the seed with
    ``traceback.format_stack()``, three times, and that reads every source file on the stack
    into :mod:`linecache`: ~7 ms in each new worker. A forked worker inherits this process's
    cache, so reading the files here, once, saves it in every worker.
    """
    if "torch" not in sys.modules or _WARMED:
        return
    import linecache
    import traceback

    _WARMED.append(True)
    traceback.extract_stack()  # the files on this stack, which a forked worker's stack shares
    for name in (
        "torch.random",
        "torch.cuda",
        "torch.cuda.random",
        "torch.xpu",
        "torch.xpu.random",
        "torch.mtia",
        "multiprocessing.context",
        "multiprocessing.popen_fork",
        "multiprocessing.process",
        "pipeflow.parallel._worker",
    ):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            linecache.getlines(path)


_WARMED: list[bool] = []


class _Result:
    __slots__ = ("kind", "payload", "seq", "took", "worker")

    def __init__(self, kind: str, seq: int, payload: Any, worker: int, took: int = 0) -> None:
        self.kind, self.seq, self.payload, self.worker = kind, seq, payload, worker
        self.took = took  # nanoseconds the worker spent on the item


class ProcessPool:
    """Worker processes, each with its own duplex pipe; results come back via shared memory."""

    backend = "process"

    def __init__(
        self,
        job: Any,
        workers: int,
        *,
        name: str,
        context: multiprocessing.context.BaseContext,
        worker_init: Any,
        base_seed: int,
        round_robin: bool,
    ) -> None:
        self.name = name
        self.workers = workers
        self.round_robin = round_robin
        self.pool_id = next(_POOL_IDS)
        self.prefix = _shm.segment_prefix(os.getpid(), self.pool_id)
        self.method = context.get_start_method()
        self.closed = False
        self.broken = False
        self.holds_freeze = False
        self.pass_id = 0
        self.active = [True] * workers
        self.outstanding: list[dict[int, Any]] = [{} for _ in range(workers)]
        self.stale: list[int] = [0] * workers  # tasks of earlier passes still out
        self.depth = 2  # tasks queued per worker, at most (set per pass)
        self.head_since = [0.0] * workers  # when each worker's current task started, roughly
        self.avg: float | None = None  # moving average of the time per task
        self.warm = [False] * workers  # a worker's first result also timed its start-up
        self.rr_next = 0  # round robin: the worker the next task goes to
        self.first_start: float | None = None  # when the first worker started
        if self.method == "fork":
            payload, init = job, worker_init
            if "numpy" in sys.modules:  # each worker seeds it: import it once, here, not in each
                import numpy.random  # noqa: F401
            _warm_source_cache()
        else:  # pickled once here, so an unpicklable fn fails before any worker starts
            payload = self._pickle(job, "fn")
            init = self._pickle(worker_init, "worker_init") if worker_init else None
        self.context = context
        self.spawn_args = (payload, workers, base_seed, init, os.getpid())
        self.conns: list[Any] = [None] * workers
        self.procs: list[Any] = [None] * workers
        self.by_fd: dict[int, int] = {}
        self.sentinels: dict[int, int] = {}
        self.reader = _shm.Reader()
        _LIVE.add(self)

    def _start(self, wid: int) -> None:
        """Start worker *wid*. Workers start when first given a task, so the first one is
        already working while the next one forks."""
        payload, workers, base_seed, init, main_pid = self.spawn_args
        here, there = self.context.Pipe(duplex=True)
        proc = self.context.Process(  # type: ignore[attr-defined]
            target=process_main,
            args=(
                there,
                payload,
                wid,
                workers,
                base_seed,
                init,
                main_pid,
                _shm.segment_prefix(main_pid, self.pool_id, wid),
            ),
            name=f"pipeflow-{self.name}-{wid}",
            daemon=True,
        )
        if self.method == "fork":
            self._freeze()
        try:
            proc.start()
        finally:
            there.close()
        self.conns[wid], self.procs[wid] = here, proc
        if self.first_start is None:
            self.first_start = time.monotonic()
        self.by_fd[here.fileno()] = wid
        self.sentinels[proc.sentinel] = wid

    def _freeze(self) -> None:
        """Freeze the heap before forking, and keep it frozen while fork workers live.

        The workers' garbage collector then never writes to the parent's objects, nor does
        the parent's while they run, so those pages stay shared instead of being copied. A
        freeze the user made is never undone.
        """
        global _FREEZE_HOLDERS, _USER_FROZE
        if not self.holds_freeze:
            if _FREEZE_HOLDERS == 0:
                _USER_FROZE = gc.get_freeze_count() > 0
            _FREEZE_HOLDERS += 1
            self.holds_freeze = True
        gc.freeze()

    def _thaw(self) -> None:
        global _FREEZE_HOLDERS
        if self.holds_freeze:
            self.holds_freeze = False
            _FREEZE_HOLDERS -= 1
            if _FREEZE_HOLDERS == 0 and not _USER_FROZE:
                gc.unfreeze()

    def _pickle(self, obj: Any, what: str) -> bytes:
        try:
            return pickle.dumps(obj)
        except Exception as e:
            msg = (
                f"parallel stage {self.name!r}: {what} can't be pickled for the "
                f"{self.method!r} start method ({type(e).__name__}: {e}); define it at module "
                "level (not a lambda or a local function), or use the 'fork' start method"
            )
            raise TypeError(msg) from e

    # -- a pass ----------------------------------------------------------------------------
    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.active = [True] * self.workers
        self.depth = -(-max_in_flight // self.workers)
        for wid in range(self.workers):
            self.stale[wid] += len(self.outstanding[wid])
            self.outstanding[wid].clear()

    def can_submit(self) -> bool:
        return any(self.active)

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        """Send one task; False (nothing sent) when no worker has room for it now."""
        wid = self._choose()
        if wid is None:
            return False
        if self.procs[wid] is None:
            self._start(wid)
        if not self.outstanding[wid] and not self.stale[wid]:
            self.head_since[wid] = time.monotonic()
        freed = self.reader.take_freed(wid)  # segments it may write again
        try:
            self.conns[wid].send((self.pass_id, seq, epoch, item, freed))
        except OSError:  # BrokenPipeError: the worker is gone
            self._died(wid)
        self.outstanding[wid][seq] = item
        return True

    def _stagger_left(self) -> float | None:
        """Seconds the workers not started yet must still wait; None when they may start.

        Forking blocks this process for ~10 ms (more with a large heap), and the first batch
        would wait for every fork. So the other workers start once the first worker has sent
        its first result, or after :data:`START_STAGGER` seconds, whichever comes first.
        """
        if self.first_start is None or any(self.warm):
            return None
        left = self.first_start + START_STAGGER - time.monotonic()
        return left if left > 0 else None

    def _choose(self) -> int | None:
        staggering = self._stagger_left() is not None
        if self.round_robin:  # torch's order: task k to worker k % workers
            for _ in range(self.workers):
                wid = self.rr_next
                if self.active[wid]:
                    if staggering and self.procs[wid] is None:
                        return None  # its turn, but it may not start yet
                    self.rr_next = (wid + 1) % self.workers
                    return wid
                self.rr_next = (wid + 1) % self.workers
            raise AssertionError("no active worker")
        # The least busy worker, never one that seems stuck on a slow item: queueing behind
        # it would hold the queued item back too. Until the first result shows how long an
        # item takes, one task per worker.
        now = time.monotonic()
        cap = 1 if self.avg is None else self.depth
        slow = None if self.avg is None else max(4 * self.avg, 0.001)
        best = cap
        choice = None
        for wid in range(self.workers):
            load = len(self.outstanding[wid]) + self.stale[wid]
            if load >= best or (staggering and self.procs[wid] is None):
                continue
            if slow is not None and load > 0 and now - self.head_since[wid] > slow:
                continue  # stuck: let its queue drain first (an idle worker is never stuck)
            best, choice = load, wid
        return choice

    def collect(self, timeout: float | None) -> list[_Result] | None:
        """Wait for messages (or a death); ``None`` means *timeout* passed with none.

        The list may be empty when only late results of an abandoned pass arrived.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            wake = False  # for the other workers' start, not for a timeout
            stagger = self._stagger_left() if None in self.procs else None
            if stagger is not None and (left is None or stagger < left):
                left, wake = stagger, True
            ready = multiprocessing.connection.wait([*self.by_fd_conns(), *self.sentinels], left)
            if not ready:
                return [] if wake else None  # []: the caller submits again, starting them
            out: list[_Result] = []
            dead: list[int] = []
            got = False
            for r in ready:
                if isinstance(r, int):
                    dead.append(self.sentinels[r])
                    continue
                assert isinstance(r, multiprocessing.connection.Connection)
                wid = self.by_fd[r.fileno()]
                try:
                    while r.poll():
                        msg = r.recv_bytes()
                        got = True
                        res = self._receive(wid, msg)
                        if res is not None:
                            out.append(res)
                except (EOFError, OSError):  # the pipe closed: the worker is gone
                    dead.append(wid)
            if got:
                return out  # deliver what came first; a death shows up on the next call
            for wid in dead:
                self._died(wid)

    def by_fd_conns(self) -> list[Any]:
        return [c for c in self.conns if c is not None]

    def _receive(self, wid: int, msg: bytes) -> _Result | None:
        pass_id, kind, seq, *rest = pickle.loads(msg)
        if kind == "err" and seq == -1:
            self._raise_remote(rest, f"worker_init in worker {wid} (pid {self.procs[wid].pid})")
        now = time.monotonic()
        if self.warm[wid]:
            took = now - self.head_since[wid]
            self.avg = took if self.avg is None else 0.8 * self.avg + 0.2 * took
        self.warm[wid] = True
        self.head_since[wid] = now
        if kind == "ok" and rest[4]:
            self.reader.retire(wid, rest[4])
        if pass_id != self.pass_id:  # a late result of an abandoned pass
            self.stale[wid] -= 1
            if kind == "ok":
                self.reader.discard(wid, rest[1])
            return None
        self.outstanding[wid].pop(seq, None)
        if kind == "ok":
            data, segment, layout, took, _ = rest
            return _Result("ok", seq, (data, segment, layout), wid, took)
        if kind == "end":
            self.active[wid] = False
            return _Result("end", seq, None, wid)
        return _Result("err", seq, rest, wid)

    def rebuild(self, res: _Result) -> Any:
        return self.reader.decode(res.worker, *res.payload)

    def drop(self, res: _Result) -> None:
        """A result that will not be delivered (the pass was abandoned)."""
        if res.kind == "ok":
            self.reader.discard(res.worker, res.payload[1])

    def raise_error(self, res: _Result) -> None:
        self._raise_remote(res.payload, None)

    @staticmethod
    def _raise_remote(payload: list[Any], where: str | None) -> None:
        exc_bytes, type_name, text, tb_text = payload
        exc: BaseException = (
            pickle.loads(exc_bytes) if exc_bytes is not None else WorkerError(type_name, text)
        )
        if where is not None and hasattr(exc, "add_note"):
            exc.add_note(f"pipeflow: {where} failed")
        raise exc from _RemoteTraceback(tb_text)

    def _died(self, wid: int) -> None:
        proc = self.procs[wid]
        proc.join(0.1)
        code = proc.exitcode
        if code is None:
            how = "closed its pipe"
        elif code < 0:
            try:
                how = f"was killed by signal {signal.Signals(-code).name}"
            except ValueError:
                how = f"was killed by signal {-code}"
        else:
            how = f"exited with code {code}"
        msg = (
            f"parallel stage {self.name!r}: worker {wid} of {self.workers} (pid {proc.pid}) "
            f"{how} while holding {_what(self.outstanding[wid])}"
        )
        if code == -signal.SIGBUS:
            msg += (
                "; SIGBUS in a worker usually means /dev/shm is full: enlarge it (e.g. "
                "docker run --shm-size=8g) or lower max_in_flight"
            )
        self.broken = True
        raise WorkerDiedError(msg)

    def in_flight(self) -> str:
        parts = [
            f"{_what(o)} in worker {w} (pid {self.procs[w].pid})"
            for w, o in enumerate(self.outstanding)
            if o and self.procs[w] is not None
        ]
        return "; ".join(parts) or "nothing"

    # -- shutdown ---------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every worker (terminating the hung ones) and unlink every segment."""
        if self.closed:
            return
        self.closed = True
        _LIVE.discard(self)
        conns = [c for c in self.conns if c is not None]
        procs = [p for p in self.procs if p is not None]
        for c in conns:
            with contextlib.suppress(OSError, ValueError):
                c.send(None)
        deadline = time.monotonic() + STOP_GRACE
        for p in procs:
            p.join(max(0.0, deadline - time.monotonic()))
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(0.3)
            if p.is_alive():
                p.kill()
                p.join(0.3)
        for c in conns:
            try:
                while c.poll():
                    msg = pickle.loads(c.recv_bytes())
                    if msg[1] == "ok" and msg[4] is not None:
                        _shm.discard(msg[4][0])
            except (EOFError, OSError):
                pass
            c.close()
        for p in procs:
            if not p.is_alive():
                p.close()
        _shm.sweep(self.prefix)
        self.reader.close()
        self._thaw()


class ThreadPool:
    """Worker threads: a shared task queue for maps, one queue per thread for sources."""

    backend = "thread"

    def __init__(
        self,
        job: Any,
        workers: int,
        *,
        name: str,
        worker_init: Any,
        base_seed: int,
        round_robin: bool,
    ) -> None:
        self.name = name
        self.workers = workers
        self.round_robin = round_robin
        self.closed = False
        self.broken = False
        self.pass_id = 0
        self.current = [0]  # shared with the threads: tasks of other passes are skipped
        self.active = [True] * workers
        self.outstanding: dict[int, tuple[int, Any]] = {}  # seq -> (worker or -1, item)
        self.results: queue.SimpleQueue[Any] = queue.SimpleQueue()
        shared: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.queues = [queue.SimpleQueue() if round_robin else shared for _ in range(workers)]
        self._rr = itertools.cycle(range(workers))
        self.threads = []
        for wid in range(workers):
            own_job = job.clone() if isinstance(job, SourceJob) else job
            t = threading.Thread(
                target=thread_main,
                args=(
                    self.queues[wid],
                    self.results,
                    own_job,
                    wid,
                    workers,
                    base_seed,
                    worker_init,
                    self.current,
                ),
                name=f"pipeflow-{name}-{wid}",
                daemon=True,
            )
            t.start()
            self.threads.append(t)
        _LIVE.add(self)

    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.current[0] = self.pass_id
        self.active = [True] * self.workers
        self.outstanding.clear()

    def can_submit(self) -> bool:
        return any(self.active)

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        wid = -1
        if self.round_robin:
            for _ in range(self.workers):
                wid = next(self._rr)
                if self.active[wid]:
                    break
        self.queues[max(wid, 0)].put((self.pass_id, seq, epoch, item))
        self.outstanding[seq] = (wid, item)
        return True

    def collect(self, timeout: float | None) -> list[_Result] | None:
        out: list[_Result] = []
        try:
            msg = self.results.get(timeout=timeout)
        except queue.Empty:
            return None
        while True:
            pass_id, kind, seq, payload, wid, took = msg
            if kind == "err" and seq == -1:
                payload.add_note(f"pipeflow: worker_init in thread worker {wid} failed")
                raise payload
            if pass_id == self.pass_id:
                self.outstanding.pop(seq, None)
                if kind == "end":
                    self.active[wid] = False
                out.append(_Result(kind, seq, payload, wid, took))
            try:
                msg = self.results.get_nowait()
            except queue.Empty:
                return out

    def rebuild(self, res: _Result) -> Any:
        return res.payload

    def drop(self, res: _Result) -> None:
        pass

    def raise_error(self, res: _Result) -> None:
        raise res.payload

    def in_flight(self) -> str:
        return _what({seq: item for seq, (_, item) in self.outstanding.items()})

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        _LIVE.discard(self)
        for q in {id(q): q for q in self.queues}.values():
            for _ in range(self.workers):
                q.put(None)
        deadline = time.monotonic() + STOP_GRACE
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        # A thread stuck in user code can't be stopped; it is a daemon and holds no process.


def drive(
    pool: Any,
    upstream: Iterable[Any] | None,
    *,
    epoch: int,
    ordered: bool,
    max_in_flight: int,
    timeout: float | None,
    first: int = 0,
    skip: frozenset[int] = frozenset(),
    record: Any = None,
    stats: Any = None,
) -> Iterator[Any]:
    """Feed *upstream* (``None``: the workers are sources) to *pool*; yield what comes back.

    Items are numbered from *first* (their position in the pass); those numbered in *skip*
    were delivered before a resumption and are dropped unseen. *record* (unordered delivery)
    collects the numbers in the order they are delivered.
    """
    pool.start_pass(max_in_flight)
    source = iter(upstream) if upstream is not None else None
    exhausted = False
    sent = delivered = first
    next_out = first
    ready: dict[int, Any] = {}
    held: list[Any] = []  # an item pulled from upstream that no worker had room for yet
    try:
        while True:
            while not exhausted and sent - delivered < max_in_flight:
                if held:
                    item = held.pop()
                elif source is None:
                    if not pool.can_submit():
                        exhausted = True
                        break
                    item = None
                else:
                    try:
                        item = next(source)
                    except StopIteration:
                        exhausted = True
                        break
                    if sent in skip:  # delivered before the resumption
                        sent += 1
                        delivered += 1
                        if ordered:
                            next_out += 1
                        continue
                if not pool.submit(sent, epoch, item):
                    held.append(item)
                    break
                sent += 1
            if sent == delivered and not held:
                return
            results = pool.collect(timeout)
            if results is None:
                msg = (
                    f"parallel stage {pool.name!r}: no result within timeout={timeout} s; "
                    f"in flight: {pool.in_flight()}"
                )
                raise WorkerTimeoutError(msg)
            for res in results:
                ready[res.seq] = res
            if stats is not None:  # queue occupancy and per-item times, for loader.stats()
                stats.in_flight += sent - delivered
                stats.in_flight_samples += 1
                for res in results:
                    stats.task_ns.append(res.took)
                    stats.task_total_ns += res.took
            if ordered:
                while next_out in ready:
                    res = ready.pop(next_out)
                    next_out += 1
                    delivered += 1
                    if res.kind == "ok":
                        yield pool.rebuild(res)
                    elif res.kind == "err":
                        pool.raise_error(res)
            else:
                for seq in list(ready):
                    res = ready.pop(seq)
                    delivered += 1
                    if res.kind == "ok":
                        value = pool.rebuild(res)
                        if record is not None:
                            record.order.append(seq)
                        yield value
                    elif res.kind == "err":
                        pool.raise_error(res)
    finally:  # results that arrived but will not be delivered give their segments back
        for res in ready.values():
            pool.drop(res)
