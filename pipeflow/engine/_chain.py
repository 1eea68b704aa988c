"""One pass of a loader: a loop over the stages, each iterator wrapped by the loader.

:func:`run` is the runner: ``it = stage.apply(it, context, hooks)`` for each stage of the
loader's plan (:mod:`pipeflow.engine._plan`: a computed source, then the stages that run on
items), with the wrappers of :mod:`pipeflow.engine._wrappers` around each iterator (error notes
and failure routing with the statistics' meter; resume cuts). What each stage is told comes
from :func:`_contexts`; where a resumed pass skips what was consumed, from
:func:`pipeflow.state.plan`. The consumer gets a :class:`~pipeflow.engine._wrappers.Pass`.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from pipeflow.engine._context import Context, Hooks
from pipeflow.engine._failure import Failure
from pipeflow.engine._memo import Decider, has_memo, merge, open_store, segments
from pipeflow.engine._plan import Computed, PassPlan
from pipeflow.engine._stage import context_after
from pipeflow.engine._wrappers import Meter, Pass, Route, close_all, cut, guarded, remembering
from pipeflow.errors import annotate
from pipeflow.resume.state import Plan, Progress, plan, through

__all__ = ["run"]


def run(
    planned: PassPlan,
    context: Context,
    resume: dict[str, Any],
    progress: Progress,
    record: Any,
    resources: dict[int, dict[Any, Any]],
    first: Callable[[Any], None] | None = None,
) -> Iterator[Any]:
    """Build the chain of iterators now (as torch does at ``iter()``); drive it later.

    *context* is the pass's (its epoch and base seed); *resources* what the loader keeps
    across passes for each of its stages, by their position in the loader; *first*, when
    given, sees the pass's first item before the consumer (the loader's hints).
    """
    contexts = _contexts(planned, context)
    skip = plan(planned.stages, _local(resume, planned.fused)) if resume else Plan()
    extras, cuts = dict(skip.extras), dict(skip.cut)
    saved = _local(resume, planned.fused).get("stages", {}) if resume else {}
    routes = _routes(planned, context.epoch)
    recs = record.stages if record is not None else [None] * len(routes)
    waits = record.waits if record is not None else None
    memos = segments(planned.stages)  # a cache's segment runs on the keys it lacks
    starts = {j: c for c, j in memos.items()}
    deciders: dict[int, Decider] = {}
    chain: list[Iterator[Any]] = []
    try:
        it = _source(planned, context, skip, recs[0], resources, resume, progress)
        if not planned.direct:
            it = _wrap(it, routes[0], recs[0], waits if not planned.stages else None)
        chain.append(it)
        for i, stage in enumerate(planned.stages):
            at = i + planned.fused  # the stage's position in the loader
            here = _placed(stage, _resumed(contexts[i], skip, i), at)
            upstream = chain[-1]
            if i in starts:  # the first stage of a cache's segment: it gets the misses
                c = starts[i]
                upstream = _decided(planned, c, i, upstream, context, deciders)
            keys = routes[i + 1].keys
            if stage.traits.dataset is not None and keys is not None:  # errors from here name them
                upstream = remembering(upstream, keys)
            ahead = any(s.resume.reads_ahead for s in planned.stages[i + 1 :])
            kept = _record(stage, here, saved.get(i), ahead, progress, at)  # for state_dict()
            watched(kept, planned.stages[i + 1 :], progress)
            hooks = Hooks(recs[i + 1], extras.get(i), kept, resources.setdefault(at, {}))
            it = merge(deciders[i], upstream) if i in memos else stage.apply(upstream, here, hooks)
            if i in cuts:
                it = cut(it, cuts[i])
            last = i == len(planned.stages) - 1
            chain.append(_wrap(it, routes[i + 1], recs[i + 1], waits if last else None))
    except Exception as e:
        annotate(e, routes[len(chain)].name, context.epoch)
        close_all(chain)
        raise
    return Pass(chain, progress, record, first)


def _placed(stage: Any, context: Context, at: int) -> Context:
    """*context*, telling a stage that runs caches inside it (a parallel map's workers) its
    place in the loader, which names their stores in every process."""
    if "memo" in context.facts and stage.traits.memo is None and has_memo((stage,)):
        return replace(context, facts={**context.facts, "memo_at": at})
    return context


def _decided(
    planned: PassPlan,
    c: int,
    j: int,
    keys: Iterator[Any],
    context: Context,
    deciders: dict[int, Decider],
) -> Iterator[Any]:
    """The input of the segment ``stages[j:c]`` of the cache at *c*: the *keys* its store
    lacks (its decider, kept in *deciders* for the cache's merge)."""
    stages = planned.stages
    memo = stages[c]
    slot = f"{c + planned.fused}"  # its place in the loader
    store = open_store(memo, stages[j:c], context.facts.get("memo"), slot)
    deciders[c] = Decider(keys, store, memo.name)
    return deciders[c].misses()


def _record(
    stage: Any, context: Context, saved: Any, ahead: bool, progress: Progress, at: int
) -> Any:
    """The stage's record for this pass, begun by its rule's record class (``state_dict()``
    reads it from *progress*), or ``None``; with a stage after it reading ahead, one that keeps
    snapshots keeps one after every item."""
    record = stage.resume.record
    kept = None if record is None else record.begin(stage, context, saved)
    if kept is not None:
        progress.deliveries[at] = kept
        if ahead:
            kept.read_ahead()
    return kept


def watched(record: Any, later: tuple[Any, ...], progress: Progress) -> None:
    """Tell a record that folds what the consumer had (a parallel stage's) how to know it:
    the outputs the consumer took, through the *later* stages (``None`` past one that is
    not a map or a batch)."""
    if record is None:
        return

    def consumed() -> int | None:
        return through(later, progress.delivered)

    record.watch(consumed)


def _source(
    planned: PassPlan,
    context: Context,
    skip: Plan,
    rec: Any,
    resources: dict[int, Any],
    resume: dict[str, Any],
    progress: Progress,
) -> Iterator[Any]:
    """The source's iterator, started where a resumed pass starts (from the source's record
    in the state, for a source that keeps one)."""
    source = planned.source
    start = skip.source_skip
    first = replace(context, start=start if source.resume.kind != "replay" else 0)
    if source.uses_hooks:  # it keeps a pool, or a record of its objects' states
        ahead = any(s.resume.reads_ahead for s in planned.stages)
        saved = resume.get("source")
        hooks = Hooks(rec, None, None, resources.setdefault(-1, {}), saved, ahead)
        it: Iterator[Any] = source.iterate(first, hooks)  # type: ignore[call-arg]
        progress.source = hooks.record
        watched(hooks.record, planned.stages, progress)
    else:
        it = source.iterate(first)
    if start and source.resume.kind == "replay":
        it = cut(it, start)
    if planned.direct and rec is not None:  # read unwatched: counted by what it has left
        rec.count_by_remaining(it)
    return it


def _wrap(it: Iterator[Any], route: Route, rec: Any, waits: Any) -> Iterator[Any]:
    """*it* inside the wrapper the loader puts around a stage: error notes and failure
    routing, with a meter for the statistics when they are recorded."""
    return guarded(it, route, Meter(rec, waits) if rec is not None else None)


def _routes(planned: PassPlan, epoch: int) -> list[Route]:
    """Per node of the pass (the source, then each stage): its notes and failure routing.

    Failures go around the stages that don't take them: set aside before the stage, out
    before its next item (see :mod:`pipeflow.engine._failure`).
    """
    stages = planned.stages
    stashes = [None if s.traits.failures == "pass" else deque[Failure]() for s in stages]
    routes = [Route(planned.source.name, epoch, stash=stashes[0] if stages else None)]
    keys: list[Any] | None = None  # after a dataset-reading stage: the key it read last
    for i, s in enumerate(stages):
        if s.traits.dataset is not None:
            keys = [None]
        stash = stashes[i + 1] if i + 1 < len(stages) else None
        divert = stash if s.traits.failures != "bypass" else None  # can its items be failures?
        routes.append(Route(s.name, epoch, keys, stashes[i], divert, stash))
    return routes


def _contexts(planned: PassPlan, context: Context) -> list[Context]:
    """Each running stage's context in a pass from the start of the epoch."""
    source, stages = planned.source, planned.stages
    for s in source.stages if isinstance(source, Computed) else ():
        context = context_after(s, context)  # a computed shard still numbers its outputs
    n = source.length()
    out = []
    for i, s in enumerate(stages):
        n = None if n is None else s.length(n)
        ignoring = tuple(t for later in stages[i + 1 :] for t in later.traits.drops)
        context = replace(context, total=n, ignoring=ignoring)
        out.append(context)
        context = replace(context_after(s, context), total=None)
    return out


def _resumed(context: Context, skip: Plan, i: int) -> Context:
    """Stage *i*'s context in a resumed pass: what it skipped, where it starts."""
    if not skip.offsets:
        return context
    return replace(context, offset=skip.offsets[i], start=dict(skip.start).get(i, 0))


def _local(resume: dict[str, Any], fused: int) -> dict[str, Any]:
    """*resume* with its stage records keyed by position among the running stages."""
    records = resume.get("stages", {})
    return {**resume, "stages": {k - fused: v for k, v in records.items()}}
