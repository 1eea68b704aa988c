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
        backend: ``"process"`` or ``"thread"``.
        pid: the worker's process id.
    """

    id: int
    num_workers: int
    seed: int
    dataset: Any = None
    backend: str = "process"
    pid: int = 0


_process_info: WorkerInfo | None = None
_thread_info = threading.local()


def get_worker_info() -> WorkerInfo | None:
    """The :class:`WorkerInfo` of the worker this code runs in, or ``None`` outside workers.

    Examples:
        >>> get_worker_info() is None
        True
    """
    info: WorkerInfo | None = getattr(_thread_info, "info", None)
    return info if info is not None else _process_info


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
