"""The worker side: what a worker does with one task (the jobs: ``MapJob`` applies a
function or a one-to-one stage, ``SourceJob`` takes the next item of its own replica of a
loader; a coroutine function's ``CoroutineJob`` is in :mod:`._aio_worker`), and a process
worker's life (set up once, then the task loop). A thread worker's loop is in :mod:`._threads`.

Nothing here imports torch, so a worker started with spawn or forkserver imports it only when
the user's code does.
"""

from __future__ import annotations

import os
import pickle
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pipeflow._context import Context
from pipeflow._failure import Failure, WithDropped
from pipeflow._random import seed_sequence_state
from pipeflow._stage import Stage
from pipeflow.errors import annotate
from pipeflow.parallel import _segments
from pipeflow.parallel._shm import Writer
from pipeflow.parallel._wire import (
    Encoded,
    Exhausted,
    PassNote,
    Reply,
    Task,
    Trim,
    describe_item,
    remote_error,
)
from pipeflow.worker_info import WorkerInfo, get_worker_info, set_process_worker_info, set_replica

__all__ = ["MapJob", "SourceJob", "WorkerSpec", "process_main", "seed_worker"]


class WorkerSpec(NamedTuple):
    """What one worker starts with: every entry point (a process worker, a coroutine process
    worker, a thread, an event-loop thread) takes one of these. A pool holds one with
    ``worker_id`` 0 and gives each worker a copy with its own id (and, for processes, prefix).

    Attributes:
        job: what the worker does with a task (a ``MapJob``, ``SourceJob``, ``CoroutineJob``);
            for a spawn or forkserver worker its pickle.
        worker_id: the worker's number, ``0 .. num_workers - 1``.
        num_workers: how many workers the pool has.
        base_seed: the pool's base seed; the worker's seed is ``base_seed + worker_id``.
        worker_init: called as ``worker_init(worker_id)`` once the worker has started (or its
            pickle, or ``None``).
        main_pid: process workers: the main process, whose death ends the worker.
        prefix: process workers: the names of this worker's shared-memory segments.
    """

    job: Any
    worker_id: int
    num_workers: int
    base_seed: int
    worker_init: Any = None
    main_pid: int = 0
    prefix: str = ""


# -- the jobs: what a worker does with one task -----------------------------------------------
class MapJob:
    """Apply a function, or a one-to-one stage, to one item at a time."""

    def __init__(
        self,
        fn: Callable[[Any], Any] | Stage[Any, Any],
        name: str,
        ignoring: tuple[type[BaseException], ...] = (),
        facts: dict[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.stages = fn.stages if isinstance(fn, Stage) else None
        self.ignoring = ignoring  # what a later ignore_errors drops (fetch drops samples)
        # What the stages above told this pass (how a shard numbers its items, so that a
        # random_map in the workers keys its draws as one in the loader would); not what
        # described this stage's own input.
        self.facts = {k: v for k, v in (facts or {}).items() if k != "input"}

    def without_torch(self) -> None:
        """In a worker that has not imported torch: the stages' numpy-only forms."""
        if self.stages is not None:
            self.stages = tuple(s.without_torch() for s in self.stages)

    @property
    def dataset(self) -> Any:
        """The dataset the stages read by key, for ``WorkerInfo.dataset``."""
        return next((s.dataset for s in self.stages or () if s.dataset is not None), None)

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        if self.stages is None:
            try:
                return self.fn(item)  # type: ignore[operator]
            except Exception as e:
                annotate(e, self.name, epoch, **describe_item(item, seq))
                raise
        failed: list[str] = []
        # The item's place in the pass, and what the pass was told.
        context = Context(epoch, offset=seq, ignoring=self.ignoring, facts=self.facts)
        dropped: list[Failure] = []
        it: Iterator[Any] = iter((item,))
        for s in self.stages:
            it = _track(s.apply(it, context), s.name, failed)
            if s.failures == "mark":  # failures it yields: raised, or kept when dropped
                it = _unmark(it, dropped)
            context = s.context_after(context)
        try:
            out = next(it)
        except StopIteration:
            msg = (
                f"stage {(failed or [self.name])[0]!r} yielded nothing for one item; "
                "parallel_map runs one-to-one stages only"
            )
            raise ValueError(msg) from None
        except Exception as e:
            annotate(e, failed[0] if failed else self.name, epoch, **describe_item(item, seq))
            raise
        for _ in it:  # let the stages finish the item (a dropped failure may follow)
            pass
        return WithDropped(out, dropped) if dropped else out


def _unmark(it: Iterator[Any], dropped: list[Failure]) -> Iterator[Any]:
    for value in it:
        if value.__class__ is Failure:
            if not value.dropped:
                raise value.error
            dropped.append(value)
        else:
            yield value


def _track(it: Iterator[Any], name: str, failed: list[str]) -> Iterator[Any]:
    try:
        yield from it
    except Exception:
        if not failed:
            failed.append(name)
        raise


class SourceJob:
    """Run a whole loader in each worker, one item per task (an ``IterableDataset`` replica)."""

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name
        self._epoch: int | None = None
        self._it: Iterator[Any] | None = None

    @property
    def dataset(self) -> Any:
        return getattr(self.loader.source, "iterable", None)

    def without_torch(self) -> None:
        """In a worker that has not imported torch: the stages' numpy-only forms."""
        stages = tuple(s.without_torch() for s in self.loader.stages)
        self.loader = type(self.loader)(self.loader.source, stages)

    def clone(self) -> SourceJob:
        """A replica with its own iterator (one per thread worker)."""
        return SourceJob(type(self.loader)(self.loader.source, self.loader.stages), self.name)

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        info = get_worker_info()
        if info is not None:  # shard() inside reads this worker's share
            set_replica(True, thread=info.backend == "thread")
        if self._epoch != epoch:
            if self._it is not None:
                self._it.close()  # type: ignore[attr-defined]
            self.loader.set_epoch(epoch)
            if isinstance(item, PassNote):
                self.loader.source.begin_pass(item.value)
            self._it = iter(self.loader)
            self._epoch = epoch
        assert self._it is not None
        try:
            return next(self._it)
        except StopIteration:
            raise Exhausted from None


# -- seeding and identity ----------------------------------------------------------------------
def seed_worker(base_seed: int, worker_id: int) -> int:
    """Seed ``random``, numpy's and torch's global generators as torch's workers do."""
    seed = base_seed + worker_id
    random.seed(seed)
    np = sys.modules.get("numpy")
    if np is not None:
        # torch's scheme: numpy gets SeedSequence([worker_id, base_seed]) words.
        words = seed_sequence_state([worker_id, base_seed])
        np.random.seed(np.array(words, dtype=np.uint32))
    torch = sys.modules.get("torch")
    if torch is not None:
        torch.manual_seed(seed)
    return seed


def _tell_torch(info: WorkerInfo) -> bool:
    """Make ``torch.utils.data.get_worker_info()`` answer in this process; False if no torch."""
    torch = sys.modules.get("torch")
    if torch is None:
        return False
    from torch.utils.data._utils import worker as torch_worker

    torch_worker._worker_info = torch_worker.WorkerInfo(
        id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
    )
    torch.set_num_threads(1)  # as torch's workers: no thread oversubscription
    return True


# -- process workers -------------------------------------------------------------------------
def _watch_parent(main_pid: int, prefix: str) -> None:
    """Exit (cleaning this worker's segments) within ~0.2 s of the main process's death."""
    parent = os.getppid()
    while True:
        time.sleep(0.2)
        if os.getppid() != parent or not _pid_alive(main_pid):
            _segments.sweep(prefix)
            os._exit(0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def start_process_worker(
    conn: Any, spec: WorkerSpec, *, defer_torch: bool = True
) -> tuple[Any, WorkerInfo, bool] | None:
    """What every process worker does first: ignore Ctrl-C, watch the parent, unpickle the job,
    seed as torch's workers do, tell ``get_worker_info()``, run ``worker_init``. Returns
    ``(job, info, torch told)``, or ``None`` after reporting a failure (then the worker ends).
    With *defer_torch*, a job in a worker that has not imported torch takes its numpy-only form.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: one traceback, from the main process
    watch = (spec.main_pid, spec.prefix)
    threading.Thread(target=_watch_parent, args=watch, daemon=True).start()
    job, worker_id, worker_init = spec.job, spec.worker_id, spec.worker_init
    try:
        if isinstance(job, bytes):
            job = pickle.loads(job)
        if isinstance(worker_init, bytes):
            worker_init = pickle.loads(worker_init)
        if defer_torch and "torch" not in sys.modules:
            job.without_torch()
        seed = seed_worker(spec.base_seed, worker_id)
        info = WorkerInfo(worker_id, spec.num_workers, seed, job.dataset, "process", os.getpid())
        set_process_worker_info(info)
        told_torch = _tell_torch(info)
        if worker_init is not None:
            worker_init(worker_id)
    except BaseException as e:
        conn.send_bytes(pickle.dumps(Reply(None, "init", -1, worker_id, 0, remote_error(e))))
        _wait_for_stop(conn)  # exiting now would read as a death, before the error is read
        return None
    return job, info, told_torch


def process_main(conn: Any, spec: WorkerSpec) -> None:
    """A process worker's life: set up once, then run tasks until told to stop."""
    started = start_process_worker(conn, spec)
    if started is None:
        return
    job, info, told_torch = started
    worker_id = spec.worker_id
    send, recv = conn.send_bytes, conn.recv
    writer = Writer(spec.prefix, keep_bytes=_segments.keep_budget(spec.num_workers))
    writer.activate()
    while True:
        try:
            task: Task | Trim | None = recv()
        except (EOFError, OSError):
            break
        if task is None:
            break
        if task.__class__ is Trim:  # the pass ended: nothing kept in /dev/shm
            writer.trim()
            continue
        assert isinstance(task, Task)
        if task.freed:
            writer.release(task.freed)
        if not told_torch:
            told_torch = _tell_torch(info)
        reply = _process_task(job, task, worker_id, writer)
        writer.unreserve()
        try:
            send(pickle.dumps(reply, protocol=5))
        except (BrokenPipeError, OSError):
            if reply.kind == "ok" and reply.payload.segment is not None:
                _segments.discard(reply.payload.segment.name)
            break
    writer.close()
    conn.close()


def _wait_for_stop(conn: Any) -> None:
    try:
        while conn.recv() is not None:
            pass
    except (EOFError, OSError):
        pass


def _process_task(job: Any, task: Task, worker_id: int, writer: Writer) -> Reply:
    """Run one task in a process worker; the reply carries the result encoded for the pipe."""
    started = time.perf_counter_ns()
    try:
        out = job.run(task.item, task.epoch, task.seq)
    except Exhausted:
        return Reply(task.pass_id, "end", task.seq, worker_id)
    except Exception as e:
        return Reply(task.pass_id, "err", task.seq, worker_id, 0, remote_error(e))
    took = time.perf_counter_ns() - started  # the item's time, for stats
    try:
        encoded = Encoded(*writer.encode(out))
    except Exception as e:
        where = describe_item(task.item, task.seq)
        annotate(e, job.name, task.epoch, extra="the result could not be sent back", **where)
        return Reply(task.pass_id, "err", task.seq, worker_id, 0, remote_error(e))
    return Reply(task.pass_id, "ok", task.seq, worker_id, took, encoded)
