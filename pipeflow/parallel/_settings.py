"""The settings both parallel stages share: checked once, shown in reprs (the pool they ask
for is built by :func:`pipeflow.parallel._kept.make_pool`)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import sys
from dataclasses import dataclass
from typing import Any

from pipeflow import _checks
from pipeflow._context import Context
from pipeflow._coroutines import is_coroutine_function
from pipeflow._random import WORKERS, check_seed, derive, fresh_seed

__all__ = ["COROUTINES_PER_WORKER", "MAX_RESTARTS", "Settings", "settings"]

#: The default bound on coroutines in flight, per event loop: I/O waits, so many at once.
COROUTINES_PER_WORKER = 64
#: The most worker restarts a pass may allow: a bound, not a way to loop on crashes forever.
MAX_RESTARTS = 1_000


@dataclass(frozen=True)
class Settings:
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
    #: Process workers that may die in one pass and be replaced, their items sent again.
    restarts: int = 0

    @property
    def in_flight(self) -> int:
        """The bound on items running at once: *max_in_flight*, by default twice the workers
        (:data:`COROUTINES_PER_WORKER` times the workers for a coroutine function). Items out
        (sent, not yet consumed) are bounded by the pool's ``backlog`` of it: the same, or
        twice as many for event loops in threads."""
        return (
            self.max_in_flight or (COROUTINES_PER_WORKER if self.coroutines else 2) * self.workers
        )

    def base_seed(self, context: Context) -> int:
        """The workers' base seed for this pass: the caller's, else from (seed, epoch)."""
        if callable(context.base_seed):
            return context.base_seed()
        if context.base_seed is not None:
            return context.base_seed
        return derive(self.seed, WORKERS, context.epoch) >> 1  # 63 bits, as torch's seeds

    def describe(self, name: str, first: str) -> str:
        """``name(first, workers=..., ...)``: the settings that differ from their defaults."""
        from pipeflow._stage import _short

        shown = [first, f"workers={self.workers}", f"backend={self.backend!r}"]
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
    "restarts": 0,
}


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
    restarts: Any = 0,
) -> Settings:
    """Check the settings both parallel stages share; draw the seed when none is given. With
    *coroutines* (the function is a coroutine function) ``worker_init`` may be one too: the
    worker's event loop awaits it before its first item."""
    workers = _checks.integer(name, "workers", workers, low=0)
    _checks.one_of(name, "backend", backend, ("thread", "process"))
    if mp_context is not None:
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
        restarts=_restarts(name, restarts, backend),
    )


def _restarts(name: str, restarts: Any, backend: str) -> int:
    """``restarts``, checked: a count, for process workers only (a thread can't die alone)."""
    count = _checks.integer(name, "restarts", restarts, low=0, high=MAX_RESTARTS)
    if count and backend != "process":
        msg = (
            f"{name}: restarts applies to backend='process' only (got restarts={count} "
            f"with backend={backend!r}): a thread worker can't die alone"
        )
        raise ValueError(msg)
    return count
