"""What the loader stacks around each stage's iterator in a pass: one wrapper per concern.

The runner (:mod:`pipeflow.engine._chain`) is a loop, ``it = stage.apply(it, context)``; around each
stage's iterator it stacks, innermost first:

- :func:`guarded` — error notes and failure routing: an exception from the stage gets a note
  naming the stage (and the sample indices, after a ``fetch``) and goes on as a
  :class:`~pipeflow.engine._failure.Failure` in the item's place; failures that the next stage does
  not take go around it (see :class:`Route`). When the loader records statistics, a
  :class:`Meter` rides in its loop: it counts every item and times a sample of them.
- :func:`cut` — resumption: drops the outputs a resumed pass replayed (only on such a pass).

and :func:`remembering` after a dataset-reading stage's input, so that errors name the keys.
Outermost, the consumer holds a :class:`Pass`: it raises a failed item at its turn and counts
what it hands out for ``state_dict()``.
Each can be read, named and removed alone. The meter is not a generator of its own because a
generator step per item per stage is the cost that matters for fast items: stacked as a
wrapper of its own it took 24% off a per-sample pipeline's rate (``from_iterable | map |
map``, 3.3 million items/s with the meter in the loop, 2.5 million with a wrapper).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from pipeflow.engine._failure import ENDED, Failure
from pipeflow.errors import StageStuckError, annotate
from pipeflow.resume.state import Progress

__all__ = ["Meter", "Pass", "Route", "close_all", "cut", "guarded", "remembering"]

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
#: A timed item longer than this is slow beside fast ones: a sampled one stands for itself.
_SPIKE_NS = 8 * _TIME_ALL_NS
#: Fast windows in a row before sampling: at first (so a cost every 1,000 items is seen and
#: every item stays timed), and at most (each sampled spike doubles it).
_CALM_MIN, _CALM_MAX = 4, 64
#: The statistics wrapper writes what it counted into the shared record this often.
_FLUSH_NS = 50_000_000
#: A stage whose exceptions wait in a stash (the next stage does not take failures) is asked
#: again at once; after this many in a row with no item, it is taken for stuck (an iterator
#: that raises on every next()) and its stream ends with a StageStuckError.
_STUCK = 1000

_clock = time.perf_counter_ns
#: Each meter's own sequence of gaps: a stage times other items than the stage above it,
#: whose timed spans would otherwise hold this stage's bookkeeping (and stand for 64 items).
_meters = itertools.count()


@functools.cache
def _null_span() -> int:
    """What timing an item adds to its span (ns): a clock read and a method call, about
    80 ns here; taken off each span, since a sampled span stands for up to 96 items."""
    probe = _Probe()
    spans = sorted(probe.took(_clock()) for _ in range(400))
    return spans[len(spans) // 10]


class _Probe:
    def took(self, asked: int) -> int:
        now = _clock()
        return now - asked


@dataclass
class Route:
    """Where failures go around one stage (see :mod:`pipeflow.engine._failure`).

    Attributes:
        name: the stage's name, for notes.
        epoch: the pass's epoch, for notes.
        keys: after a dataset-reading stage, a one-item list holding the key it read last
            (the note names those sample indices); ``None`` elsewhere.
        bypassed: failures that went around this stage: out before its next item.
        divert: where this stage's failed items go instead of into the next stage (that
            stage's stash), or ``None`` when they go on (or the stage never yields any).
        stash: where this stage's own exceptions go when the next stage takes no
            failures; ``None``: they go on as items.
    """

    name: str
    epoch: int
    keys: list[Any] | None = None
    bypassed: deque[Failure] | None = None
    divert: deque[Failure] | None = None
    stash: deque[Failure] | None = None


def guarded(it: Iterator[Any], route: Route, meter: Meter | None = None) -> Iterator[Any]:
    """Pass a stage's items on; turn its exceptions into failures, routed by *route*.

    After an exception the stage is asked for its next item (a ``map`` goes on; a generator
    that raised is finished and ends the stream). *meter*, when statistics are recorded,
    counts the items and times a sample of them: it rides in this loop, at two tests per
    item, because a generator of its own would cost a fast stage a quarter of its rate.
    """
    bypassed, divert, stash = route.bypassed, route.divert, route.stash
    took = meter.took if meter is not None else None
    n = 0  # items handed on (a failure is one)
    mark = 0 if meter is not None else -1  # the number of the next item to time
    t = _clock()  # when the item being timed was asked for
    stuck = after_failure = 0  # exceptions in a row with no item between; n after the last
    try:
        while True:
            try:
                for item in it:
                    if n == mark:  # asked for at t
                        mark = took(n, t)  # type: ignore[misc]
                    n += 1
                    if bypassed:  # failures that went around this stage come first
                        yield from _release(bypassed, stash)
                    if divert is not None and item.__class__ is Failure:
                        divert.append(item)
                    else:
                        yield item
                    if n == mark:  # the next item is timed: from when it is asked for
                        t = _clock()
                break
            except Exception as e:
                failure = _failure(e, route, n)
                failure.ends = getattr(it, "gi_frame", True) is None  # a finished generator
                stuck = stuck + 1 if n == after_failure else 1  # no item since the last one?
                n = after_failure = n + 1
                if meter is not None:  # time the next item afresh
                    mark, t = meter.restart(n), _clock()
                if stash is None:
                    yield failure
                    continue
                stash.append(failure)
                if stuck == _STUCK:
                    stash.append(_stuck(e, route))
                    break
        if bypassed:
            yield from _release(bypassed, stash)
    finally:
        if meter is not None:
            meter.done(n, t if n == mark else None)


def _failure(error: Exception, route: Route, n: int) -> Failure:
    """*error* as a failure, with a note naming the stage and what it was working on."""
    key = route.keys[0] if route.keys is not None else None
    if type(key) is list:
        annotate(error, route.name, route.epoch, batch=key)
    elif key is not None:
        annotate(error, route.name, route.epoch, index=key)
    else:
        annotate(error, route.name, route.epoch, item=n)
    return Failure(error, key if type(key) is list else [] if key is None else [key])


def _stuck(error: BaseException, route: Route) -> Failure:
    msg = (
        f"stage {route.name!r} raised {_STUCK} times in a row without yielding an item, and "
        "the next stage takes no failures: the pass ends here (is an iterator raising on "
        "every next()?); the last error is the cause"
    )
    stuck = StageStuckError(msg)
    stuck.__cause__ = error
    annotate(stuck, route.name, route.epoch)
    return Failure(stuck, [])


def _release(bypassed: deque[Failure], stash: deque[Failure] | None) -> Iterator[Failure]:
    """The failures that went around a stage: on to the next stash, or out."""
    while bypassed:
        failure = bypassed.popleft()
        if stash is not None:
            stash.append(failure)
        else:
            yield failure


class Meter:
    """A stage's statistics in one pass: every item counted, a sample of them timed.

    An item's time runs from the moment the stage below asks for it until it is handed over,
    less what timing it adds (:func:`_null_span`). Items are timed in windows of ``_WINDOW``
    timed items: the first window times every item; after a window of fast ones, about one
    item in 64 is timed, standing for the items since the last one timed. So slow items
    (batches) are all timed, and fast ones (indices) cost two tests each in :func:`guarded`'s
    loop. A timed item far slower than its window (a wait for the GIL or the CPU, a file
    opened now and then) stands for itself only, the items before it counting at the last
    window's mean, and every item is timed again; after each such item, twice as many fast
    windows in a row (up to ``_CALM_MAX``) are needed before sampling again, so a cost that
    comes back is soon timed every time. Each meter draws its own gaps, so a stage seldom
    times the items that the stage above it times. What it counted goes into *rec* (a
    :class:`~pipeflow.stats.StageRecord`) every ``_FLUSH_NS`` and when the pass ends; *waits*
    (the last stage's) keeps each timed span: the consumer's waits.
    """

    __slots__ = (
        "busy",
        "calm",
        "count",
        "fast_windows",
        "flushed",
        "gap",
        "lcg",
        "longest",
        "mean",
        "next_flush",
        "null",
        "rec",
        "sampling",
        "total",
        "waits",
    )

    def __init__(self, rec: Any, waits: deque[int] | None = None) -> None:
        self.rec, self.waits = rec, waits
        self.busy = self.flushed = 0  # ns and items not yet written to the record
        self.count = self.total = self.longest = 0  # this window's timed items
        self.sampling = False  # the last windows' items were fast: time a sample
        self.fast_windows, self.calm = 0, _CALM_MIN  # fast windows in a row; how many to sample
        self.mean = 0  # ns: the last fast window's mean item
        self.gap, self.lcg = 1, (12345 + 40503 * next(_meters)) & 0x7FFFFFFF
        self.null = _null_span()
        self.next_flush = _clock() + _FLUSH_NS

    def took(self, n: int, asked: int) -> int:
        """Item *n* (counted from 0), asked for at *asked*, arrived; the number of the next
        item to time."""
        now = _clock()
        span = now - asked - self.null
        if span < 0:
            span = 0
        if self.waits is not None:
            self.waits.append(span)
        if now >= self.next_flush:
            self._flush(n + 1, now)
            self.next_flush = now + _FLUSH_NS
        if self.gap > 1 and span > _SPIKE_NS:
            self._spike(span)
            return n + 1
        self.busy += span * self.gap
        self.count += 1
        self.total += span
        if span > self.longest:
            self.longest = span
        if self.count == _WINDOW:
            self._end_window()
        if self.sampling:  # fast items: time about one in 64, at irregular gaps
            self.lcg = (self.lcg * 1103515245 + 12345) & 0x7FFFFFFF
            self.gap = _GAP_MIN + (self.lcg >> 16) % _GAP_SPREAD
        return n + self.gap

    def _spike(self, span: int) -> None:
        """A sampled item took *span*: it stands for itself, the items skipped before it for
        the last fast window's mean; time every item again, and sample later than before."""
        self.busy += span + (self.gap - 1) * self.mean
        self.calm = min(2 * self.calm, _CALM_MAX)
        self.sampling, self.gap, self.fast_windows = False, 1, 0
        self.count = self.total = self.longest = 0

    def _end_window(self) -> None:
        """A window ends: sample the next one after enough fast ones, else time them all."""
        fast = self.total < _TIME_ALL_NS * _WINDOW and self.longest < _SPIKE_NS
        if fast:
            self.fast_windows += 1
            if not self.sampling:
                self.mean = self.total // _WINDOW
        else:
            self.fast_windows = 0
        self.sampling = self.fast_windows >= self.calm
        if not self.sampling:
            self.gap = 1
        self.count = self.total = self.longest = 0

    def restart(self, n: int) -> int:
        """After a failure, time item *n* (the next) afresh."""
        self.gap = 1
        return n

    def done(self, n: int, asked: int | None) -> None:
        """The pass handed on *n* items; *asked*: when the end was asked for, if timed."""
        now = _clock()
        if asked is not None:
            self.busy += now - asked
        self._flush(n, now)

    def _flush(self, n: int, now: int) -> None:
        rec = self.rec
        rec.busy_ns += self.busy
        rec.items += n - self.flushed
        self.busy, self.flushed = 0, n
        rec.sample(now)


def cut(it: Iterator[Any], k: int) -> Iterator[Any]:
    """Drop the first *k* items: what a resumed pass replayed through a stage."""
    return itertools.islice(it, k, None)


def remembering(keys: Iterator[Any], cell: list[Any]) -> Iterator[Any]:
    """Pass keys on, keeping the last one in *cell* (a dataset-reading stage's input)."""
    for key in keys:
        cell[0] = key
        yield key


# -- the consumer's iterator ------------------------------------------------------------
class Pass:
    """The consumer's iterator: the last stage's items, a failed one raised at its turn.

    A class, not a generator: a generator that raised is finished, and the next ``next()``
    must go on with the next item. Counts what it hands out for ``state_dict()``. *on_first*,
    when given, sees the first item before the consumer does (the loader's hint that a
    dataset's indices went unread); after it, ``next()`` calls the last stage directly.
    """

    __slots__ = (
        "__weakref__",
        "chain",
        "closed",
        "cut_short",
        "on_first",
        "progress",
        "pull",
        "record",
        "started",
    )

    def __init__(
        self,
        chain: list[Iterator[Any]],
        progress: Progress,
        record: Any,
        on_first: Callable[[Any], None] | None = None,
    ) -> None:
        self.chain = chain
        self.on_first = on_first
        self.progress = progress
        self.record = record
        self.started = 0
        self.closed = False
        # An error that ended a stage's stream was raised: the pass's end is not the
        # epoch's, and a state taken now resumes with the items it did not deliver.
        self.cut_short = False
        self.pull: Callable[[], Any] = self._first  # then the last stage's __next__

    def __iter__(self) -> Pass:
        return self

    def _first(self) -> Any:
        self.started = time.perf_counter_ns()
        if self.record is not None:
            self.record.passes += 1
        self.pull = self.chain[-1].__next__
        item = self.pull()
        if self.on_first is not None:
            check, self.on_first = self.on_first, None
            check(item)
        return item

    def __next__(self) -> Any:
        try:
            item = self.pull()
        except StopIteration:
            if not self.closed:
                self.progress.done = not self.cut_short
                self.close()
            raise
        except ValueError as e:
            if _SHARED in str(e):  # another thread is in next(): refuse this call, keep the pass
                raise _shared_error() from None
            self.close()
            raise
        except BaseException:
            self.close()  # not a failed item: the pass itself broke (or Ctrl-C)
            raise
        if item.__class__ is Failure:
            error = item.error
            if item.ends:  # no item was consumed: the items from here on were never made
                self.cut_short = True
                with contextlib.suppress(AttributeError):  # an exception without a __dict__
                    setattr(error, ENDED, True)  # a pass in a worker tells the main process
            else:  # a failed item counts as consumed (it is not read again on resume)
                self.progress.delivered += 1
            # A stage's frame may still hold the failure: once raised, it must not keep the
            # exception (whose traceback holds the consumer's frames, and so this pass).
            item.error = _RAISED
            del item
            try:
                raise error
            finally:  # the traceback keeps this frame: it must not keep the pass alive
                del error, self
        self.progress.delivered += 1
        return item

    def close(self) -> None:
        """Stop the pass: close every stage's iterator, release what they hold."""
        if self.closed:
            return
        self.closed = True
        self.pull = _ended
        if self.started and self.record is not None:
            self.record.wall_ns += time.perf_counter_ns() - self.started
        close_all(self.chain)

    def __del__(self) -> None:
        self.close()


_RAISED = RuntimeError("this failure was raised in the consumer already")

#: What Python says when a generator is asked for an item while it is making one: here, a
#: ``next()`` while another thread's ``next()`` on the same pass runs (a stage's own errors
#: reach the pass as failures, never as exceptions, so this one is the consumer's).
_SHARED = "generator already executing"


def _shared_error() -> RuntimeError:
    msg = (
        "pipeflow: next() was called on a pass while another next() on it was running (two "
        "threads reading one iterator); a pass hands its items to one reader at a time. "
        "Nothing was taken and the pass goes on: retry, guard next() with a lock, or give each "
        "thread its own loader (pf.shard splits an epoch between them). pf.DataLoader with "
        "workers may be shared, as torch's"
    )
    return RuntimeError(msg)


def _ended() -> Any:
    raise StopIteration


def close_all(chain: list[Iterator[Any]]) -> None:
    for link in reversed(chain):
        close = getattr(link, "close", None)
        if close is not None:
            try:
                close()
            except ValueError as e:  # running in another thread right now (a thread worker's
                if "already executing" not in str(e):  # replica): it ends there on its own
                    raise
