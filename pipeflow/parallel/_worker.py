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
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from pipeflow._random import seed_sequence_state
from pipeflow._stage import Stage
from pipeflow.errors import annotate
from pipeflow.loader import Context, Loader
from pipeflow.parallel import _shm
from pipeflow.worker_info import (
    WorkerInfo,
    get_worker_info,
    set_process_worker_info,
    set_replica,
    set_thread_worker_info,
)

__all__ = ["MapJob", "SourceJob", "process_main", "thread_main"]


class Exhausted(Exception):
    """A source job has no more items this epoch."""


def describe_item(item: Any, seq: int) -> dict[str, Any]:
    """How an error note names an item: a sample index, a batch of them, or its position."""
    if type(item) is int:
        return {"index": item}
    if type(item) is list and all(type(i) is int for i in item[:64]):
        return {"batch": item}
    return {"item": seq}


class MapJob:
    """Apply a function, or a one-to-one stage, to one item at a time."""

    def __init__(self, fn: Callable[[Any], Any] | Stage[Any, Any], name: str) -> None:
        self.fn = fn
        self.name = name
        self.stages = fn.stages if isinstance(fn, Stage) else None

    def without_torch(self) -> None:
        """In a worker that has not imported torch: collate to numpy, tensors on arrival."""
        from pipeflow.parallel._deferred import defer_tensors

        if self.stages is not None:
            self.stages = defer_tensors(self.stages)

    @property
    def dataset(self) -> Any:
        """The dataset of the first ``fetch`` inside, for ``WorkerInfo.dataset``."""
        for s in self.stages or ():
            if s.name == "fetch":
                return s.config.get("dataset")
        return None

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        if self.stages is None:
            try:
                return self.fn(item)  # type: ignore[operator]
            except Exception as e:
                annotate(e, self.name, epoch, **describe_item(item, seq))
                raise
        failed: list[str] = []
        context = Context(epoch=epoch, offset=seq)  # the item's position in the pass
        it: Iterator[Any] = iter((item,))
        for s in self.stages:
            it = _track(s.apply(it, context), s.name, failed)
        try:
            return next(it)
        except StopIteration:
            msg = (
                f"stage {(failed or [self.name])[0]!r} yielded nothing for one item; "
                "parallel_map runs one-to-one stages only"
            )
            raise ValueError(msg) from None
        except Exception as e:
            annotate(e, failed[0] if failed else self.name, epoch, **describe_item(item, seq))
            raise


def _track(it: Iterator[Any], name: str, failed: list[str]) -> Iterator[Any]:
    try:
        yield from it
    except Exception:
        if not failed:
            failed.append(name)
        raise


class SourceJob:
    """Run a whole loader in each worker, one item per task (an ``IterableDataset`` replica)."""

    def __init__(self, loader: Loader[Any], name: str) -> None:
        self.loader = loader
        self.name = name
        self._epoch: int | None = None
        self._it: Iterator[Any] | None = None

    @property
    def dataset(self) -> Any:
        return getattr(self.loader.source, "iterable", None)

    def without_torch(self) -> None:
        """In a worker that has not imported torch: collate to numpy, tensors on arrival."""
        from pipeflow.parallel._deferred import defer_tensors

        self.loader = Loader(self.loader.source, defer_tensors(self.loader.stages))

    def clone(self) -> SourceJob:
        """A replica with its own iterator (one per thread worker)."""
        return SourceJob(Loader(self.loader.source, self.loader.stages), self.name)

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        info = get_worker_info()
        if info is not None:  # shard() inside reads this worker's share
            set_replica(True, thread=info.backend == "thread")
        if self._epoch != epoch:
            if self._it is not None:
                self._it.close()  # type: ignore[attr-defined]
            self.loader.set_epoch(epoch)
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
            _shm.sweep(prefix)
            os._exit(0)


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _error_message(seq: int, e: BaseException) -> tuple[Any, ...]:
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    payload: bytes | None
    try:
        payload = pickle.dumps(e)
        pickle.loads(payload)
    except Exception:
        payload = None
    return ("err", seq, payload, f"{type(e).__module__}.{type(e).__qualname__}", str(e), text)


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
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: one traceback, from the main process
    threading.Thread(target=_watch_parent, args=(main_pid, prefix), daemon=True).start()
    try:
        if isinstance(job, bytes):
            job = pickle.loads(job)
        if isinstance(worker_init, bytes):
            worker_init = pickle.loads(worker_init)
        if "torch" not in sys.modules:
            job.without_torch()
        seed = seed_worker(base_seed, worker_id)
        info = WorkerInfo(worker_id, num_workers, seed, job.dataset, "process", os.getpid())
        set_process_worker_info(info)
        told_torch = _tell_torch(info)
        if worker_init is not None:
            worker_init(worker_id)
    except BaseException as e:
        conn.send_bytes(pickle.dumps((None, *_error_message(-1, e))))
        return
    send, recv = conn.send_bytes, conn.recv
    writer = _shm.Writer(prefix)
    writer.activate()
    while True:
        try:
            msg = recv()
        except (EOFError, OSError):
            break
        if msg is None:
            break
        pass_id, seq, epoch, item, freed = msg
        if freed:
            writer.release(freed)
        if not told_torch:
            told_torch = _tell_torch(info)
        started = time.perf_counter_ns()
        try:
            out = job.run(item, epoch, seq)
        except Exhausted:
            reply: tuple[Any, ...] = ("end", seq)
        except Exception as e:
            reply = _error_message(seq, e)
        else:
            try:
                took = time.perf_counter_ns() - started  # the item's time, for stats
                data, segment, layout, retired = writer.encode(out)
                reply = ("ok", seq, data, segment, layout, took, retired)
            except Exception as e:
                where = describe_item(item, seq)
                annotate(e, job.name, epoch, extra="the result could not be sent back", **where)
                reply = _error_message(seq, e)
            del out
        writer.unreserve()
        try:
            send(pickle.dumps((pass_id, *reply), protocol=5))
        except (BrokenPipeError, OSError):
            if reply[0] == "ok" and reply[3] is not None:
                _shm.discard(reply[3][0])
            break
    writer.close()
    conn.close()


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
        results.put((None, "err", -1, e, worker_id, 0))
        return
    while True:
        msg = tasks.get()
        if msg is None:
            break
        pass_id, seq, epoch, item = msg
        if pass_id != current[0]:
            continue  # a task of an abandoned pass
        started = time.perf_counter_ns()
        try:
            out = job.run(item, epoch, seq)
        except Exhausted:
            results.put((pass_id, "end", seq, None, worker_id, 0))
        except BaseException as e:
            results.put((pass_id, "err", seq, e, worker_id, 0))
        else:
            results.put((pass_id, "ok", seq, out, worker_id, time.perf_counter_ns() - started))
    set_thread_worker_info(None)
