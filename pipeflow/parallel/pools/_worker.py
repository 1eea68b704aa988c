"""The worker side: what a worker does with one task (the jobs: ``MapJob`` applies a
function or a one-to-one stage, ``SourceJob`` takes the next item of its own replica of a
loader; a coroutine function's ``CoroutineJob`` is in :mod:`._aio_worker`), and a process
worker's life (set up once, then the task loop). A thread worker's loop is in :mod:`._threads`.

Nothing here imports torch, so a worker started with spawn or forkserver imports it only when
the user's code does.
"""

from __future__ import annotations

import copy
import os
import pickle
import random
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pipeflow._random import seed_sequence_state
from pipeflow.engine._context import Context
from pipeflow.engine._failure import Failure, WithDropped
from pipeflow.engine._memo import assemble, open_store, segments
from pipeflow.engine._stage import Stage, contexts_of, without_torch
from pipeflow.errors import StreamNotSplitError, annotate
from pipeflow.parallel.pools._fork import Pickled
from pipeflow.parallel.transport import _segments
from pipeflow.parallel.transport._shm import Writer
from pipeflow.parallel.transport._wire import (
    Encoded,
    Exhausted,
    PassNote,
    Reply,
    Task,
    Trim,
    describe_item,
    remote_error,
)
from pipeflow.resume._objects import is_stateful
from pipeflow.resume._rngs import capture as capture_rngs
from pipeflow.resume._rngs import restore as restore_rngs
from pipeflow.resume._states import pack
from pipeflow.worker_info import (
    WorkerInfo,
    begin_replica_pass,
    current_info,
    note_split_read,
    set_process_worker_info,
    set_replica,
    split_reads,
)

__all__ = [
    "MapJob",
    "Snapshotter",
    "SourceJob",
    "WorkerSpec",
    "process_main",
    "restore_worker",
    "seed_worker",
]


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
        rng_state: which global generators the worker reports with each reply for
            ``state_dict()`` (``"torch"``, ``"all"`` or ``None``: see :mod:`pipeflow.resume._rngs`).
        restore: what a resumed pass restores in this worker once it has started (its
            generators, its dataset's or replica's state; see :class:`Snapshotter`), or
            ``None``.
    """

    job: Any
    worker_id: int
    num_workers: int
    base_seed: int
    worker_init: Any = None
    main_pid: int = 0
    prefix: str = ""
    rng_state: str | None = None
    restore: Any = None


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

    @property
    def memo(self) -> bool:
        """Whether the stages hold a cache (asked once)."""
        memo = self.__dict__.get("_memo")
        if memo is None:
            memo = self._memo = any(s.traits.memo is not None for s in self.stages or ())
        return memo

    def _store(self, c: int, j: int) -> Any:
        """The store of the cache at *c* (its segment from *j*), opened once per worker."""
        stores = self.__dict__.setdefault("_stores", {})
        if c not in stores:
            stages = self.stages or ()
            slot = f"{self.facts.get('memo_at')}.{c}"  # the cache's place in the loader
            stores[c] = open_store(stages[c], stages[j:c], self.facts.get("memo"), slot)
        return stores[c]

    def without_torch(self) -> None:
        """In a worker that has not imported torch: the stages' numpy-only forms."""
        if self.stages is not None:
            self.stages = tuple(without_torch(s) for s in self.stages)

    @property
    def dataset(self) -> Any:
        """The dataset the stages read by key, for ``WorkerInfo.dataset``."""
        datasets = (s.traits.dataset for s in self.stages or ())
        return next((d for d in datasets if d is not None), None)

    def snapshot(self) -> dict[str, Any] | None:
        """The worker's copy of a stateful dataset, as it stands (``None``: not stateful)."""
        stateful = self.__dict__.get("_stateful", _UNKNOWN)
        if stateful is _UNKNOWN:  # asked once: the job's dataset does not change
            dataset = self.dataset
            stateful = self._stateful = dataset if is_stateful(dataset) else None
        return None if stateful is None else {"dataset": stateful.state_dict()}

    def restore(self, saved: dict[str, Any]) -> None:
        """Give the worker's copy of the dataset the state a resumed pass starts from."""
        if saved.get("dataset") is not None:
            self.dataset.load_state_dict(saved["dataset"])

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
        contexts = contexts_of(self.stages, context)

        def each(i: int, s: Stage[Any, Any], it: Iterator[Any]) -> Iterator[Any]:
            it = _track(s.apply(it, contexts[i]), s.name, failed)
            if s.traits.failures == "mark":  # failures it yields: raised, or kept when dropped
                it = _unmark(it, dropped)
            return it

        it: Iterator[Any] = iter((item,))
        if not self.memo:
            for i, s in enumerate(self.stages):
                it = each(i, s, it)
        else:  # a cache among the stages: its segment runs on the keys it lacks
            segs = self.__dict__.get("_segs")
            if segs is None:
                segs = self._segs = segments(self.stages)
            it = assemble(self.stages, it, each, self._store, segs)
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


_UNKNOWN = object()


class SourceJob:
    """Run a whole loader in each worker, one item per task (an ``IterableDataset`` replica).

    Each pass's tasks carry a :class:`~pipeflow.parallel.transport._wire.PassNote` whose key changes
    with the pass: the replica then starts its own pass afresh (a persistent worker's too),
    from where a resumed pass tells it (:meth:`restore`).
    """

    def __init__(self, loader: Any, name: str) -> None:
        self.loader = loader
        self.name = name
        self._key: int | None = None
        self._it: Iterator[Any] | None = None
        self._unsplit = False  # the pass's first item is to be looked at (see _split_in_threads)
        self.pending: dict[str, Any] | None = None  # where the next replica pass resumes

    @property
    def dataset(self) -> Any:
        return getattr(self.loader.source, "iterable", None)

    def without_torch(self) -> None:
        """In a worker that has not imported torch: the stages' numpy-only forms."""
        stages = tuple(without_torch(s) for s in self.loader.stages)
        self.loader = type(self.loader)(self.loader.source, stages)

    def clone(self) -> SourceJob:
        """A replica with its own iterator (one per thread worker); over a stateful object
        (one with ``state_dict()``), with its own copy of it, as a process worker has: the
        threads would otherwise share one object's state, and each worker's saved state
        would be the others' too."""
        source = self.loader.source
        if is_stateful(getattr(source, "iterable", None)):
            try:
                source = copy.deepcopy(source)
            except Exception as e:
                msg = (
                    f"{self.name}(backend='thread'): each thread worker reads its own copy of "
                    f"the stateful {type(source.iterable).__name__} (as each process worker "
                    f"does), and it can't be copied ({type(e).__name__}: {e}); use "
                    "backend='process', or give it a __deepcopy__"
                )
                raise TypeError(msg) from e
        return SourceJob(type(self.loader)(source, self.loader.stages), self.name)

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        info = current_info()
        if info is not None:  # shard() inside reads this worker's share
            set_replica(True, thread=info.backend == "thread")
        key = item.key if isinstance(item, PassNote) else epoch
        if self._key != key:
            if self._it is not None:
                self._it.close()  # type: ignore[attr-defined]
            begin_replica_pass()  # what the source reads of the workers from here, shard sees
            self.loader.set_epoch(epoch)
            if isinstance(item, PassNote) and item.value is not None:
                self.loader.source.begin_pass(item.value)
            if self.pending is not None:  # the first pass of a restored worker
                self.loader.resume_from(epoch, self.pending)
                self.pending = None
            self._it = iter(self.loader)
            self._key = key
            self._unsplit = info is not None and info.backend == "thread" and info.num_workers > 1
        assert self._it is not None
        try:
            out = next(self._it)
        except StopIteration:
            raise Exhausted from None
        if self._unsplit:
            self._unsplit = False
            try:
                _split_in_threads(self.loader, self.dataset, self.name)
            except StreamNotSplitError:
                self._it.close()  # type: ignore[attr-defined]
                self._it = _nothing()  # the replica ends here: the rest would be duplicates
                raise
        return out

    def snapshot(self) -> dict[str, Any] | None:
        """Where the replica's pass stands, when its objects have state or its stages keep
        records (else the main process's count of its items says it all)."""
        record = self.loader.pass_record()
        return None if record is None else {"replica": record}

    def restore(self, saved: dict[str, Any]) -> None:
        """Resume the replica's next pass where *saved* says it stood."""
        self.pending = saved.get("replica") or {"position": saved.get("count", 0)}


def _nothing() -> Iterator[Any]:
    """An iterator that has ended (and can be closed)."""
    yield from ()


def _split_in_threads(loader: Any, dataset: Any, name: str) -> None:
    """Refuse a thread replica over a torch ``IterableDataset`` that did not split its stream
    by worker: torch's ``get_worker_info()`` answers ``None`` in a thread, so a dataset that
    splits by it reads the whole stream in every thread, and the epoch would hold each item
    once per worker, without a word."""
    torch_data = sys.modules.get("torch.utils.data")
    iterable = getattr(torch_data, "IterableDataset", None)
    if iterable is None or not isinstance(dataset, iterable) or split_reads():
        return
    from pipeflow.stages.distributed import is_shard

    if any(is_shard(s) for s in loader.stages):
        return
    msg = (
        f"{name}(backend='thread'): {type(dataset).__name__} is a torch IterableDataset that "
        "did not ask pipeflow.get_worker_info() how many workers there are before its first "
        "item. torch.utils.data.get_worker_info() answers None in a thread, so a dataset that "
        "splits by it reads the whole stream in every thread, and the epoch would hold each "
        "item once per worker. Split by pipeflow.get_worker_info() (it answers in threads "
        "too), add pf.shard() to the loader, or use backend='process'"
    )
    raise StreamNotSplitError(msg)


class Snapshotter:
    """What a worker sends with each reply for ``state_dict()``: what changed in its state
    since its previous reply — its job's (the worker's copy of a stateful dataset, its
    replica's pass: *own* is False for thread workers of a map, which share the main
    process's dataset) and its global generators' (see :mod:`pipeflow.resume._rngs`)."""

    __slots__ = ("job", "own", "rngs")

    def __init__(self, job: Any, rng_state: str | None, own: bool) -> None:
        self.job, self.own, self.rngs = job, own, Tracker(rng_state)

    def __call__(self) -> dict[str, Any] | None:
        out = self.job.snapshot() if self.own else None
        rng = self.rngs.changed()
        if rng is not None:
            out = {**(out or {}), "rng": rng}
        return out


class Tracker:
    """A worker's generators, item after item: what changed since the last item.

    torch's state is compared as raw bytes (about 3 microseconds an item) and encoded only
    when it changed; with ``"all"``, Python's and numpy's states are read every item.
    """

    __slots__ = ("kind", "last", "raw")

    def __init__(self, kind: str | None) -> None:
        self.kind = kind
        self.last: dict[str, Any] = {}
        self.raw = b""  # torch's state as last sent

    def changed(self) -> dict[str, Any] | None:
        """The states that changed since the last call (``None``: none did)."""
        if self.kind is None:
            return None
        diff: dict[str, Any] = {}
        torch = sys.modules.get("torch")
        if torch is not None:
            raw = torch.get_rng_state().numpy().tobytes()
            if raw != self.raw:  # sent as bytes; a state encodes them (see as_json)
                self.raw = diff["torch"] = raw
        if self.kind == "all":
            now = capture_rngs("all")
            now.pop("torch", None)
            diff.update({k: v for k, v in now.items() if self.last.get(k) != v})
            self.last.update(now)
        return diff or None


def restore_worker(job: Any, saved: dict[str, Any] | None) -> None:
    """What a resumed pass restores in a worker that has just started: its generators, its
    job's state (after seeding and ``worker_init``, as torchdata does)."""
    if not saved:
        return
    restore_rngs(saved.get("rng"))
    job.restore(saved)


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

    torch_worker._worker_info = _torch_info_class(torch_worker.WorkerInfo)(
        id=info.id, num_workers=info.num_workers, seed=info.seed, dataset=info.dataset
    )
    torch.set_num_threads(1)  # as torch's workers: no thread oversubscription
    return True


_TORCH_INFO: list[type] = []


def _torch_info_class(base: type) -> type:
    """torch's ``WorkerInfo``, whose ``num_workers`` read counts as a split by worker (as
    pipeflow's does: see :func:`pipeflow.worker_info.split_reads`)."""
    if not _TORCH_INFO:

        class WorkerInfo(base):  # type: ignore[misc]
            __qualname__ = base.__qualname__

            def __getattribute__(self, name: str) -> Any:
                if name == "num_workers":
                    note_split_read()
                return super().__getattribute__(name)

        _TORCH_INFO.append(WorkerInfo)
    return _TORCH_INFO[0]


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
        if isinstance(job, Pickled):
            job = job.load()
        if isinstance(worker_init, Pickled):
            worker_init = worker_init.load()
        if defer_torch and "torch" not in sys.modules:
            job.without_torch()
        seed = seed_worker(spec.base_seed, worker_id)
        info = WorkerInfo(worker_id, spec.num_workers, seed, job.dataset, "process", os.getpid())
        set_process_worker_info(info)
        told_torch = _tell_torch(info)
        if worker_init is not None:
            worker_init(worker_id)
        restore_worker(job, spec.restore)
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
    send, recv, monotonic = conn.send_bytes, conn.recv, time.monotonic
    writer = Writer(spec.prefix, keep_bytes=_segments.keep_budget(spec.num_workers))
    writer.activate()
    snap = Snapshotter(job, spec.rng_state, own=True)
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
        state = snap()
        packed = None if state is None else pack(state)  # pickled now: read where a state needs it
        writer.unreserve()
        # when it is done with the item: its next one starts as this reply is sent
        reply = reply._replace(state=packed, ended=monotonic())
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
