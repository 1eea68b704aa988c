"""Parallel stages: ``parallel_map`` over threads or processes, and ``parallel_source``."""

from __future__ import annotations

import hashlib
import multiprocessing
import multiprocessing.context
import numbers
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pipeflow._random import check_seed, fresh_seed
from pipeflow._stage import Stage
from pipeflow.loader import Context, Loader, Source

__all__ = ["parallel_map", "parallel_source"]

T = TypeVar("T")
U = TypeVar("U")

_BACKENDS = ("thread", "process")


class _Box:
    """The one mutable part of a parallel stage: its persistent pool, if any."""

    __slots__ = ("__weakref__", "busy", "pool")

    def __init__(self) -> None:
        self.pool: Any = None
        self.busy = False

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()


def _settings(
    name: str,
    *,
    workers: Any,
    backend: Any,
    ordered: Any,
    max_in_flight: Any,
    mp_context: Any,
    worker_init: Any,
    timeout: Any,
    persistent: Any,
    seed: Any,
) -> dict[str, Any]:
    """Validate the settings both parallel stages share; return them, the seed drawn."""
    if isinstance(workers, bool) or not isinstance(workers, int):
        msg = f"{name}: workers must be an integer (got {workers!r})"
        raise TypeError(msg)
    if workers < 0:
        msg = f"{name}: workers must be at least 0 (got {workers})"
        raise ValueError(msg)
    if backend not in _BACKENDS:
        msg = f"{name}: backend must be 'thread' or 'process' (got {backend!r})"
        raise ValueError(msg)
    if not isinstance(ordered, bool):
        msg = f"{name}: ordered must be a bool (got {ordered!r})"
        raise TypeError(msg)
    if max_in_flight is not None:
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int):
            msg = f"{name}: max_in_flight must be an integer or None (got {max_in_flight!r})"
            raise TypeError(msg)
        if max_in_flight < 1:
            msg = f"{name}: max_in_flight must be at least 1 (got {max_in_flight})"
            raise ValueError(msg)
    if mp_context is not None:
        if backend != "process":
            msg = f"{name}: mp_context applies to backend='process' only (got {mp_context!r})"
            raise ValueError(msg)
        if isinstance(mp_context, str):
            methods = multiprocessing.get_all_start_methods()
            if mp_context not in methods:
                msg = f"{name}: mp_context must be one of {methods} (got {mp_context!r})"
                raise ValueError(msg)
        elif not isinstance(mp_context, multiprocessing.context.BaseContext):
            msg = (
                f"{name}: mp_context must be a start method name or a multiprocessing context "
                f"(got {type(mp_context).__name__})"
            )
            raise TypeError(msg)
    if worker_init is not None and not callable(worker_init):
        msg = f"{name}: worker_init must be callable or None (got {type(worker_init).__name__})"
        raise TypeError(msg)
    if timeout is not None:
        if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
            msg = f"{name}: timeout must be a number of seconds or None (got {timeout!r})"
            raise TypeError(msg)
        if not float(timeout) > 0:
            msg = f"{name}: timeout must be more than 0 seconds (got {timeout!r})"
            raise ValueError(msg)
    if not isinstance(persistent, bool):
        msg = f"{name}: persistent must be a bool (got {persistent!r})"
        raise TypeError(msg)
    return {
        "workers": workers,
        "backend": backend,
        "ordered": ordered,
        "max_in_flight": max_in_flight,
        "mp_context": mp_context,
        "worker_init": worker_init,
        "timeout": timeout,
        "persistent": persistent,
        "seed": fresh_seed() if seed is None else check_seed(name, seed),
    }


def _context(mp_context: Any) -> multiprocessing.context.BaseContext:
    if isinstance(mp_context, multiprocessing.context.BaseContext):
        return mp_context
    context: multiprocessing.context.BaseContext = multiprocessing.get_context(mp_context)
    return context


def _base_seed(seed: int, context: Context) -> int:
    if callable(context.base_seed):
        return context.base_seed()
    if context.base_seed is not None:
        return context.base_seed
    digest = hashlib.blake2b(f"{seed}:{context.epoch}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def _make_pool(
    job: Any, config: dict[str, Any], name: str, base_seed: int, round_robin: bool
) -> Any:
    from pipeflow.parallel._pool import ProcessPool, ThreadPool

    if config["backend"] == "process":
        return ProcessPool(
            job,
            config["workers"],
            name=name,
            context=_context(config["mp_context"]),
            worker_init=config["worker_init"],
            base_seed=base_seed,
            round_robin=round_robin,
        )
    return ThreadPool(
        job,
        config["workers"],
        name=name,
        worker_init=config["worker_init"],
        base_seed=base_seed,
        round_robin=round_robin,
    )


def _run(
    box: _Box,
    job: Any,
    config: dict[str, Any],
    name: str,
    upstream: Iterable[Any] | None,
    context: Context,
    round_robin: bool,
) -> Iterator[Any]:
    """One pass of a parallel stage: borrow (or start) the pool, drive it, give it back."""
    from pipeflow.parallel._pool import drive

    workers = config["workers"]
    stats = context.record
    if stats is not None and workers:
        stats.workers = workers
        stats.max_in_flight = config["max_in_flight"] or 2 * workers
    # Items are numbered by their position in the pass (a resumed pass starts further on), so
    # per-item randomness does not depend on where the pass started or on the workers.
    first = context.offset
    resume = context.resume.get(context.stage_index)
    skip = frozenset(resume["extras"]) if resume else frozenset()
    record = None
    if not config.get("ordered", True) and context.stage_index >= 0:
        record = _Record(first, skip)
        context.records[context.stage_index] = record
    if workers == 0:  # in the calling thread: the reference the parallel runs must equal
        yield from _inline(job, upstream, context.epoch, first, skip, record)
        return
    base_seed = _base_seed(config["seed"], context)
    reuse = config["persistent"] and not box.busy
    pool = box.pool if reuse else None
    if pool is not None and (pool.closed or pool.broken):
        box.close()
        pool = None
    if pool is None:
        pool = _make_pool(job, config, name, base_seed, round_robin)
        if reuse:
            box.pool = pool
    if reuse:
        box.busy = True
    ok = False
    try:
        yield from drive(
            pool,
            upstream,
            epoch=context.epoch,
            ordered=config["ordered"],
            max_in_flight=config["max_in_flight"] or 2 * workers,
            timeout=config["timeout"],
            first=first,
            skip=skip,
            record=record,
            stats=stats,
        )
        ok = True
    finally:
        if reuse:
            box.busy = False
            if not ok and pool.broken:
                box.close()
        else:
            pool.close()


class _Record:
    """What an unordered pass delivered: every item before *prefix*, *extras*, then *order*."""

    __slots__ = ("extras", "order", "prefix")

    def __init__(self, prefix: int, extras: frozenset[int]) -> None:
        self.prefix = prefix
        self.extras = extras
        self.order: list[int] = []


def _inline(
    job: Any,
    upstream: Iterable[Any] | None,
    epoch: int,
    first: int = 0,
    skip: frozenset[int] = frozenset(),
    record: _Record | None = None,
) -> Iterator[Any]:
    from pipeflow.parallel._worker import Exhausted

    if upstream is None:
        seq = first
        while True:
            try:
                yield job.run(None, epoch, seq)
            except Exhausted:
                return
            seq += 1
    for seq, item in enumerate(upstream, first):
        if seq in skip:
            continue
        out = job.run(item, epoch, seq)
        if record is not None:
            record.order.append(seq)
        yield out


class ParallelMap(Stage[T, U]):
    """The stage :func:`parallel_map` returns (its persistent pool lives in a private box)."""

    __slots__ = ("__weakref__", "_box")
    _box: _Box

    def __init__(self, config: dict[str, Any]) -> None:
        box = _Box()
        object.__setattr__(self, "_box", box)
        weakref.finalize(self, box.close)
        super().__init__(_no_call, "parallel_map", config, length="same")

    def apply(self, upstream: Iterable[Any], context: Context) -> Iterator[U]:
        from pipeflow.parallel._worker import MapJob

        config = self._config
        job = MapJob(config["fn"], "parallel_map")
        rr = config["round_robin"]
        return _run(self._box, job, config, "parallel_map", upstream, context, rr)

    def close(self) -> None:
        """Stop a persistent pool's workers."""
        self._box.close()

    def skipped_inputs(self, k: int) -> int | None:
        """In order, the first *k* results are those of the first *k* items."""
        return k if self._config["ordered"] else None

    def resume_state(self, record: Any, consumed: int) -> Any:
        """Every item before ``prefix`` and the ``extras`` were delivered and consumed."""
        done = set(record.extras) | set(record.order[:consumed])
        prefix = record.prefix
        while prefix in done:
            done.discard(prefix)
            prefix += 1
        return {"prefix": prefix, "extras": sorted(done)}

    def identity(self) -> list[str]:
        """What resumption compares: the work and the delivery order, not the workers.

        In order, a parallel map is the same pipeline as its stages run in line (so a state
        taken with workers resumes without, and back).
        """
        fn = self._config["fn"]
        if self._config["ordered"]:
            return (
                [repr(s) for s in fn.stages]
                if isinstance(fn, Stage)
                else [f"map(fn={_short_fn(fn)})"]
            )
        work = repr(fn) if isinstance(fn, Stage) else _short_fn(fn)
        return [f"parallel_map({work}, ordered=False)"]

    def __repr__(self) -> str:
        return _parallel_repr("parallel_map", self._config)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ParallelMap, (self._config,))


_DEFAULTS = {
    "backend": None,  # always shown
    "ordered": True,
    "max_in_flight": None,
    "mp_context": None,
    "worker_init": None,
    "timeout": None,
    "persistent": False,
    "round_robin": False,
}


def _parallel_repr(name: str, config: dict[str, Any]) -> str:
    """The arguments that differ from their defaults (and always fn, workers, backend, seed)."""
    from pipeflow._stage import _short

    parts = []
    for key, value in config.items():
        if key in _DEFAULTS and _DEFAULTS[key] is not None and value == _DEFAULTS[key]:
            continue
        if key in ("max_in_flight", "mp_context", "worker_init", "timeout") and value is None:
            continue
        text = repr(value) if key == "loader" else _short(value)
        parts.append(text if key in ("fn", "loader") else f"{key}={text}")
    return f"{name}({', '.join(parts)})"


def _short_fn(fn: Any) -> str:
    from pipeflow._stage import _short

    return _short(fn)


def _no_call(upstream: Iterable[Any]) -> Iterator[Any]:  # pragma: no cover - apply overrides
    raise AssertionError


def parallel_map(
    fn: Callable[[T], U] | Stage[T, U],
    *,
    workers: int,
    backend: str = "thread",
    ordered: bool = True,
    max_in_flight: int | None = None,
    mp_context: str | multiprocessing.context.BaseContext | None = None,
    worker_init: Callable[[int], Any] | None = None,
    timeout: float | None = None,
    persistent: bool = False,
    seed: int | None = None,
    round_robin: bool = False,
) -> Stage[T, U]:
    """Apply *fn* to every item on a pool of threads or processes.

    *fn* is a function or a one-to-one stage, such as ``pf.fetch(ds) | pf.collate()`` over
    batches of indices — exactly what a DataLoader worker does.

    - ``backend="thread"``: right for I/O (files, remote storage, decoders that release the
      GIL) and free-threaded Python. Items are shared, nothing is pickled.
    - ``backend="process"``: for CPU-bound Python. *fn* (with its dataset) goes to each worker
      once, when the pool starts; numpy arrays and CPU tensors come back through shared
      memory. ``fork``, ``forkserver`` and ``spawn`` all work.

    At most *max_in_flight* items are out at once (default ``2 * workers``), so a slow consumer
    holds the workers back instead of filling memory. ``ordered=True`` yields exactly the
    sequence ``map(fn, items)`` would; ``ordered=False`` yields results as they complete, each
    exactly once, so one slow item does not hold back the rest.

    Each process worker's ``random``, numpy and torch global generators are seeded with
    ``base_seed + worker_id`` (torch's scheme); *base_seed* derives from *seed* and the epoch.
    Thread workers share the process's global generators, which no seeding can make
    reproducible under threads: give per-sample randomness its own generator instead.

    Args:
        fn: the function, or a stage that yields one item per item.
        workers: how many threads or processes; ``0`` runs *fn* in the calling thread.
        backend: ``"thread"`` or ``"process"``.
        ordered: keep the input order (else completion order).
        max_in_flight: bound on items out at once; default ``2 * workers``.
        mp_context: start method (``"fork"``, ``"forkserver"``, ``"spawn"``) or a
            multiprocessing context, for processes; default: the platform's.
        worker_init: called as ``worker_init(worker_id)`` in each worker once it has started.
        timeout: seconds to wait for the next result before raising
            :class:`~pipeflow.WorkerTimeoutError`; ``None`` waits forever.
        persistent: keep the workers between epochs (like torch's ``persistent_workers``);
            ``loader.close()`` stops them.
        seed: the workers' seed; ``None`` draws one when the stage is built.
        round_robin: send item *k* to worker ``k % workers``, as torch's DataLoader does,
            instead of to the least busy worker. Use it when *fn* draws from the workers'
            global random generators and the result must not depend on timing; per-sample
            randomness keyed by the sample index needs no such thing.

    Raises:
        TypeError, ValueError: for a bad argument, when the stage is built. An *fn* that can't
            be pickled for a spawn or forkserver pool raises ``TypeError`` before any worker
            starts.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.indices(6) | pf.parallel_map(abs, workers=2)
        >>> list(loader)
        [0, 1, 2, 3, 4, 5]
        >>> words = ["a", "b", "c", "d", "e"]
        >>> loader = pf.indices(5) | pf.batch(2) | pf.parallel_map(pf.fetch(words), workers=2)
        >>> list(loader)
        [['a', 'b'], ['c', 'd'], ['e']]
    """
    if isinstance(fn, Stage):
        if fn.length(1) != 1:
            bad = next((s.name for s in fn.stages if s.length(1) != 1), fn.name)
            msg = (
                f"parallel_map: fn must be one-to-one, but stage {bad!r} can change the number "
                "of items; run it before or after the parallel stage"
            )
            raise ValueError(msg)
    elif not callable(fn):
        msg = f"parallel_map: fn must be callable or a stage (got {type(fn).__name__})"
        raise TypeError(msg)
    if not isinstance(round_robin, bool):
        msg = f"parallel_map: round_robin must be a bool (got {round_robin!r})"
        raise TypeError(msg)
    config = {
        "fn": fn,
        **_settings(
            "parallel_map",
            workers=workers,
            backend=backend,
            ordered=ordered,
            max_in_flight=max_in_flight,
            mp_context=mp_context,
            worker_init=worker_init,
            timeout=timeout,
            persistent=persistent,
            seed=seed,
        ),
        "round_robin": round_robin,
    }
    return ParallelMap(config)


class _ParallelSource(Source[Any]):
    name = "parallel_source"

    def __init__(self, loader: Loader[Any], config: dict[str, Any]) -> None:
        self.loader = loader
        self.config = config
        self.box = _Box()
        weakref.finalize(self, self.box.close)

    def iterate(self, context: Context) -> Iterator[Any]:
        from pipeflow.parallel._worker import SourceJob

        job = SourceJob(self.loader, "parallel_source")
        return _run(self.box, job, self.config, "parallel_source", None, context, True)

    def close(self) -> None:
        self.box.close()

    def describe(self) -> str:
        return _parallel_repr("parallel_source", {"loader": self.loader, **self.config})

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ParallelSource, (self.loader, self.config))


def parallel_source(
    loader: Loader[T],
    *,
    workers: int,
    backend: str = "process",
    ordered: bool = True,
    max_in_flight: int | None = None,
    mp_context: str | multiprocessing.context.BaseContext | None = None,
    worker_init: Callable[[int], Any] | None = None,
    timeout: float | None = None,
    persistent: bool = False,
    seed: int | None = None,
) -> Loader[T]:
    """Run a copy of *loader* in each worker and interleave their outputs, round-robin.

    This is how torch's ``DataLoader`` runs an ``IterableDataset`` with workers: each worker
    iterates its own replica, so the dataset must split itself by
    :func:`~pipeflow.get_worker_info` (or ``torch.utils.data.get_worker_info``, which answers
    too) to avoid duplicates. With ``ordered=True`` the items come worker 0, worker 1, ...,
    worker 0, ...; a worker that runs out drops out of the rotation. Arguments as for
    :func:`parallel_map`.

    Examples:
        >>> import pipeflow as pf
        >>> class Shard:
        ...     def __iter__(self):
        ...         info = pf.get_worker_info()
        ...         start, step = (0, 1) if info is None else (info.id, info.num_workers)
        ...         return iter(range(start, 7, step))
        >>> list(pf.parallel_source(pf.from_iterable(Shard()), workers=2, backend="thread"))
        [0, 1, 2, 3, 4, 5, 6]
    """
    if not isinstance(loader, Loader):
        msg = f"parallel_source: loader must be a pipeflow loader (got {type(loader).__name__})"
        raise TypeError(msg)
    config = _settings(
        "parallel_source",
        workers=workers,
        backend=backend,
        ordered=ordered,
        max_in_flight=max_in_flight,
        mp_context=mp_context,
        worker_init=worker_init,
        timeout=timeout,
        persistent=persistent,
        seed=seed,
    )
    return Loader(_ParallelSource(loader, config))
