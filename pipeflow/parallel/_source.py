"""``parallel_source``: a copy of a loader in each worker, their items interleaved."""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterator, Mapping
from itertools import islice
from typing import Any, TypeVar

from pipeflow.engine._context import Context, Hooks
from pipeflow.engine.loader import Loader, Source
from pipeflow.parallel._auto import Tuner, cpus
from pipeflow.parallel._records import SourceRecord
from pipeflow.parallel._run import run_parallel
from pipeflow.parallel._settings import MAX_WORKERS, Settings, settings
from pipeflow.parallel.pools._worker import SourceJob
from pipeflow.parallel.transport._wire import PassNote
from pipeflow.resume.state import Rule

__all__ = ["parallel_source"]

_PASSES = itertools.count(1)  # each pass's key: a worker's replica starts a pass when it changes

T = TypeVar("T")


def _identity(source: _ParallelSource) -> list[str]:
    """What a state compares: the loader each worker runs and the delivery order, not the
    runtime knobs (the worker count is checked with the source's record)."""
    from pipeflow.resume.state import fingerprint

    order = "" if source.config.ordered else ", ordered=False"
    inner = " | ".join(fingerprint(source.loader.source, source.loader.stages))
    return [f"parallel_source({inner}{order})"]


class _ParallelSource(Source[Any]):
    name = "parallel_source"
    uses_hooks = True  # its persistent pool is kept by the loader, between passes
    #: A resumed pass's workers each resume their replica where the record says; a state
    #: that consumed some of its items holds each worker's count.
    resume = Rule.recorded(SourceRecord, must_hold=True, identity=_identity)

    def __init__(self, loader: Loader[Any], config: Settings) -> None:
        self.loader = loader
        self.config = config

    def iterate(self, context: Context, hooks: Hooks | None = None) -> Iterator[Any]:
        hooks = hooks or Hooks()
        config, tuner = self.config, None
        if config.auto:
            config, tuner = _sized(config, hooks)
        _even_batches(self.loader, config.workers, when_built=False)
        job = SourceJob(self.loader, "parallel_source")
        # Read now, as the pass starts (not at its first item): what this pass tells workers.
        tell = getattr(self.loader.source, "pass_note", None)
        note = PassNote(tell() if tell is not None else None, next(_PASSES))
        record = SourceRecord(config, context.start, hooks.saved)
        hooks.record = record
        it = run_parallel(job, config, "parallel_source", None, context, hooks, note)
        if tuner is not None:
            it = _claimed(it, tuner)
            if hooks.stats is not None:
                hooks.stats.auto, hooks.stats.auto_base = tuner, tuner.capacity()
        if context.start and hooks.saved is None:  # no record: the items are read again
            return islice(it, context.start, None)
        return _naming_positions(it, record, self.loader)

    def describe(self) -> str:
        return self.config.describe("parallel_source", repr(self.loader))

    def seed_slots(self) -> list[tuple[str, int]]:
        """The seeds of the loader each worker runs, then the workers' seed: drawn ones
        travel in a state like any stage's (see :mod:`pipeflow.resume._seeds`)."""
        workers = [("parallel_source" + name, seed) for name, seed in self.config.seed_slots()]
        return [*self.loader.seed_slots(), *workers]

    def with_seeds(self, seeds: Iterator[int]) -> _ParallelSource:
        """This source with its seeds taken in order from *seeds* (as :meth:`seed_slots`)."""
        loader = self.loader.with_seeds(seeds)
        config = self.config.with_seeds(seeds)
        if loader is self.loader and config is self.config:
            return self
        return _ParallelSource(loader, config)


def _sized(config: Settings, hooks: Hooks) -> tuple[Settings, Tuner]:
    """``workers="auto"``: this pass's settings, with the count the stage took at its first
    pass (one worker per CPU the budget leaves it), or the count a resumed state's record
    was taken with (each worker resumes its own replica).

    A stream is split by worker, so another count is another interleaving of its items: a
    count measured between passes would make the passes after a resumed one differ from the
    uninterrupted run's. So the count is chosen once, and kept."""
    tuner: Tuner | None = hooks.resources.get("auto")
    if tuner is None:
        why = "one per CPU: a stream's split is by worker, so the count is chosen once"
        start = min(cpus(), config.workers)
        if config.backend == "ray":  # an actor per free CPU of the cluster
            from pipeflow.parallel.ray._ray import free_actors

            start = min(free_actors(config.ray_options), MAX_WORKERS)
            why = why.replace("one per CPU", "one per free CPU of the Ray cluster")
        tuner = config.tuner(max(start, config.workers), start, why)
        tuner.count = min(tuner.count, tuner.room())
        hooks.resources["auto"] = tuner
    if isinstance(hooks.saved, dict) and isinstance(hooks.saved.get("workers"), dict):
        tuner.count = len(hooks.saved["workers"])  # checked when the state was loaded
    tuner.claim()  # until the pass ends (_claimed)
    return dataclasses.replace(config, workers=tuner.count, auto=False), tuner


def _claimed(items: Iterator[Any], tuner: Tuner) -> Iterator[Any]:
    """*items*; then the pass's processes go back to the budget."""
    try:
        yield from items
    finally:
        tuner.end()


def _naming_positions(
    it: Iterator[Any], record: SourceRecord, loader: Loader[Any]
) -> Iterator[Any]:
    """*it*'s items; a worker's death names where that worker stood in its stream (the
    shard and sample its reader had reached), which the rest of its share starts from."""
    from pipeflow.errors import WorkerDiedError, _add_note
    from pipeflow.parallel.pools._threads import DIED

    made = 0
    try:
        for item in it:
            made += 1
            yield item
    except BaseException as e:
        # a worker process's death, or the error a worker thread died of
        worker = e.worker if isinstance(e, WorkerDiedError) else getattr(e, DIED, None)
        if isinstance(worker, int):
            try:
                state = record.states.after(made).get(worker, {}).get("state") or {}
                where = stream_position(loader, state.get("replica"))
            except Exception:  # naming where it stood must not hide the error itself
                where = ""
            if where:
                note = (
                    f"pipeflow: parallel_source worker {worker} had delivered {where}; the "
                    "rest of its share of the epoch was not delivered (a state taken before "
                    "this error resumes there)"
                )
                _add_note(e, note)
        raise


def stream_position(loader: Loader[Any], replica: Any) -> str:
    """Where a worker's replica stands, in the words of its readers' records: "4 samples of
    'train-0003.tar' (its sample 4 next at byte 8192)", or ``""`` when no reader says."""
    from pipeflow.sources.shards import relative_names

    kept = replica.get("stages") if isinstance(replica, dict) else None
    urls = getattr(loader.source, "urls", None)
    for record in (kept or {}).values():
        if not isinstance(record, dict) or "inputs" not in record:
            continue
        shard = record.get("shard") or {}
        number = shard.get("number")
        if urls is not None and isinstance(number, int) and 0 <= number < len(urls):
            name = repr(relative_names(urls)[number])
        else:
            name = (
                repr(shard["url"]) if "url" in shard else f"shard {record['inputs']} of its share"
            )
        if not record.get("start"):
            return f"{record['inputs']} whole shards of its share (its next shard not begun)"
        at = f" at byte {record['offset']}" if "offset" in record else ""
        return f"{record['start']} samples of {name} (its sample {record['start']} next{at})"
    return ""


#: The stages that group items into batches: inside workers, each groups its own share.
_GROUPING = ("batch", "bucket", "pack")


def _even_batches(loader: Loader[Any], workers: int, *, when_built: bool) -> None:
    """Refuse batching inside several workers over shards that promise every rank the same
    number of samples (``balance="pad"`` or ``"drop"`` across ranks): each worker batches
    its own share, ending in a partial batch of its own, and the shares differ from rank to
    rank, so ranks would make different numbers of batches and DDP would wait forever on the
    rank that runs out first. Checked when built where the world size is given, else as
    each pass starts (when torch.distributed or ``WORLD_SIZE`` tell it)."""
    from pipeflow.sources.shards import _Shards
    from pipeflow.stages.distributed import rank_and_world_size

    source = loader.source
    grouping = [s.name for s in loader.stages if getattr(s, "name", None) in _GROUPING]
    if workers < 2 or not grouping or not isinstance(source, _Shards):
        return
    balance, world = source.config["balance"], source.config["world_size"]
    if world is None and not when_built:
        world = rank_and_world_size()[1]
    if balance == "shards" or world is None or world < 2:
        return
    msg = (
        f"parallel_source: {grouping[0]} runs inside the {workers} workers, over shards split "
        f"across {world} ranks with balance={balance!r}: every rank reads the same number of "
        "samples, but each worker batches its own share and ends with a partial batch of its "
        "own, so ranks would make different numbers of batches and a DDP job would wait "
        f"forever on the rank that runs out first. Batch after the workers: "
        f"pf.parallel_source(pf.shards(...) | pf.read_tar() | ..., workers={workers}) | "
        f"pf.{grouping[0]}(...); or deal whole shards (balance='shards') and join the ranks "
        "(torch.distributed.algorithms.Join)"
    )
    raise ValueError(msg)


def _split_once(loader: Loader[Any]) -> None:
    """Refuse a loader with two ``shard`` stages: in a worker, each would take a worker's
    share of what the one before kept."""
    from pipeflow.stages.distributed import is_shard

    shards = [s for s in loader.stages if is_shard(s)]
    if len(shards) > 1:
        msg = (
            f"parallel_source: loader must split by worker once, but it has {len(shards)} "
            f"shard stages ({', '.join(map(repr, shards))}); in a worker each would keep a "
            "worker's share of what the one before kept, losing the rest of the epoch. Keep "
            "one shard inside (it splits by rank and worker), or put the others after "
            "parallel_source"
        )
        raise ValueError(msg)


def parallel_source(
    loader: Loader[T],
    *,
    workers: int | str,
    backend: str = "process",
    ordered: bool = True,
    max_in_flight: int | None = None,
    mp_context: Any = None,
    worker_init: Callable[[int], Any] | None = None,
    timeout: float | None = None,
    persistent: bool = False,
    seed: int | None = None,
    rng_state: str | None = "torch",
    ray_options: Mapping[str, Any] | None = None,
) -> Loader[T]:
    """Run a copy of *loader* in each worker and interleave their outputs, round-robin.

    This is how torch's ``DataLoader`` runs an ``IterableDataset`` with workers: each worker
    iterates its own replica, so each replica must read only its share. The split by worker
    happens once, in one of two places:

    - the source splits itself by :func:`~pipeflow.get_worker_info` (or
      ``torch.utils.data.get_worker_info``, which answers in process workers only: a torch
      ``IterableDataset`` in thread workers that did not ask pipeflow's raises
      :class:`~pipeflow.errors.StreamNotSplitError` with its first item, instead of every
      thread reading the whole stream), as torch's documentation teaches; or
    - a :func:`~pipeflow.shard` in *loader* splits the stream by rank and worker together
      (``world_size * workers`` shares), over a source that reads everything.

    Never both: a ``shard`` after a source that read ``get_worker_info().num_workers`` in
    the same worker raises :class:`~pipeflow.errors.SplitTwiceError` instead of keeping a
    fraction of the worker's share, and a *loader* with two ``shard`` stages is refused here.
    With ``ordered=True`` the items come worker 0, worker 1, ..., worker 0, ...; a worker
    that runs out drops out of the rotation. Arguments as for :func:`parallel_map`, except
    that *backend* defaults to ``"process"``: each worker runs a whole copy of a stream, as
    torch's ``DataLoader`` runs an ``IterableDataset`` in worker processes (``parallel_map``,
    whose usual work is I/O or decoding, defaults to threads).

    ``workers="auto"`` takes one worker per CPU (within the budget :func:`parallel_map`
    describes) when the loader first runs, and keeps that count: the stream is split by
    worker, so another count is another interleaving, and a count measured between passes
    would make the passes after a resumed one differ from the uninterrupted run's. A state
    records the count, and a resumed pass takes it again.

    A worker process that dies ends the pass with :class:`~pipeflow.WorkerDiedError` (its
    replica's stream can't be taken up where it stopped, so there is no ``restarts``), and
    :func:`~pipeflow.ignore_errors` never drops it, nor an error that ended a replica's
    stream: the items the replica would have made after it were never made.

    Examples:
        >>> import pipeflow as pf
        >>> class Shard:
        ...     def __iter__(self):
        ...         info = pf.get_worker_info()
        ...         start, step = (0, 1) if info is None else (info.id, info.num_workers)
        ...         return iter(range(start, 7, step))
        ...
        >>> list(pf.parallel_source(pf.from_iterable(Shard()), workers=2, backend="thread"))
        [0, 1, 2, 3, 4, 5, 6]
        >>> list(pf.parallel_source(pf.indices(7) | pf.shard(0, 1), workers=2, backend="thread"))
        [0, 1, 2, 3, 4, 5, 6]
        >>> list(pf.parallel_source(pf.from_iterable(Shard()) | pf.shard(0, 1), workers=2,
        ...                         backend="thread"))
        Traceback (most recent call last):
        ...
        pipeflow.errors.SplitTwiceError: shard: in parallel_source worker 0 of 2, the source ...
    """
    if not isinstance(loader, Loader):
        msg = f"parallel_source: loader must be a pipeflow loader (got {type(loader).__name__})"
        raise TypeError(msg)
    _split_once(loader)
    _even_batches(loader, workers if isinstance(workers, int) else 0, when_built=True)
    config = settings(
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
        round_robin=True,
        rng_state=rng_state,
        ray_options=ray_options,
    )
    config.check_picklable("parallel_source", loader=loader)
    return Loader(_ParallelSource(loader, config))
