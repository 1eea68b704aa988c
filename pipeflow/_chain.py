"""One pass of a loader: chain the stages' generators, wrapped for statistics and error notes.

The runner is a loop over the stages (``it = stage.apply(it, context)``). Around each stage's
iterator sits one small generator, :func:`_watch`, that counts its items, times a sample of
them and names the stage in any exception that passes through it; :func:`_deliver` counts
what the consumer takes, for ``state_dict()``. Where a resumed pass skips what was consumed
comes from :func:`pipeflow.state.plan`.
"""

from __future__ import annotations

import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

from pipeflow._context import Context, Hooks
from pipeflow._failure import Failure
from pipeflow.errors import StageStuckError, annotate
from pipeflow.state import Progress, plan

__all__ = ["run"]

#: A fast stream has one item in about 64 timed, at irregular gaps (33 to 96 items, from a
#: small generator) so that a periodic cost is not always hit or always missed.
_GAP_MIN, _GAP_SPREAD = 33, 63
#: Items are timed in windows of this many timed items; the first window times every item.
_WINDOW = 256
#: A window whose items took less than this on average, none more than 8 times it, is
#: followed by a sampled one (two clock reads per item would then be a cost worth saving);
#: otherwise every item is timed: slow items, and fast ones with a heavy one among them
#: (a file read every 64 items), whose cost a sample would catch only by chance.
_TIME_ALL_NS = 20_000
#: The watchers write what they counted into the shared record this often.
_FLUSH_NS = 50_000_000
#: A stage whose exceptions wait in a stash (the next stage does not take failures) is asked
#: again at once; after this many in a row with no item, it is taken for stuck (an iterator
#: that raises on every next()) and its stream ends with a StageStuckError.
_STUCK = 1000


def run(
    source: Any,
    stages: tuple[Any, ...],
    *,
    epoch: int,
    base_seed: int | Callable[[], int] | None,
    resume: dict[str, Any],
    progress: Progress,
    record: Any,
    resources: dict[int, dict[Any, Any]],
) -> Iterator[Any]:
    """Build the chain of iterators now (as torch does at ``iter()``); drive it later."""
    contexts = _contexts(source, stages, epoch, base_seed)
    skip = plan(stages, contexts, resume) if resume else None
    recs = record.stages if record is not None else [None] * (len(stages) + 1)
    waits = record.waits if record is not None else None
    chain: list[Iterator[Any]] = []
    name = source.name
    try:
        seekable = source.positions() is not None
        skipped = skip.source_skip if skip is not None else 0
        first = Context(epoch, start=skipped if seekable else 0, base_seed=base_seed)
        if getattr(source, "uses_hooks", False):  # a parallel source: its pool is kept here
            hooks = Hooks(recs[0], None, None, resources.setdefault(-1, {}))
            it: Iterator[Any] = source.iterate(first, hooks)
        else:
            it = source.iterate(first)
        if skipped and not seekable:
            it = itertools.islice(it, skipped, None)
        # Failures go around the stages that don't take them: set aside by the watcher
        # before the stage, out before the stage's next item (see pipeflow._failure).
        stashes: list[deque[Failure] | None] = [
            None if s.failures == "pass" else deque() for s in stages
        ]
        first_stash = stashes[0] if stages else None
        waits0 = None if stages else waits
        chain.append(_watch(it, name, epoch, None, recs[0], waits0, None, None, first_stash))
        keys: list[Any] | None = None  # what the last dataset-reading stage was given
        cut = dict(skip.cut) if skip else {}
        starts = dict(skip.start) if skip else {}
        extras = dict(skip.extras) if skip else {}
        for i, s in enumerate(stages):
            name = s.name
            context = contexts[i]
            if skip is not None:
                positions = context.positions if i or not skip.source_skip else None
                context = replace(
                    context, offset=skip.offsets[i], start=starts.get(i, 0), positions=positions
                )
            upstream = chain[-1]
            if s.dataset is not None:  # the next stages' errors name the keys it read
                keys = [None]
                upstream = _remember(upstream, keys)
            kept = s.new_record(context, extras.get(i))  # what state_dict() will need
            if kept is not None:
                progress.deliveries[i] = kept
            hooks = Hooks(recs[i + 1], extras.get(i), kept, resources.setdefault(i, {}))
            it = s.apply(upstream, context, hooks)
            if i in cut:
                it = itertools.islice(it, cut[i], None)
            last = i == len(stages) - 1
            stash = None if last else stashes[i + 1]
            divert = stash if s.failures != "bypass" else None  # can its items be failures?
            waits_i = waits if last else None
            chain.append(
                _watch(it, name, epoch, keys, recs[i + 1], waits_i, stashes[i], divert, stash)
            )
    except Exception as e:
        annotate(e, name, epoch)
        _close_all(chain)
        raise
    return _Pass(chain, progress, record)


def _contexts(source: Any, stages: tuple[Any, ...], epoch: int, base_seed: Any) -> list[Context]:
    """Each stage's context in a pass from the start of the epoch."""
    n = source.length()
    context = Context(epoch, positions=source.positions(), base_seed=base_seed)
    out = []
    for i, s in enumerate(stages):
        n = None if n is None else s.length(n)
        ignoring = tuple(t for later in stages[i + 1 :] for t in later.drops_failures())
        context = replace(context, total=n, ignoring=ignoring)
        out.append(context)
        after = s.context_after(context)
        facts = after.facts
        if "input" in facts and facts["input"] is context.facts.get("input"):
            # facts["input"] describes the next stage's input only: a stage that did not
            # publish it anew passes its own input's description on to nobody.
            facts = {k: v for k, v in facts.items() if k != "input"}
        context = replace(after, positions=None, total=None, facts=facts)
    return out


class _Pass:
    """The consumer's iterator: the last stage's items, a failed one raised at its turn.

    A class, not a generator: a generator that raised is finished, and the next ``next()``
    must go on with the next item. Counts what it hands out for ``state_dict()``.
    """

    __slots__ = ("__weakref__", "chain", "closed", "progress", "pull", "record", "started")

    def __init__(self, chain: list[Iterator[Any]], progress: Progress, record: Any) -> None:
        self.chain = chain
        self.progress = progress
        self.record = record
        self.started = 0
        self.closed = False
        self.pull: Callable[[], Any] = self._first  # then the last stage's __next__

    def __iter__(self) -> _Pass:
        return self

    def _first(self) -> Any:
        self.started = time.perf_counter_ns()
        if self.record is not None:
            self.record.passes += 1
        self.pull = self.chain[-1].__next__
        return self.pull()

    def __next__(self) -> Any:
        try:
            item = self.pull()
        except StopIteration:
            if not self.closed:
                self.progress.done = True
                self.close()
            raise
        except BaseException:
            self.close()  # not a failed item: the pass itself broke (or Ctrl-C)
            raise
        self.progress.delivered += 1
        if item.__class__ is Failure:
            error = item.error
            # A stage's frame may still hold the failure: once raised, it must not keep the
            # exception (whose traceback holds the consumer's frames, and so this pass).
            item.error = _RAISED
            del item
            try:
                raise error
            finally:  # the traceback keeps this frame: it must not keep the pass alive
                del error, self
        return item

    def close(self) -> None:
        """Stop the pass: close every stage's iterator, release what they hold."""
        if self.closed:
            return
        self.closed = True
        self.pull = _ended
        if self.started and self.record is not None:
            self.record.wall_ns += time.perf_counter_ns() - self.started
        _close_all(self.chain)

    def __del__(self) -> None:
        self.close()


_RAISED = RuntimeError("this failure was raised in the consumer already")


def _ended() -> Any:
    raise StopIteration


def _close_all(chain: list[Iterator[Any]]) -> None:
    for link in reversed(chain):
        close = getattr(link, "close", None)
        if close is not None:
            try:
                close()
            except ValueError as e:  # running in another thread right now (a thread worker's
                if "already executing" not in str(e):  # replica): it ends there on its own
                    raise


def _watch(
    it: Iterator[Any],
    name: str,
    epoch: int,
    keys: list[Any] | None,
    rec: Any,
    waits: Any,
    bypassed: deque[Failure] | None,
    divert: deque[Failure] | None,
    stash: deque[Failure] | None,
) -> Iterator[Any]:
    """Pass a stage's items on: count them, time a sample, turn an exception into a failure.

    An item's time runs from the moment the stage below asks for it until it is handed over.
    Items are timed in windows of ``_WINDOW`` timed items: the first window times every item;
    after a window whose items took less than ``_TIME_ALL_NS`` on average and none more than 8
    times that, about one item in 64 is timed, standing for the items since the last one
    timed. So slow items (batches) are all timed, and fast ones (indices) cost a count and a
    test each.

    An exception from the stage gets a note naming the stage (after a dataset-reading stage,
    *keys* holds the key it read last: the note names those sample indices) and goes on as a
    :class:`~pipeflow._failure.Failure`; then the stage is asked for its next item (a
    ``map`` goes on, a generator that raised is finished). Failures that went around this
    stage (*bypassed*) go out before its next item. When the next stage does not take
    failures, they go to its *stash* instead of to it: *divert* is that stash when this stage
    can yield failures as items, ``None`` when it never does (no test per item then).
    """
    n = 0  # items handed on (a failure is one)
    clock = time.perf_counter_ns
    busy = 0  # estimated ns, not yet written to the record
    flushed = 0
    gap = 1  # the items the next timed one stands for: 1 while every item is timed
    sampling = False
    window = window_ns = window_max = 0  # timed items (their time, the longest) this window
    lcg = 12345  # the gaps' generator
    stuck = after_failure = 0  # exceptions in a row with no item between; n after the last
    mark = 0 if rec is not None else -1  # the number of the next item to time
    t = clock()
    next_flush = t + _FLUSH_NS
    try:
        while True:
            try:
                for item in it:
                    if n == mark:  # asked for at t
                        now = clock()
                        span = now - t
                        busy += span * gap
                        if waits is not None:
                            waits.append(span)
                        window += 1
                        window_ns += span
                        window_max = max(window_max, span)
                        if window == _WINDOW:  # sample the next window if these were fast
                            sampling = (
                                window_ns < _TIME_ALL_NS * _WINDOW and window_max < 8 * _TIME_ALL_NS
                            )
                            window = window_ns = window_max = 0
                        if now >= next_flush:
                            rec.busy_ns += busy
                            rec.items += n + 1 - flushed
                            busy, flushed, next_flush = 0, n + 1, now + _FLUSH_NS
                            rec.sample(now)
                        if sampling:
                            lcg = (lcg * 1103515245 + 12345) & 0x7FFFFFFF
                            gap = _GAP_MIN + (lcg >> 16) % _GAP_SPREAD
                        mark = n + gap
                    n += 1
                    if bypassed:  # failures that went around this stage come first
                        yield from _release(bypassed, stash)
                    if divert is not None and item.__class__ is Failure:
                        divert.append(item)
                    else:
                        yield item
                    if n == mark:  # the next item is timed: from when it is asked for
                        t = clock()
                break
            except Exception as e:
                key = keys[0] if keys is not None else None
                if type(key) is list:
                    annotate(e, name, epoch, batch=key)
                elif key is not None:
                    annotate(e, name, epoch, index=key)
                else:
                    annotate(e, name, epoch, item=n)
                indices = key if type(key) is list else [] if key is None else [key]
                failure = Failure(e, indices)
                stuck = stuck + 1 if n == after_failure else 1  # no item since the last one?
                n += 1
                after_failure = n
                if stash is not None:
                    stash.append(failure)
                    if stuck == _STUCK:
                        stash.append(_stuck(e, name, epoch))
                        break
                else:
                    yield failure
                if rec is not None:  # time the next item afresh
                    gap, mark, t = 1, n, clock()
        if bypassed:
            yield from _release(bypassed, stash)
        if n == mark:  # the end of the stream was asked for at t
            busy += clock() - t
    finally:
        if rec is not None:
            rec.busy_ns += busy
            rec.items += n - flushed
            rec.sample(clock())


def _stuck(error: BaseException, name: str, epoch: int) -> Failure:
    msg = (
        f"stage {name!r} raised {_STUCK} times in a row without yielding an item, and the "
        "next stage takes no failures: the pass ends here (is an iterator raising on every "
        "next()?); the last error is the cause"
    )
    stuck = StageStuckError(msg)
    stuck.__cause__ = error
    annotate(stuck, name, epoch)
    return Failure(stuck, [])


def _release(bypassed: deque[Failure], stash: deque[Failure] | None) -> Iterator[Failure]:
    """The failures that went around a stage: on to the next stash, or out."""
    while bypassed:
        failure = bypassed.popleft()
        if stash is not None:
            stash.append(failure)
        else:
            yield failure


def _remember(keys: Iterator[Any], cell: list[Any]) -> Iterator[Any]:
    for key in keys:
        cell[0] = key
        yield key
