"""The worker side: what a thread or process worker runs.

Kept to the standard library (plus what the user's job brings), so a worker started with spawn
or forkserver imports torch only when the user's code does.
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
from typing import Any

from pipeflow._random import seed_sequence_state
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

__all__ = ["process_main", "seed_worker", "thread_main"]


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
