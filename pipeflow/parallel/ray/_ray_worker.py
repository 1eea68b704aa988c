"""The Ray actor's side: what one actor of a ``backend="ray"`` pool does.

An actor is a persistent worker: it is made once per worker (and again, as a new life, when
one dies), holds the job and its ``worker_init``, and runs calls of several items, each a
:class:`~pipeflow.parallel.transport._wire.Task` of the pass, in the order sent. It answers
with a :class:`~pipeflow.parallel.transport._wire.Reply` per item, as a process worker does:
the result packed for the object store (:mod:`._ray_wire`), a failure as a value with its
note (stage, sample index, actor, pid, node), and what changed in its state for
``state_dict()``.

This module imports Ray only inside the actor (for where it runs); :mod:`._ray` (the pool)
makes the actor class with ``ray.remote``.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from pipeflow.errors import annotate
from pipeflow.parallel.pools._worker import (
    Snapshotter,
    WorkerSpec,
    _tell_torch,
    restore_worker,
    seed_worker,
)
from pipeflow.parallel.ray._ray_wire import pack
from pipeflow.parallel.transport._wire import (
    Exhausted,
    RemoteError,
    Reply,
    describe_item,
    remote_error,
)
from pipeflow.worker_info import WorkerInfo, set_process_worker_info

__all__ = ["RayWorker", "node_words"]


def node_words(ip: str, node_id: str) -> str:
    """How a note names a Ray node: its address and the start of its id (the nodes of a
    cluster simulated on one machine share an address).

    Examples:
        >>> node_words("10.0.0.7", "5f3a9c1e0b2d4e6f8a7b9c0d1e2f3a4b5c6d7e8f")
        '10.0.0.7 5f3a9c1e'
    """
    return f"{ip} {node_id[:8]}"


class RayWorker:
    """One actor: set up once (seeded as a worker process is, ``worker_init``, a resumed
    pass's state), then :meth:`run` for each call.

    Args:
        work: the pickle (Ray's cloudpickle) of ``(job, worker_init)``, made once by the pool
            and shared by its actors through the object store.
        spec: the worker's :class:`~pipeflow.parallel.pools._worker.WorkerSpec` (``job`` and
            ``worker_init`` travel in *work*).
    """

    def __init__(self, work: bytes, spec: WorkerSpec) -> None:
        import ray

        context = ray.get_runtime_context()
        address = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        self.where = (os.getpid(), address, context.get_node_id())
        self.worker_id = spec.worker_id
        self.failed: RemoteError | None = None  # set-up failed: every call answers with it
        self.job: Any = None
        self.info: WorkerInfo | None = None
        self.told_torch = False
        try:
            self._start(work, spec)
        except BaseException as e:
            self.failed = remote_error(e)
        self.snap = Snapshotter(self.job, spec.rng_state, own=True)

    def _start(self, work: bytes, spec: WorkerSpec) -> None:
        """What a process worker does first (see ``start_process_worker``), in an actor."""
        from ray import cloudpickle

        job, worker_init = cloudpickle.loads(work)
        if "torch" not in sys.modules:  # the numpy-only forms: tensors made on arrival
            job.without_torch()
        self.job = job
        seed = seed_worker(spec.base_seed, spec.worker_id)
        node = node_words(self.where[1], self.where[2])
        self.info = WorkerInfo(
            spec.worker_id, spec.num_workers, seed, job.dataset, "ray", self.where[0], node
        )
        set_process_worker_info(self.info)
        self.told_torch = _tell_torch(self.info)
        if worker_init is not None:
            worker_init(spec.worker_id)
        restore_worker(job, spec.restore)

    def place(self) -> tuple[int, str, str]:
        """``(pid, node address, node id)``: where this actor runs (also a liveness probe)."""
        return self.where

    def run(self, pass_id: int, epoch: int, items: list[tuple[int, Any]]) -> list[Reply]:
        """Run ``(seq, item)`` pairs in turn; a reply for each (or, if the actor's set-up
        failed, one ``"init"`` reply with that failure)."""
        if self.failed is not None:
            return [Reply(None, "init", -1, self.worker_id, 0, self.failed)]
        if not self.told_torch and self.info is not None:
            self.told_torch = _tell_torch(self.info)
        out = []
        for seq, item in items:
            reply = _run_one(self.job, self.worker_id, pass_id, epoch, seq, item)
            state = self.snap()
            out.append(reply if state is None else reply._replace(state=state))
        return out


def _run_one(job: Any, worker: int, pass_id: int, epoch: int, seq: int, item: Any) -> Reply:
    """One item: its result packed, or its failure (what a process worker's task does)."""
    started = time.perf_counter_ns()
    try:
        out = job.run(item, epoch, seq)
    except Exhausted:
        return Reply(pass_id, "end", seq, worker)
    except Exception as e:
        return Reply(pass_id, "err", seq, worker, 0, remote_error(e))
    took = time.perf_counter_ns() - started  # the item's time, for stats
    try:
        packed = pack(out)
    except Exception as e:
        where = describe_item(item, seq)
        annotate(e, job.name, epoch, extra="the result could not be sent back", **where)
        return Reply(pass_id, "err", seq, worker, 0, remote_error(e))
    return Reply(pass_id, "ok", seq, worker, took, packed)
