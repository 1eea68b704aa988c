"""The worker side: what a thread or process worker runs, and what it does with an item
(``MapJob``; a ``parallel_source`` worker's job is in :mod:`._jobs`).

Nothing here imports torch, so a worker started with spawn or forkserver imports it only when
the user's code does.
"""

from __future__ import annotations

import os
import pickle
import queue
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from pipeflow._context import Context
from pipeflow._failure import Failure, WithDropped
from pipeflow._random import seed_sequence_state
from pipeflow._stage import Stage
from pipeflow.errors import annotate
from pipeflow.parallel import _segments
from pipeflow.parallel._jobs import Exhausted, describe_item
from pipeflow.parallel._wire import Encoded, Reply, Task, remote_error
from pipeflow.parallel._writer import Writer
from pipeflow.worker_info import (
    WorkerInfo,
    set_process_worker_info,
    set_thread_worker_info,
)

__all__ = ["MapJob", "process_main", "seed_worker", "thread_main"]


# -- what a parallel_map worker does with an item ----------------------------------------------
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
    conn: Any,
    job: Any,
    worker_id: int,
    num_workers: int,
    base_seed: int,
    worker_init: Any,
    main_pid: int,
    prefix: str,
    *,
    defer_torch: bool = True,
) -> tuple[Any, WorkerInfo, bool] | None:
    """What every process worker does first: ignore Ctrl-C, watch the parent, unpickle the job,
    seed as torch's workers do, tell ``get_worker_info()``, run ``worker_init``. Returns
    ``(job, info, torch told)``, or ``None`` after reporting a failure (then the worker ends).
    With *defer_torch*, a job in a worker that has not imported torch takes its numpy-only form.
    """
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: one traceback, from the main process
    threading.Thread(target=_watch_parent, args=(main_pid, prefix), daemon=True).start()
    try:
        if isinstance(job, bytes):
            job = pickle.loads(job)
        if isinstance(worker_init, bytes):
            worker_init = pickle.loads(worker_init)
        if defer_torch and "torch" not in sys.modules:
            job.without_torch()
        seed = seed_worker(base_seed, worker_id)
        info = WorkerInfo(worker_id, num_workers, seed, job.dataset, "process", os.getpid())
        set_process_worker_info(info)
        told_torch = _tell_torch(info)
        if worker_init is not None:
            worker_init(worker_id)
    except BaseException as e:
        conn.send_bytes(pickle.dumps(Reply(None, "init", -1, worker_id, 0, remote_error(e))))
        _wait_for_stop(conn)  # exiting now would read as a death, before the error is read
        return None
    return job, info, told_torch


def process_main(
    conn: Any,
    job: Any,
    worker_id: int,
    num_workers: int,
    base_seed: int,
    worker_init: Any,
    main_pid: int,
    prefix: str,
) -> None:
    """A process worker's life: set up once, then run tasks until told to stop."""
    started = start_process_worker(
        conn, job, worker_id, num_workers, base_seed, worker_init, main_pid, prefix
    )
    if started is None:
        return
    job, info, told_torch = started
    send, recv = conn.send_bytes, conn.recv
    writer = Writer(prefix)
    writer.activate()
    while True:
        try:
            task: Task | None = recv()
        except (EOFError, OSError):
            break
        if task is None:
            break
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
                _segments.discard(reply.payload.segment[0])
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


# -- thread workers -------------------------------------------------------------------------
def thread_main(
    tasks: queue.SimpleQueue[Any],
    results: queue.SimpleQueue[Any],
    job: Any,
    worker_id: int,
    num_workers: int,
    base_seed: int,
    worker_init: Any,
    current: list[int],
) -> None:
    """A thread worker: the same protocol as a process worker, through queues, no pickling."""
    seed = base_seed + worker_id
    info = WorkerInfo(worker_id, num_workers, seed, job.dataset, "thread", os.getpid())
    set_thread_worker_info(info)
    try:
        if worker_init is not None:
            worker_init(worker_id)
    except BaseException as e:
        results.put(Reply(None, "init", -1, worker_id, 0, e))
        return
    while True:
        task: Task | None = tasks.get()
        if task is None:
            break
        if task.pass_id != current[0]:
            continue  # a task of an abandoned pass
        started = time.perf_counter_ns()
        try:
            out = job.run(task.item, task.epoch, task.seq)
        except Exhausted:
            results.put(Reply(task.pass_id, "end", task.seq, worker_id))
        except BaseException as e:
            # in a box the pool empties when it raises: a reply the consumer's frames still
            # hold must not hold the exception, whose traceback holds those frames
            results.put(Reply(task.pass_id, "err", task.seq, worker_id, 0, [e]))
        else:
            took = time.perf_counter_ns() - started
            results.put(Reply(task.pass_id, "ok", task.seq, worker_id, took, out))
    set_thread_worker_info(None)
