"""``parallel_map``: the stage, its settings checked when it is built; each pass runs in
:func:`pipeflow.parallel._run.run_parallel`."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pipeflow._coroutines import is_coroutine_function, refuse
from pipeflow.engine._context import Context, Hooks
from pipeflow.engine._stage import Stage, Traits, _short
from pipeflow.parallel._records import MapRecord
from pipeflow.parallel._run import run_parallel
from pipeflow.parallel._settings import Settings, check_auto, settings
from pipeflow.parallel.pools._worker import MapJob
from pipeflow.resume.state import Rule

__all__ = ["ParallelMap", "parallel_map"]

T = TypeVar("T")
U = TypeVar("U")


#: It marks failed items, and takes its items as many at a time as there is room for.
_TRAITS = Traits(failures="mark", reads_in_runs=True)


class ParallelMap(Stage[T, U]):
    """The stage :func:`parallel_map` returns."""

    __slots__ = ()

    def __init__(self, fn: Any, config: Settings) -> None:
        config_ = {"fn": fn, "settings": config}
        rule = _IN_ORDER if config.ordered else _UNORDERED
        super().__init__(_run, "parallel_map", config_, length="same", resume=rule, traits=_TRAITS)

    def __repr__(self) -> str:
        fn = self._config["fn"]
        first = repr(fn) if isinstance(fn, Stage) else _short(fn)
        config: Settings = self._config["settings"]
        return config.describe("parallel_map", first)

    def __reduce__(self) -> tuple[Any, ...]:
        return (ParallelMap, (self._config["fn"], self._config["settings"]))


def _run(
    upstream: Iterable[Any],
    fn: Any,
    settings: Settings,
    *,
    context: Context,
    stats: Any,
    record: MapRecord | None,
    resources: dict[Any, Any],
    delivered: frozenset[int],
) -> Iterator[Any]:
    """One pass: *fn* over *upstream* on the pool (see :func:`run_parallel`)."""
    make: Any = MapJob
    if settings.coroutines:  # asyncio is imported for coroutine functions only
        from pipeflow.parallel.pools._aio_worker import CoroutineJob

        make = CoroutineJob
    job = make(fn, "parallel_map", context.ignoring, dict(context.facts))
    hooks = Hooks(stats, delivered, record, resources)
    return run_parallel(job, settings, "parallel_map", upstream, context, hooks)


def _identity(stage: Stage[Any, Any]) -> list[str]:
    """What resumption compares: the work and the delivery order, not the workers.

    In order, a parallel map is the same pipeline as its stages run in line (so a state
    taken with workers resumes without, and back).
    """
    fn = stage.config["fn"]
    if stage.config["settings"].ordered:
        return [repr(s) for s in fn.stages] if isinstance(fn, Stage) else [f"map(fn={_short(fn)})"]
    work = repr(fn) if isinstance(fn, Stage) else _short(fn)
    return [f"parallel_map({work}, ordered=False)"]


#: In order, its first *k* results are those of its first *k* items (its record holds the
#: workers' states); out of order, the pass records what it delivered. Either way it reads
#: ahead of its consumer.
_IN_ORDER = Rule.below("same", record=MapRecord, identity=_identity, reads_ahead=True)
_UNORDERED = Rule.recorded(MapRecord, unordered=True, identity=_identity, reads_ahead=True)


def parallel_map(
    fn: Callable[[T], U] | Stage[T, U],
    *,
    workers: int | str,
    backend: str = "thread",
    ordered: bool = True,
    max_in_flight: int | None = None,
    mp_context: Any = None,
    worker_init: Callable[[int], Any] | None = None,
    timeout: float | None = None,
    persistent: bool = False,
    seed: int | None = None,
    round_robin: bool = False,
    rng_state: str | None = "torch",
    restarts: int = 0,
    ray_options: Mapping[str, Any] | None = None,
) -> Stage[T, U]:
    """Apply *fn* to every item on a pool of threads or processes.

    *fn* is a function or a one-to-one stage, such as ``pf.fetch(ds) | pf.collate()`` over
    batches of indices — exactly what a DataLoader worker does.

    - ``backend="thread"``: right for I/O (files, remote storage, decoders that release the
      GIL) and free-threaded Python. Items are shared, nothing is pickled.
    - ``backend="process"``: for CPU-bound Python. *fn* (with its dataset) goes to each worker
      once, when the pool starts; numpy arrays and CPU tensors come back through shared
      memory. ``fork``, ``forkserver`` and ``spawn`` all work.
    - ``backend="ray"`` (the ``pipeflow[ray]`` extra): in Ray actors across a cluster, each
      holding *fn* and *worker_init* as a persistent worker does; results come back through
      Ray's object store. It connects as Ray does (a Ray already initialised, else
      ``RAY_ADDRESS``, else a local instance). See the how-to "Preprocess on a Ray cluster".

    An ``async def`` *fn* (or an object whose ``__call__`` is one) runs on asyncio event loops:
    *workers* loops in threads, or one loop in each worker process; many items per loop at
    once, up to *max_in_flight* in all (default ``64 * workers``); on threads as many items
    again may wait on the loops, to start as coroutines end. Stopping early cancels the
    coroutines in flight. See the how-to "Remote data: threads, processes or coroutines".

    At most *max_in_flight* items are out at once (default ``2 * workers``), so a slow consumer
    holds the workers back instead of filling memory. ``ordered=True`` yields exactly the
    sequence ``map(fn, items)`` would; ``ordered=False`` yields results as they complete, each
    exactly once, so one slow item does not hold back the rest.

    A worker process that dies (killed, out of memory, a crash in C code, ``os._exit``) is
    never taken for a bad sample. By default (``restarts=0``, as torch's DataLoader) the pass
    ends with :class:`~pipeflow.WorkerDiedError`, naming the worker, its pid, the exit code
    or signal, and every item not delivered; :func:`~pipeflow.ignore_errors` never drops it.
    With ``restarts=n`` a new worker takes the dead one's place and its items, up to *n*
    times an epoch, and the epoch completes with every item exactly once (each death is
    logged as a warning on the ``"pipeflow"`` logger). A sample that kills two workers in a
    row is taken for a "poison" sample: the pass ends with a ``WorkerDiedError`` naming it.

    Each process worker's ``random``, numpy and torch global generators are seeded with
    ``base_seed + worker_id`` (torch's scheme); *base_seed* derives from *seed* and the epoch
    (see :mod:`pipeflow._random`). Thread workers share the process's global generators, which
    no seeding can make reproducible under threads: give per-sample randomness its own
    generator instead (:func:`~pipeflow.random_map`).

    Args:
        fn: the function, or a stage that yields one item per item.
        workers: how many threads or processes; ``0`` runs *fn* in the calling thread;
            ``"auto"`` sizes the pool while it runs: it starts small, adds workers while
            that raises the rate the consumer gets, and removes them when they do not pay,
            within a budget (processes: the CPUs this process may use, shared with the
            other auto stages; threads: 64; event loops: one per CPU; Ray: an actor per
            free CPU of the cluster, counted when the pool starts). The items, their order
            and their random draws are those of any fixed count; ``stats()`` and the
            loader's repr say the count it chose and why. Not with *round_robin*.
        backend: ``"thread"`` (the default: a function per item is most often I/O or
            decoding, which waits or releases the GIL), ``"process"``, or ``"ray"`` (actors
            on a Ray cluster). ``parallel_source`` defaults to processes instead, as torch
            runs an ``IterableDataset``'s copies.
        ordered: keep the input order (else completion order).
        max_in_flight: bound on items out at once; default ``2 * workers`` (``32 * workers``
            for Ray actors, which get their items in calls of half their share).
        mp_context: start method (``"fork"``, ``"forkserver"``, ``"spawn"``) or a
            multiprocessing context, for processes; default: the platform's.
        worker_init: called as ``worker_init(worker_id)`` in each worker once it has started.
        timeout: seconds a worker may hold an item without finishing it, then the pass
            ends with :class:`~pipeflow.WorkerTimeoutError`; ``None`` waits forever. An item
            counts from when its worker began it: not while it waited behind others, nor
            while the consumer held results; and what other workers deliver meanwhile does
            not put it off. (A Ray actor answers a call of several items at once: see
            ``busy_since`` in :mod:`pipeflow.parallel.ray._ray`.)
        persistent: keep the workers between epochs (like torch's ``persistent_workers``);
            ``loader.close()`` stops them and returns once they have exited.
        seed: the workers' seed; ``None`` draws one when the stage is built.
        round_robin: send item *k* of a pass to worker ``k % workers``, as torch's DataLoader
            does, instead of to the least busy worker. Use it when *fn* draws from the
            workers' global random generators and the result must not depend on timing.
        rng_state: with process workers and *round_robin*, which of each worker's global
            generators a state saves, as of the last item the consumer received from it, so
            that a resumed pass draws the same numbers: ``"torch"`` (torch's; the default),
            ``"all"`` (Python's ``random`` and numpy's too: about 0.1 ms an item more), or
            ``None`` (see :mod:`pipeflow.resume._rngs` and the how-to "Resume a run mid-epoch").
        restarts: process workers and Ray actors only: how many dead workers a pass may
            replace (their items go to the new worker, which starts with the dead one's id
            and seed); ``0`` ends the pass at the first death.
        ray_options: ``backend="ray"`` only: Ray's options for each actor (``num_cpus``,
            ``num_gpus``, ``resources``, ``scheduling_strategy``, ``runtime_env``, ...);
            default ``{"num_cpus": 1, "scheduling_strategy": "SPREAD"}``.

    Raises:
        TypeError, ValueError: for a bad argument, when the stage is built. An *fn* (or
            *worker_init*) that can't be pickled for a spawn or forkserver pool raises
            ``TypeError`` then too.

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
    _check_fn(fn)
    if isinstance(workers, str) and workers == "auto":
        check_auto("parallel_map", round_robin)
    config = settings(
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
        round_robin=round_robin,
        coroutines=is_coroutine_function(fn),
        rng_state=rng_state,
        restarts=restarts,
        ray_options=ray_options,
    )
    if is_coroutine_function(fn):
        config = dataclasses.replace(config, coroutines=True)
    config.check_picklable("parallel_map", fn=fn)
    return ParallelMap(fn, config)


def _check_fn(fn: Any) -> None:
    """*fn*: a callable, or a one-to-one stage with no coroutine function inside."""
    if isinstance(fn, Stage):
        if any(fn.length(k) != k for k in (1, 2, 3, 7)):
            bad = next((s.name for s in fn.stages if s.length(2) != 2), fn.name)
            msg = (
                f"parallel_map: fn must be one-to-one, but stage {bad!r} can change the number "
                "of items; run it before or after the parallel stage"
            )
            raise ValueError(msg)
        for s in fn.stages:  # a coroutine function inside a stage: nothing would await it
            for key, value in s.config.items():
                refuse(f"parallel_map: stage {s.name!r}", key, value)
    elif not callable(fn):
        msg = f"parallel_map: fn must be callable or a stage (got {type(fn).__name__})"
        raise TypeError(msg)
