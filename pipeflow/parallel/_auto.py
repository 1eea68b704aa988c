"""``workers="auto"``: a parallel stage that sizes its pool while it runs.

A :class:`Tuner` watches the pass from where the stage already stands (the replies it
receives, and how long the consumer's ``next()`` waited for them) and moves the count of
workers the pool uses, in windows of at least :data:`WINDOW` seconds:

- **Up** while the consumer waits on the stage (at least :data:`WAITED` of a window) and there
  is room in the budget: the count doubles (fourfold when the consumer waited nearly all the
  window, :data:`RUSH`), within the budget, and the step is kept when the next window reads
  at least a tenth of its ideal gain (:data:`GAIN`: twice the workers must read 1.1x the
  rate); a step that falls short gets a second window, then the count goes back. A resize
  of processes is measured once its workers have all answered (their start is not counted).
- **Down** while the consumer never waits (under :data:`IDLE`): the count halves, and the step
  is kept when the rate holds (:data:`HOLD`) and the consumer still does not wait.
- **Steady** otherwise; a settled count is probed again after :data:`REPROBE` windows (twice
  as long after each probe that did not pay, up to 32 times), but not in the direction of a
  probe that did not pay from it, until the consumer's wait has changed by :data:`CHANGED`.

``parallel_source`` splits its stream by worker, so another count is another interleaving of
its items: its count is chosen once, one per CPU within the budget (see
:mod:`pipeflow.parallel._source`).

The budget: processes (and event loops, one per CPU at most) share the CPUs this process may
run on (``os.sched_getaffinity``) with the other auto stages running in it; threads are
capped at :data:`AUTO_THREADS`. Whatever the count, the items, their order and their random
draws are those of any fixed count: the count only says how many of the pool's workers are
given items (see :mod:`pipeflow.parallel._run`). The count is kept for the next pass, and a
state records it, so a resumed run starts where it was.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

__all__ = [
    "AUTO_THREADS",
    "GAIN",
    "HOLD",
    "IDLE",
    "REPROBE",
    "RUSH",
    "WAITED",
    "WINDOW",
    "Tuner",
    "cpus",
    "forced",
]

#: The most threads ``workers="auto"`` gives a thread pool (threads wait on I/O: many at
#: once pay, up to what one Python process can hand out).
AUTO_THREADS = 64
#: The shortest window the tuner measures (seconds); a window also holds at least four
#: replies per worker.
WINDOW = 0.05
#: The consumer waited at least this fraction of a window: more workers may pay.
WAITED = 0.10
#: The consumer waited less than this fraction: fewer workers may do.
IDLE = 0.02
#: A step up is kept when it earns at least this share of its ideal gain.
GAIN = 0.10
#: The consumer waited at least this fraction of a window: the count grows fourfold (the
#: stage is far behind: work that waits on I/O wants many more threads).
RUSH = 0.90
#: A probe that did not pay is tried again from the same count only once the consumer's
#: wait has grown (up) or shrunk (down) by this much since.
CHANGED = 0.20
#: A step down is kept when the rate stays at least this share of what it was.
HOLD = 0.95
#: Windows a settled count keeps before it is probed again (doubled after each miss).
REPROBE = 20

_LOCK = threading.Lock()
_CLAIMS: dict[int, Tuner] = {}  # id(tuner) -> the tuners of the running passes of processes
_FORCED: list[Callable[[int], int]] = []  # the test hook: the count to use after k replies


def cpus() -> int:
    """The CPUs this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


@contextlib.contextmanager
def forced(schedule: Callable[[int], int]) -> Iterator[None]:
    """A test hook: while it is open, every auto stage of this process uses
    ``schedule(k)`` workers (within its budget) once it has received *k* replies in a pass,
    instead of what it measures.

    Examples:
        >>> with forced(lambda k: 1 + k % 3):
        ...     count = _FORCED[-1](4)
        ...
        >>> count
        2
    """
    _FORCED.append(schedule)
    try:
        yield
    finally:
        _FORCED.remove(schedule)


class Step(NamedTuple):
    """One change of count: in which pass, after how many replies, to what, and why."""

    epoch: int
    at: int
    workers: int
    reason: str


class Tuner:
    """The count of workers an auto stage uses, and how it got there (kept by the loader
    between passes, like a persistent pool).

    Examples:
        >>> tuner = Tuner("processes", cap=4, shares_cpus=False)
        >>> tuner.count, tuner.text()
        (1, 'auto: 1 process (starting)')
    """

    def __init__(
        self,
        kind: str,
        cap: int,
        *,
        shares_cpus: bool,
        start: int = 1,
        per_worker: int = 2,
        max_in_flight: int | None = None,
        reprobe: int = REPROBE,
        fixed: str | None = None,
    ) -> None:
        """*kind*: what a worker is, in the plural ("threads"); *cap*: the most the pool
        holds; *shares_cpus*: its workers count against the process's CPUs (processes, event
        loops); *per_worker*: the in-flight bound per worker (unless *max_in_flight*);
        *reprobe*: the windows a settled count keeps before a probe; *fixed*: why the
        count does not move in a pass (a Ray pool, sized to the cluster when it starts)."""
        self.reprobe, self.fixed = reprobe, fixed
        self.kind, self.cap, self.shares_cpus = kind, cap, shares_cpus
        self.per_worker, self.max_in_flight = per_worker, max_in_flight
        self.count = max(1, min(start, cap))
        self.history: list[Step] = [Step(0, 0, self.count, fixed or "starting")]
        self.pool: Any = None
        self.epoch = 0
        self.seen = 0  # replies received this pass
        self.probe: tuple[int, float] | None = None  # a step on trial: (the count before, its rate)
        self.calm = 0  # windows since the count settled
        self.patience = 0  # windows a settled count waits before a probe (the first: at once)
        self.warming = False  # the window after a resize of processes: not measured
        self.second = False  # a step up that did not pay gets a second window
        self.missed: dict[str, tuple[int, float]] = {}  # way -> (from count, wait) of a miss
        self.worker_ns = 0  # worker-nanoseconds of the passes before the running one's count
        self.since = 0  # when the running count began (perf_counter_ns)
        self._open(time.perf_counter())

    # -- the pass ----------------------------------------------------------------------------
    @property
    def in_flight(self) -> int:
        """The bound on items in flight that goes with the count."""
        return self.max_in_flight or self.per_worker * self.count

    def begin(self, pool: Any, epoch: int) -> None:
        """A pass starts on *pool*: it takes the count (within what the budget leaves now)."""
        self.pool, self.epoch, self.seen = pool, epoch, 0
        self.since = time.perf_counter_ns()
        count = min(self.count, self.room())
        self.claim()
        self._apply(count, self.history[-1].reason if count == self.count else "the budget")
        self._open(time.perf_counter())

    def claim(self) -> None:
        """Count this stage's processes against the budget until :meth:`end`."""
        if self.shares_cpus:
            with _LOCK:
                _CLAIMS[id(self)] = self

    def held(self) -> int:
        """The CPUs this stage holds: its count, or more while workers above it finish."""
        live = getattr(self.pool, "live", None)
        return max(self.count, live()) if live is not None else self.count

    def end(self) -> None:
        """The pass ended: its CPUs go back to the budget."""
        with _LOCK:
            _CLAIMS.pop(id(self), None)
        if self.pool is not None:
            self.worker_ns = self.capacity()
            self.pool = None

    def capacity(self) -> int:
        """Worker-nanoseconds the passes had: each count times how long it ran (what the
        workers' busy share in ``stats()`` divides by)."""
        running = 0 if self.pool is None else time.perf_counter_ns() - self.since
        return self.worker_ns + self.count * running

    def close(self) -> None:
        """The loader closed (it keeps the tuner with its resources)."""
        self.end()

    def room(self) -> int:
        """The most workers this stage may use now: its cap, and for processes the CPUs the
        other running auto stages leave (at least one)."""
        if not self.shares_cpus:
            return self.cap
        with _LOCK:
            others = sum(t.held() for key, t in _CLAIMS.items() if key != id(self))
        return max(1, min(self.cap, cpus() - others))

    def tick(self, got: int, waited: float) -> bool:
        """*got* replies came after the consumer waited *waited* seconds for them; whether
        the count changed (the in-flight bound with it)."""
        self.seen += got
        self.items += got
        self.waited += waited
        if _FORCED and not self.fixed:
            return self._force(_FORCED[-1](self.seen))
        now = time.perf_counter()
        span = now - self.start
        if span < WINDOW or self.items < 4 * self.count + 4:
            return False
        rate, wait = self.items / span, min(self.waited / span, 1.0)
        self._open(now)
        return self.decide(rate, wait)

    def decide(self, rate: float, wait: float) -> bool:
        """A window read *rate* items a second while the consumer waited *wait* of it: move
        the count (see the module's text); whether it changed."""
        if self.fixed:
            return False
        if self.warming:  # a resize of processes: measured once its workers all answered
            answered = getattr(self.pool, "answered", None)
            self.warming = answered is not None and not answered(self.count)
            return False
        before = self.count
        if self.probe is not None:
            self._judge(rate, wait)
        else:
            self._steady(rate, wait)
        return self.count != before

    # -- decisions ---------------------------------------------------------------------------
    def _steady(self, rate: float, wait: float) -> None:
        self.calm += 1
        if self.calm < self.patience:
            return
        room = self.room()
        if wait >= WAITED and self.count < room and self._may("up", wait):
            self._try(self._up(wait, room), rate, f"the consumer waited {wait:.0%}")
        elif wait < IDLE and self.count > 1 and self._may("down", wait):
            self._try(self.count // 2, rate, f"the consumer waited only {wait:.0%}")
        elif wait >= WAITED and self.count >= room:
            self._settle(self._budget_words(), paid=True)

    def _up(self, wait: float, room: int) -> int:
        """The count a step up tries: twice this one, four times when the consumer waited
        nearly all the window (:data:`RUSH`), within *room*."""
        return min((4 if wait >= RUSH else 2) * self.count, room)

    def _may(self, way: str, wait: float) -> bool:
        """Whether a probe *way* ("up", "down") may start from this count: not again after
        one from it did not pay, until the consumer's wait changed by :data:`CHANGED`."""
        missed = self.missed.get(way)
        if missed is None or missed[0] != self.count:
            return True
        return abs(wait - missed[1]) >= CHANGED

    def _try(self, count: int, rate: float, why: str) -> None:
        self.probe = (self.count, rate)
        self._apply(count, f"trying {count}: {why}")

    def _judge(self, rate: float, wait: float) -> None:
        assert self.probe is not None
        before, base = self.probe
        self.probe = None
        ratio = rate / base if base else 1.0
        now = self.count
        if now > before:
            paid = ratio >= 1 + GAIN * (now / before - 1)
            if not paid and not self.second:  # one window may have been unlucky: one more
                self.probe, self.second = (before, base), True
                return
            self.second = False
            if not paid:
                words = f"{now} read only {ratio:.2f}x the rate of {before}"
                self._apply(before, words)
                self.missed["up"] = (before, wait)
                self._settle(words, paid=False)
            elif wait >= WAITED and now < self.room():
                self._try(self._up(wait, self.room()), rate, f"{now} read {ratio:.2f}x")
            else:
                self._settle(self._words_up(now, before, ratio, wait), paid=True)
            return
        if ratio >= HOLD and wait < WAITED:
            if wait < IDLE and now > 1:
                self._try(now // 2, rate, f"{now} kept the pace")
            else:
                self._settle(f"the consumer sets the pace: {now} keep up", paid=True)
            return
        words = f"the consumer sets the pace: {now} fell behind ({ratio:.2f}x the rate)"
        self._apply(before, words)
        self.missed["down"] = (before, wait)
        self._settle(words, paid=False)

    def _words_up(self, now: int, before: int, ratio: float, wait: float) -> str:
        if now >= self.room() and wait >= WAITED:
            return self._budget_words()
        return f"{now} read {ratio:.2f}x the rate of {before}"

    def _budget_words(self) -> str:
        if not self.shares_cpus:
            return f"the cap: {self.cap} {self.kind}"
        return f"the budget: {cpus()} CPUs"

    def _settle(self, reason: str, *, paid: bool) -> None:
        self.calm = 0
        again = self.reprobe
        self.patience = again if paid else min(2 * max(self.patience, again), 32 * again)
        last = self.history[-1]
        if (last.workers, last.reason) != (self.count, reason):
            self.history.append(Step(self.epoch, self.seen, self.count, reason))

    def _force(self, count: int) -> bool:
        count = max(1, min(count, self.room()))
        if count == self.count:
            return False
        self._apply(count, "forced (test hook)")
        return True

    def _apply(self, count: int, reason: str) -> None:
        """Use *count* workers from now on (the pool too, when a pass runs)."""
        changed = count != self.count
        if self.pool is not None:
            self.worker_ns, self.since = self.capacity(), time.perf_counter_ns()
        self.count = count
        if self.pool is not None:
            self.pool.resize(count, self.in_flight)
        if changed:
            self.history.append(Step(self.epoch, self.seen, count, reason))
            self.warming = self.shares_cpus and self.pool is not None

    def _open(self, now: float) -> None:
        self.start, self.items, self.waited = now, 0, 0.0

    # -- what it did -------------------------------------------------------------------------
    def text(self) -> str:
        """The count and why, in words: ``auto: 2 processes (the budget: 2 CPUs)``."""
        kind = self.kind if self.count != 1 else _one(self.kind)
        return f"auto: {self.count} {kind} ({self.history[-1].reason})"

    def steps(self) -> list[str]:
        """The history, a line a change: ``epoch 0, after 120 items: 4 (trying 4: ...)``."""
        return [
            f"epoch {s.epoch}, after {s.at} items: {s.workers} ({s.reason})" for s in self.history
        ]


def _one(kind: str) -> str:
    """*kind* for one worker.

    Examples:
        >>> _one("processes"), _one("threads"), _one("event loops")
        ('process', 'thread', 'event loop')
    """
    return kind[:-2] if kind.endswith("sses") else kind[:-1]
