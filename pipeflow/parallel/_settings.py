"""The settings both parallel stages share: checked once, shown in reprs (the pool they ask
for is built by :func:`pipeflow.parallel._kept.make_pool`)."""

from __future__ import annotations

import dataclasses
import multiprocessing
import multiprocessing.context
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from pipeflow import _checks
from pipeflow._coroutines import is_coroutine_function
from pipeflow._random import WORKERS, check_seed, derive, fresh_seed
from pipeflow.engine._context import Context
from pipeflow.parallel._auto import AUTO_THREADS, Tuner, cpus
from pipeflow.parallel.ray._ray_options import check_ray_options
from pipeflow.resume._rngs import KINDS
from pipeflow.resume._seeds import WORKERS_SLOT, Seeded

__all__ = [
    "BACKENDS",
    "COROUTINES_PER_WORKER",
    "MAX_RESTARTS",
    "MAX_WORKERS",
    "RAY_PER_WORKER",
    "Settings",
    "auto_cap",
    "check_auto",
    "settings",
]

#: The pools a parallel stage may run on.
BACKENDS = ("thread", "process", "ray")
#: The default bound on coroutines in flight, per event loop: I/O waits, so many at once.
COROUTINES_PER_WORKER = 64
#: The default bound on items in flight per Ray actor: an actor gets its items in calls of
#: half as many, two calls queued, so that it starts the next call as it ends one. A call
#: costs a millisecond or so whatever it carries on a busy 2-core machine, so calls of 16
#: (54-74 us an item, the process backend's cost) rather than 4 (176-208 us): see the Ray
#: how-to. For large items (batches of megabytes) a smaller ``max_in_flight`` bounds the
#: object store's share.
RAY_PER_WORKER = 32
#: The most workers a pool may have: it starts them all at once, each a thread or a process
#: (past a few thousand, a system's limits on threads and processes refuse them anyway).
MAX_WORKERS = 4096
#: The most worker restarts a pass may allow: a bound, not a way to loop on crashes forever.
MAX_RESTARTS = 1_000


@dataclass(frozen=True)
class Settings(Seeded):
    """A parallel stage's validated settings (see :func:`pipeflow.parallel_map`)."""

    workers: int
    backend: str
    ordered: bool
    max_in_flight: int | None
    mp_context: Any
    worker_init: Any
    timeout: float | None
    persistent: bool
    seed: int
    round_robin: bool = False
    #: *fn* is a coroutine function: event loops run it, many items per worker at once.
    coroutines: bool = False
    #: Which of a process worker's global generators a state saves (:mod:`pipeflow.resume._rngs`).
    rng_state: str | None = "torch"
    #: Process workers (or Ray actors) that may die in one pass and be replaced, their items
    #: sent again.
    restarts: int = 0
    #: ``backend="ray"``: Ray's options for each actor (see :mod:`._ray_options`).
    ray_options: dict[str, Any] | None = None
    #: ``workers="auto"``: *workers* is the most the pool may hold, and a tuner picks how
    #: many it uses while it runs (see :mod:`pipeflow.parallel._auto`).
    auto: bool = False

    def kind(self) -> str:
        """What a worker is, in the plural: threads, processes, event loops or actors."""
        if self.backend == "ray":
            return "actors"
        if self.backend == "process":
            return "processes"
        return "event loops" if self.coroutines else "threads"

    def tuner(self, cap: int, start: int, fixed: str | None = None) -> Tuner:
        """A tuner of these settings' workers (``workers="auto"``): at most *cap*, *start*
        at first; *fixed*: why its count does not move (see :class:`Tuner`)."""
        return Tuner(
            self.kind(),
            cap,
            shares_cpus=self.backend == "process",
            start=start,
            per_worker=self.per_worker(),
            max_in_flight=self.max_in_flight,
            fixed=fixed,
        )

    def per_worker(self) -> int:
        """The default in-flight bound per worker."""
        if self.coroutines:
            return COROUTINES_PER_WORKER
        return RAY_PER_WORKER if self.backend == "ray" else 2

    @property
    def in_flight(self) -> int:
        """The bound on items running at once: *max_in_flight*, by default twice the workers
        (:data:`COROUTINES_PER_WORKER` times the workers for a coroutine function,
        :data:`RAY_PER_WORKER` times the actors for Ray). Items out (sent, not yet consumed)
        are bounded by the pool's ``backlog`` of it: the same, or twice as many for event
        loops in threads."""
        if self.max_in_flight:
            return self.max_in_flight
        return self.per_worker() * self.workers

    def base_seed(self, context: Context) -> int:
        """The workers' base seed for this pass: the caller's, else from (seed, epoch)."""
        if callable(context.base_seed):
            return context.base_seed()
        if context.base_seed is not None:
            return context.base_seed
        return derive(self.seed, WORKERS, context.epoch) >> 1  # 63 bits, as torch's seeds

    def seed_slots(self) -> list[tuple[str, int]]:
        """The workers' seed, as a seed of the pipeline (see :mod:`pipeflow.resume._seeds`); the
        stage that holds these settings names it (``"parallel_map workers"``)."""
        return [(WORKERS_SLOT, self.seed)]

    def with_seeds(self, seeds: Iterator[int]) -> Settings:
        """These settings with the workers' seed taken from *seeds*."""
        seed = next(seeds)
        return self if seed is self.seed else dataclasses.replace(self, seed=seed)

    def start_method(self) -> str | None:
        """The start method process workers will use (``None`` for threads, or no workers),
        found without fixing multiprocessing's default."""
        if self.backend != "process" or self.workers == 0:
            return None
        mp = self.mp_context
        if isinstance(mp, multiprocessing.context.BaseContext):
            return str(mp.get_start_method())
        if isinstance(mp, str):
            return mp
        chosen = multiprocessing.get_start_method(allow_none=True)
        if chosen is None:  # not fixed yet: the platform's default
            default = getattr(multiprocessing.context, "_default_context", None)
            chosen = getattr(getattr(default, "_default_context", None), "_name", None)
        return chosen

    def check_picklable(self, name: str, **parts: Any) -> None:
        """For spawn and forkserver workers: refuse now what could not be sent to them."""
        method = self.start_method()
        if method in ("spawn", "forkserver"):
            from pipeflow.parallel.pools._fork import check_picklable

            for what, value in {**parts, "worker_init": self.worker_init}.items():
                if value is not None:
                    check_picklable(value, what, method, name)

    def describe(self, name: str, first: str) -> str:
        """``name(first, workers=..., ...)``: the settings that differ from their defaults."""
        from pipeflow.engine._stage import _short

        workers = "'auto'" if self.auto else self.workers
        shown = [first, f"workers={workers}", f"backend={self.backend!r}"]
        for key, default in _DEFAULTS.items():
            value = getattr(self, key)
            if value != default:
                shown.append(f"{key}={_short(value)}")
        shown.append(f"seed={self.seed}")
        return f"{name}({', '.join(shown)})"


_DEFAULTS = {
    "ordered": True,
    "max_in_flight": None,
    "mp_context": None,
    "worker_init": None,
    "timeout": None,
    "persistent": False,
    "round_robin": False,
    "rng_state": "torch",
    "restarts": 0,
    "ray_options": None,
}


def _check_mp_context(name: str, mp_context: Any, backend: Any) -> None:
    """*mp_context*: ``None``, a start method's name, or a multiprocessing context."""
    if mp_context is None:
        return
    if backend != "process":
        msg = f"{name}: mp_context applies to backend='process' only (got {mp_context!r})"
        raise ValueError(msg)
    if isinstance(mp_context, str):
        _checks.one_of(name, "mp_context", mp_context, multiprocessing.get_all_start_methods())
    elif not isinstance(mp_context, multiprocessing.context.BaseContext):
        msg = (
            f"{name}: mp_context must be a start method name or a multiprocessing context "
            f"(got {type(mp_context).__name__})"
        )
        raise TypeError(msg)


def settings(
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
    round_robin: Any = False,
    coroutines: bool = False,
    rng_state: Any = "torch",
    restarts: Any = 0,
    ray_options: Any = None,
) -> Settings:
    """Check the settings both parallel stages share; draw the seed when none is given. With
    *coroutines* (the function is a coroutine function) ``worker_init`` may be one too: the
    worker's event loop awaits it before its first item. ``workers="auto"``: see
    :func:`auto_cap`."""
    _check_backend(name, backend, coroutines)
    auto = isinstance(workers, str) and workers == "auto"
    workers = _workers(name, workers, backend, coroutines)
    _check_mp_context(name, mp_context, backend)
    return Settings(
        workers=workers,
        backend=backend,
        ordered=_checks.boolean(name, "ordered", ordered),
        max_in_flight=_checks.optional_integer(
            name, "max_in_flight", max_in_flight, low=1, high=sys.maxsize
        ),
        mp_context=mp_context,
        worker_init=(
            worker_init
            if coroutines and is_coroutine_function(worker_init)
            else _checks.function(name, "worker_init", worker_init, optional=True)
        ),
        timeout=_checks.seconds(name, "timeout", timeout),
        persistent=_checks.boolean(name, "persistent", persistent),
        seed=fresh_seed() if seed is None else check_seed(name, seed),
        round_robin=_checks.boolean(name, "round_robin", round_robin),
        coroutines=coroutines,
        rng_state=_checks.one_of(name, "rng_state", rng_state, KINDS),
        restarts=_restarts(name, restarts, backend),
        ray_options=check_ray_options(name, ray_options, backend),
        auto=auto,
    )


def _check_backend(name: str, backend: Any, coroutines: bool) -> None:
    """*backend*: one of :data:`BACKENDS`, and not Ray for a coroutine function."""
    _checks.one_of(name, "backend", backend, BACKENDS)
    if coroutines and backend == "ray":
        msg = (
            f"{name}: backend='ray' runs plain functions, one item at a time per actor (got a "
            "coroutine function); run coroutines on backend='thread' or 'process'"
        )
        raise ValueError(msg)


def _workers(name: str, workers: Any, backend: str, coroutines: bool) -> int:
    """*workers*, checked: a count, or ``"auto"`` (then the most the pool may hold)."""
    if isinstance(workers, str):
        if workers != "auto":
            msg = f"{name}: workers must be an integer or 'auto' (got {workers!r})"
            raise TypeError(msg)
        workers = auto_cap(backend, coroutines)
    return _checks.integer(name, "workers", workers, low=0, high=MAX_WORKERS)


def auto_cap(backend: str, coroutines: bool) -> int:
    """The most workers ``workers="auto"`` may give a pool: for threads
    :data:`~pipeflow.parallel._auto.AUTO_THREADS`; for processes, event loops and Ray actors
    the CPUs this process may run on (Ray's pool is sized to the cluster's free CPUs when it
    starts: see :func:`pipeflow.parallel.ray._ray.ray_pool`)."""
    if backend == "thread" and not coroutines:
        return AUTO_THREADS
    return cpus()


def check_auto(name: str, round_robin: Any) -> None:
    """``workers="auto"`` gives items to whichever worker is free: not with round robin,
    where item *k* is worker ``k % workers``'s and the count decides what each draws."""
    if round_robin is True:
        msg = (
            f"{name}: workers='auto' needs round_robin=False (got round_robin=True): with "
            "round robin, which worker gets each item (and so its global random draws) "
            "depends on the worker count, which auto changes while it runs"
        )
        raise ValueError(msg)


def _restarts(name: str, restarts: Any, backend: str) -> int:
    """``restarts``, checked: a count, for process workers and Ray actors only (a thread
    can't die alone)."""
    count = _checks.integer(name, "restarts", restarts, low=0, high=MAX_RESTARTS)
    if count and backend == "thread":
        msg = (
            f"{name}: restarts applies to backend='process' or 'ray' only (got "
            f"restarts={count} with backend={backend!r}): a thread worker can't die alone"
        )
        raise ValueError(msg)
    return count
