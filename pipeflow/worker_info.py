"""Which worker am I? ``get_worker_info()`` inside a parallel stage's worker.

Inside a process worker, torch's ``torch.utils.data.get_worker_info()`` answers too (when the
user's code has imported torch), so ``IterableDataset`` code that shards itself by worker keeps
working unchanged.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

__all__ = ["WorkerInfo", "get_worker_info"]


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker knows about itself.

    Attributes:
        id: the worker's number, ``0 <= id < num_workers``.
        num_workers: how many workers the stage runs.
        seed: this worker's seed (``base_seed + id``, torch's scheme); ``random``, numpy's
            global generator and torch's are seeded from it when the worker starts.
        dataset: the dataset the worker reads (its own copy in a process worker), when the
            stage has one.
        backend: ``"process"``, ``"thread"`` or ``"ray"`` (a Ray actor).
        pid: the worker's process id.
        node: a Ray actor's node, as ``"<ip address> <node id, first 8 digits>"`` (``""``
            for threads and worker processes, which run on the loader's machine).
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any = None
    backend: str = "process"
    pid: int = 0
    node: str = ""


_process_info: WorkerInfo | None = None
_thread_info = threading.local()


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the worker this code runs in, or ``None`` outside workers.

    In a :func:`~pipeflow.parallel_source` worker, reading ``num_workers`` from it tells
    pipeflow that the code splits its stream by worker itself: a :func:`~pipeflow.shard`
    after it in the same worker then refuses to split it by worker a second time (see
    :class:`~pipeflow.errors.SplitTwiceError`).

    Examples:
        >>> get_worker_info() is None
        True
    """
    info = current_info()
    if info is not None and in_replica():
        return _watched(info)
    return info


def current_info() -> WorkerInfo | None:
    """The worker's info, for pipeflow's own code (its reads say nothing about splitting)."""
    info: WorkerInfo | None = getattr(_thread_info, "info", None)
    return info if info is not None else _process_info


class _Watched(WorkerInfo):
    """A replica's :class:`WorkerInfo` as user code gets it: reading ``num_workers`` counts as
    a split by worker (see :func:`split_reads`)."""

    def __getattribute__(self, name: str) -> Any:
        if name == "num_workers":
            note_split_read()
        return super().__getattribute__(name)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WorkerInfo) and _fields(self) == _fields(other)

    def __hash__(self) -> int:
        return hash(_fields(self))


def _fields(info: WorkerInfo) -> tuple[Any, ...]:
    get = object.__getattribute__
    fields = ("id", "num_workers", "seed", "dataset", "backend", "pid", "node")
    return tuple(get(info, f) for f in fields)


def _watched(info: WorkerInfo) -> WorkerInfo:
    cached = getattr(_thread_info, "watched", None)
    if cached is None or cached[0] is not info:
        cached = (info, _Watched(*_fields(info)))
        _thread_info.watched = cached
    return cached[1]


def note_split_read() -> None:
    """User code in this thread read how many workers there are: it may split by worker."""
    _thread_info.reads = getattr(_thread_info, "reads", 0) + 1


def split_reads() -> int:
    """How often user code in this thread read ``num_workers`` since its replica's pass began
    (pipeflow's own ``get_worker_info()`` and, in process workers, torch's)."""
    return int(getattr(_thread_info, "reads", 0))


def set_process_worker_info(info: WorkerInfo) -> None:
    """Record *info* for this process (called once, when a process worker starts)."""
    global _process_info
    _process_info = info


def set_thread_worker_info(info: WorkerInfo | None) -> None:
    """Record *info* for the calling thread (a thread worker)."""
    _thread_info.info = info


def in_replica() -> bool:
    """Whether this code runs a ``parallel_source`` replica (each worker reads its own share)."""
    return bool(getattr(_thread_info, "replica", False)) or _process_replica


_process_replica = False


def set_replica(flag: bool, *, thread: bool) -> None:
    """Mark this thread (a thread worker) or process (a process worker) as a replica."""
    global _process_replica
    if thread:
        _thread_info.replica = flag
    else:
        _process_replica = flag


def begin_replica_pass() -> None:
    """A replica's pass begins in this thread: no ``num_workers`` read yet."""
    _thread_info.reads = 0
