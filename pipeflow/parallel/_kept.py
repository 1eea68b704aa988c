"""The pool a pass runs on: which one a stage's settings ask for (:func:`make_pool`), and the
one a parallel stage keeps between a loader's passes (``persistent=True``)."""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import threading
import weakref
from collections.abc import Callable, Mapping
from typing import Any

from pipeflow.parallel._settings import MAX_WORKERS, Settings
from pipeflow.parallel.pools._reap import join_all

__all__ = ["TRIM_AFTER", "Kept", "make_pool"]


def make_pool(
    config: Settings, job: Any, name: str, base_seed: int, restores: list[Any] | None = None
) -> Any:
    """Start a pool of *config*'s backend (its workers start lazily): worker processes,
    threads, event loops (in threads of this process, or one in each worker process), or
    Ray actors.
    *restores*: what each worker restores once started (a resumed pass), by worker id."""
    from pipeflow.parallel.pools._worker import WorkerSpec

    # The global generators are a worker's own only in a process, and reproducible only
    # where which worker gets which item does not depend on timing (round robin).
    own = config.backend in ("process", "ray")  # a worker process, or a Ray actor's
    rng = config.rng_state if own and config.round_robin else None
    spec = WorkerSpec(
        job, 0, config.workers, base_seed, config.worker_init, rng_state=rng, restore=restores
    )
    if config.backend == "ray":
        from pipeflow.parallel.ray._ray import free_actors, ray_pool

        if config.auto:  # an actor per free CPU of the cluster, now
            count = min(free_actors(config.ray_options), MAX_WORKERS)
            spec = spec._replace(num_workers=count)
        return ray_pool(spec, config, name)
    if config.backend == "process":
        from pipeflow.parallel.pools._processes import ProcessPool
        from pipeflow.parallel.pools._warm import warm_context

        mp = config.mp_context
        given = mp if isinstance(mp, multiprocessing.context.BaseContext) else None
        context = warm_context(given or multiprocessing.get_context(mp))
        if not config.coroutines:
            pool = ProcessPool(
                spec,
                name=name,
                round_robin=config.round_robin,
                context=context,
                restarts=config.restarts,
            )
            pool.skip_full = config.round_robin and not config.ordered
            return pool
        from pipeflow.parallel.pools._aio_worker import aio_process_main

        return ProcessPool(
            spec,
            name=name,
            round_robin=config.round_robin,
            context=context,
            target=aio_process_main,
            concurrent=True,
            restarts=config.restarts,
        )
    if config.coroutines:
        from pipeflow.parallel.pools._aio import LoopPool

        return LoopPool(spec, name=name, round_robin=config.round_robin)
    from pipeflow.parallel.pools._threads import ThreadPool

    return ThreadPool(spec, name=name, round_robin=config.round_robin)


#: How long a kept pool may sit idle between passes before it gives back the memory it keeps
#: for reuse (``end_pass``): epochs in a row reuse it; a pause (a validation loop, the end of
#: training with the loader still open) returns it. Making it again costs about what a pass
#: of that size costs to fill (fresh pages are zeroed): a few seconds keep that small next to
#: the pause (at 1 s, a benchmark that ran torch's epochs between pipeflow's paid it often).
TRIM_AFTER = 5.0


class Kept:
    """A persistent pool, kept by the loader between its passes; and which pool each pass
    runs on."""

    __slots__ = ("busy", "facts", "passes", "pool", "timer")

    def __init__(self) -> None:
        self.pool: Any = None
        self.busy = False
        self.facts: Any = None
        self.timer: threading.Timer | None = None  # the pool's end_pass, TRIM_AFTER from now
        # The pool each running pass borrowed, by the pass's epoch (kept or not): what
        # pf.DataLoader's iterator shows as its `_workers`.
        self.passes: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def borrow(
        self, config: Settings, make: Callable[[], Any], facts: Any = None
    ) -> tuple[Any, bool]:
        """The pool for one pass, and whether it is the kept one (else close it after).

        A second pass running while the first is (``zip(loader, loader)``) gets its own; so
        does a pass told other *facts* (which the workers' job holds) than the kept pool's.
        """
        if not config.persistent or self.busy:
            return make(), False
        self._cancel_trim()  # a pass follows at once: what the pool kept is reused
        other = not config.auto and self.pool is not None and self.pool.workers != config.workers
        if self.pool is not None and (
            self.pool.closed or self.pool.broken or self.facts != facts or other
        ):
            self._drop()
        self.facts = facts
        if self.pool is None:
            self.pool = make()
        self.busy = True
        return self.pool, True

    def give_back(self, pool: Any, borrowed: bool) -> None:
        if not borrowed:
            pool.close()
            return
        self.busy = False
        if pool.broken:  # a worker died or timed out: not kept
            self._drop()
        elif pool.trims:  # what it keeps for reuse goes back unless a pass follows soon
            self.timer = threading.Timer(TRIM_AFTER, pool.end_pass)
            self.timer.daemon = True
            self.timer.name = f"pipeflow-trim-{pool.name}"
            self.timer.start()

    def _cancel_trim(self) -> None:
        """Stop the pending trim, or wait for it to end when it has begun."""
        timer, self.timer = self.timer, None
        if timer is not None:
            timer.cancel()
            timer.join()

    def close(self) -> None:
        """Stop the kept pool and return once its workers have exited (``loader.close()``:
        then every page of /dev/shm they held is free). The end of a pass does not wait."""
        if self._drop():
            join_all()

    def _drop(self) -> bool:
        """Stop the kept pool, its workers' exit left to the reaper; whether there was one."""
        self._cancel_trim()
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()
        return pool is not None


def pass_pool(resources: Mapping[Any, Mapping[Any, Any]], epoch: int) -> Any:
    """The pool the loader's pass of *epoch* runs on (its first parallel stage's), or
    ``None`` (no parallel stage, or the pass has not started it yet, or it is gone)."""
    for key in sorted(resources):
        kept = resources[key].get("pool")
        if isinstance(kept, Kept):
            pool = kept.passes.get(epoch)
            if pool is not None:
                return pool
    return None
