"""One pass of a parallel stage: a generator that keeps the workers busy, one that puts
results in order, and one that hands them on.

Read it top-down: :func:`run_parallel` borrows a pool for the pass, numbers the items, and
yields what :func:`_results`, :func:`_in_order` and :func:`_delivered` make of them.
:func:`_results` keeps at most ``max_in_flight`` items out at once (backpressure) and yields
the replies as they arrive, a list at a time; :func:`_in_order` holds early ones back until
their turn. The pools (:mod:`pipeflow.parallel.pools._processes`,
:mod:`pipeflow.parallel.pools._threads`, :mod:`pipeflow.parallel.pools._aio`) run the items
and turn failures into exceptions here: the user's own (same type, worker traceback chained,
a note naming the stage, the item, the worker and its pid), ``WorkerDiedError``,
``WorkerTimeoutError``. ``parallel_map`` (:mod:`pipeflow.parallel._map`) and
``parallel_source`` (:mod:`pipeflow.parallel._source`) are its two stages.
"""

from __future__ import annotations

import operator
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from itertools import islice, repeat
from typing import TYPE_CHECKING, Any

from pipeflow.engine._context import Context, Hooks
from pipeflow.engine._failure import Failure, WithDropped, ended
from pipeflow.errors import WorkerDiedError, WorkerTimeoutError, _add_note
from pipeflow.parallel._auto import Tuner
from pipeflow.parallel._kept import Kept, make_pool
from pipeflow.parallel._settings import Settings
from pipeflow.parallel.pools._protocol import Pool, held, named
from pipeflow.parallel.pools._threads import DIED
from pipeflow.parallel.transport._wire import Exhausted, PassNote, Reply, describe_item
from pipeflow.resume.state import numbered, recording

if TYPE_CHECKING:
    from pipeflow.parallel._records import MapRecord, SourceRecord

__all__ = ["run_parallel"]


def run_parallel(
    job: Any,
    config: Settings,
    name: str,
    upstream: Iterable[Any] | None,
    context: Context,
    hooks: Hooks | None,
    note: PassNote | None = None,
) -> Iterator[Any]:
    """One pass of a parallel stage (``upstream`` ``None``: the workers are sources, and
    each task carries *note*, what the pass tells them: see ``SourceJob``)."""
    hooks = hooks or Hooks()
    record: MapRecord | SourceRecord | None = hooks.record
    order = record.order if record is not None else None  # out of order: the numbers delivered
    states = record.states if record is not None else None  # the workers' states, output by output
    stats = hooks.stats
    if stats is not None and config.workers:
        stats.workers, stats.max_in_flight = config.workers, config.in_flight
    skip = hooks.resume or frozenset()
    items = None if upstream is None else numbered(upstream, context.offset, skip)
    if config.workers == 0:  # in the calling thread: the reference the parallel runs equal
        yield from recording(_inline(job, items, context.epoch, context.offset, note), order)
        return
    kept = hooks.resources.setdefault("pool", Kept())
    restores = record.restores if record is not None else None
    pool, borrowed = kept.borrow(
        config,
        lambda: make_pool(config, job, name, config.base_seed(context), restores),
        getattr(job, "facts", None),
    )
    kept.passes[context.epoch] = pool
    first, ended = record.rotation() if record is not None else (context.offset, [])
    done = [0]  # results delivered to the consumer: what the in-flight bound counts
    out: dict[int, Any] = {}  # the items in flight, by number: a failure names them
    tuner = _tuner(config, hooks, pool) if config.auto else None
    try:
        replies = _results(
            pool, items, context, config, done, stats, out, note, (first, ended), tuner
        )
        if config.ordered:
            replies = _in_order(replies, context.offset, pool.drop)
        yield from _delivered(pool, replies, done, out, order, states)
    finally:
        if tuner is not None:
            tuner.end()
        kept.give_back(pool, borrowed)


def _tuner(config: Settings, hooks: Hooks, pool: Pool) -> Tuner | None:
    """The stage's tuner (``workers="auto"``), kept by the loader from pass to pass; a
    resumed run's starts at the count its state recorded. A Ray pool's count was fixed when
    it started (to the cluster's free CPUs): its tuner only says so."""
    tuner: Tuner | None = hooks.resources.get("auto")
    if not pool.resizable:  # Ray: sized to the cluster's free CPUs when the pool started
        if tuner is None or tuner.count != pool.workers:
            why = "the Ray cluster's free CPUs when its actors started"
            tuner = hooks.resources["auto"] = config.tuner(pool.workers, pool.workers, why)
    elif tuner is None:
        saved = getattr(hooks.record, "auto_count", None)
        start = saved or (1 if config.backend == "process" or config.coroutines else 2)
        tuner = hooks.resources["auto"] = config.tuner(config.workers, start)
    if hooks.record is not None:
        hooks.record.tuner = tuner  # a state taken in this pass records its count
    return tuner


# Fields of a Reply (a NamedTuple), read by name in C over a whole list of them.
_kind, _seq, _took, _payload = map(operator.attrgetter, ("kind", "seq", "took", "payload"))
_ONLY_OK = frozenset(("ok",))


def _results(
    pool: Pool,
    items: Iterator[tuple[int, Any]] | None,
    context: Context,
    config: Settings,
    done: list[int],
    stats: Any,
    out: dict[int, Any],
    note: PassNote | None = None,
    rotation: tuple[int, Any] = (0, ()),
    tuner: Tuner | None = None,
) -> Iterator[list[Reply]]:
    """Keep up to ``max_in_flight`` items out (counting those not delivered yet); yield the
    replies as they arrive, a list at a time.

    Items are taken and sent in runs, as many as there is room for (:class:`_Sender`), and
    replies handled a list at a time: the work here per item is a few operations in C, not a
    Python loop, so that it takes the workers' GIL (threads, event loops) as little as it can.
    """
    in_flight = config.in_flight if tuner is None else tuner.in_flight  # read once
    pool.start_pass(in_flight)
    if tuner is not None:
        tuner.begin(pool, context.epoch)
        in_flight = _resized(tuner, stats)
    if config.round_robin:  # item k to worker k % workers, from where a resumed pass starts
        first, ended = rotation
        pool.rotate(first % pool.workers, ended)
    bound = pool.backlog(in_flight)
    sender = _Sender(pool, items, context, out, note)
    received = 0
    watch = _Watch(config.timeout)
    while True:
        room = bound - (sender.sent - done[0])
        if room > 0:
            sender.fill(room)
        if sender.exhausted and not sender.waiting and received == sender.sent:
            return
        if tuner is None:
            got = _collect(pool, watch, sender, out)
        else:  # it measures how long the consumer waited for these replies
            began = time.perf_counter()
            got = _collect(pool, watch, sender, out)
            if tuner.tick(len(got), time.perf_counter() - began):
                in_flight = _resized(tuner, stats)
                bound = pool.backlog(in_flight)
        received += len(got)
        if stats is not None:  # queue occupancy and per-item times, for loader.stats()
            stats.in_flight += min(sender.sent - done[0], in_flight)
            stats.in_flight_samples += 1
            took = list(map(_took, got))
            stats.task_ns.extend(took)
            stats.task_total_ns += sum(took)
        if got:
            yield got


def _resized(tuner: Tuner, stats: Any) -> int:
    """The tuner's in-flight bound, and its count told to the stage's statistics."""
    if stats is not None:
        if stats.auto is not tuner:  # a new record (reset_stats()): its share from now on
            stats.auto, stats.auto_base = tuner, tuner.capacity()
        stats.workers, stats.max_in_flight = tuner.count, tuner.in_flight
    return tuner.in_flight


class _Watch:
    """The stage's ``timeout``: no worker may hold an item that long without finishing it.

    A wait for replies lasts until the item held longest (:meth:`Pool.busy_since`) has been
    held ``timeout`` seconds; replies from other workers meanwhile do not put it off. An item
    counts from when its worker began it, not from when it was sent or queued, so a worker
    is never timed for the time the consumer held results, nor for the items it ran before.
    While items are out and no worker holds one (a thread still in its ``worker_init``, an
    event loop blocked), one must begin within ``timeout`` of when the pass began to wait.
    """

    __slots__ = ("timeout", "window")

    def __init__(self, timeout: float | None) -> None:
        self.timeout = timeout
        self.window: float | None = None  # while no worker holds an item: by when one must

    def collect(self, pool: Pool) -> list[Reply] | None:
        """The next replies, or ``None``: the timeout passed (what the pool read as it
        found that out is dropped: the pass ends)."""
        timeout = self.timeout
        if timeout is None:
            return pool.collect(None)
        while True:
            left = self._left(pool, timeout)
            got = pool.collect(left)
            # Up before this wait (of 0 s), the time is up for good unless what the wait read
            # changed it: a reply from the worker that held the item, or one that shows it
            # began later than it seemed (a worker process that ran items queued for it).
            if left == 0.0 and self._left(pool, timeout) == 0.0:
                for reply in got or ():
                    pool.drop(reply)
                return None
            if got is not None:
                if got:
                    self.window = None
                return got

    def _left(self, pool: Pool, timeout: float) -> float:
        """Seconds until the item held longest has been held *timeout* seconds (while no
        worker holds one: until the window for one to begin closes)."""
        now = time.monotonic()
        since = pool.busy_since()
        if since is not None:
            self.window = None
            return max(0.0, since + timeout - now)
        if self.window is None:
            self.window = now + timeout
        return max(0.0, self.window - now)


def _collect(pool: Pool, watch: _Watch, sender: _Sender, out: dict[int, Any]) -> list[Reply]:
    """The next replies; a worker's death or a timeout ends the pass with an error that
    names every item not delivered (those out now, and those never sent)."""
    try:
        got = watch.collect(pool)
    except WorkerDiedError as e:
        _name_lost(e, out, sender)
        raise
    except BaseException as e:
        if getattr(e, DIED, None) is not None:  # a worker thread died of it: the pass ends
            _add_note(e, f"pipeflow: parallel stage {pool.name!r}: not delivered: {held(out)}")
        raise
    if got is not None:
        return got
    pool.broken = True  # its workers may be stuck: stopped at once, and not kept
    msg = (
        f"parallel stage {pool.name!r}: no result within timeout={watch.timeout} s; in "
        f"flight: {pool.in_flight()}"
    )
    error = WorkerTimeoutError(msg)
    _name_lost(error, out, sender)
    raise error


def _name_lost(error: Any, out: dict[int, Any], sender: _Sender) -> None:
    """Add to *error* (a pass-ending one) which items the pass will never deliver: those
    sent and not delivered (*out*), and every one from the first never sent."""
    flat, _ = named(out)
    first = sender.first_unsent()
    error.undelivered, error.unsent_from = tuple(flat), first
    words = f"not delivered: {held(out)}" if out else "not delivered: no item in flight"
    if first is not None:
        words += f", and any item from item {first} of the pass on (never sent)"
    fix = getattr(error, "fix", "")  # what to do stays the message's last words
    head = error.args[0].removesuffix(fix) if fix else error.args[0]
    error.args = (f"{head}; {words}{fix}", *error.args[1:])


class _Sender:
    """What :func:`_results` sends, and how many it has sent: a map's items taken from
    upstream in runs (those no worker had room for yet wait for the next turn), or, for
    source workers (no items), "your next item" while any of them has more."""

    __slots__ = (
        "epoch",
        "exhausted",
        "items",
        "note",
        "out",
        "pool",
        "sent",
        "seq",
        "taken",
        "waiting",
    )

    def __init__(
        self,
        pool: Pool,
        items: Iterator[tuple[int, Any]] | None,
        context: Context,
        out: dict[int, Any],
        note: PassNote | None,
    ) -> None:
        self.pool, self.items, self.out, self.note = pool, items, out, note
        self.epoch = context.epoch
        self.seq = context.offset  # a source's items are numbered from here
        self.sent = 0
        self.waiting: list[tuple[int, Any]] = []  # items taken that no worker had room for
        self.exhausted = False  # upstream has no more (sources: no worker has more)
        self.taken = -1  # the number of the last item taken from upstream

    def first_unsent(self) -> int | None:
        """The number of the first item not sent yet (``None``: every item was sent)."""
        if self.waiting:
            return self.waiting[0][0]
        if self.exhausted:
            return None
        if self.items is None:  # source workers: "your next item" is numbered in turn
            return self.seq
        return self.seq if self.taken < 0 else self.taken + 1

    def fill(self, room: int) -> None:
        """Send up to *room* items, as many as the workers take now."""
        if self.items is None:
            self._ask(room)
            return
        waiting = self.waiting
        if not self.exhausted and len(waiting) < room:
            want = room - len(waiting)
            before = len(waiting)
            waiting.extend(islice(self.items, want))
            self.exhausted = len(waiting) - before < want
            if waiting:
                self.taken = waiting[-1][0]
        run = waiting if len(waiting) <= room else waiting[:room]
        taken = self.pool.submit_many(run, self.epoch) if run else 0
        if taken:
            self.out.update(run[:taken] if taken < len(run) else run)
            del waiting[:taken]
            self.sent += taken

    def _ask(self, room: int) -> None:
        """Source workers: ask for up to *room* next items, each carrying the pass's note (at
        most :data:`_ASKS` a turn: an ask is a task queued whatever the workers have, so a
        huge ``max_in_flight`` must not queue that many at once)."""
        pool, note = self.pool, self.note
        for _ in range(min(room, _ASKS)):
            if self.exhausted:
                return
            if not pool.can_submit():
                self.exhausted = True
            elif pool.submit(self.seq, self.epoch, note):
                self.out[self.seq] = note
                self.seq, self.sent = self.seq + 1, self.sent + 1
            else:
                return


#: The most "your next item" tasks a source's pass queues in one turn of its loop.
_ASKS = 4096


def _in_order(
    chunks: Iterator[list[Reply]], first: int, drop: Callable[[Reply], None]
) -> Iterator[list[Reply]]:
    """Hold replies back until every earlier one has gone out."""
    early: dict[int, Reply] = {}
    expected = first
    try:
        for chunk in chunks:
            seqs = list(map(_seq, chunk))
            if not early and seqs == list(range(expected, expected + len(seqs))):
                expected += len(seqs)  # a run of consecutive numbers, as is usual: on as it is
                yield chunk
                continue
            early.update(zip(seqs, chunk))
            ready = []
            while expected in early:
                ready.append(early.pop(expected))
                expected += 1
            if ready:
                yield ready
    finally:
        for reply in early.values():
            drop(reply)


def _delivered(
    pool: Pool,
    chunks: Iterator[list[Reply]],
    done: list[int],
    out: dict[int, Any],
    order: list[int] | None,
    states: Any = None,
) -> Iterator[Any]:
    """Each reply's result, one at a time; a failed item's is its
    :class:`~pipeflow.engine._failure.Failure`, and the next item goes on. Unordered, the numbers of
    the items delivered go to *order* as each goes out; *states* notes, before each reply's
    results go out, what changed in its worker's state (every reply, for a source: which
    worker made them; see :mod:`pipeflow.resume._states`).

    A list of ``"ok"`` replies from threads or event loops, whose results are the workers'
    own objects, goes out as it is; anything else (a process's encoded result, a failure, a
    batch that went on without some samples) reply by reply.
    """
    note = None if order is None else order.append
    for chunk in chunks:
        done[0] += len(chunk)  # nothing more is sent before the consumer has had them all
        if states is None and pool.plain and _ONLY_OK.issuperset(map(_kind, chunk)):
            deque(map(out.pop, map(_seq, chunk), repeat(None)), 0)
            values = list(map(_payload, chunk))
            if WithDropped not in set(map(type, values)):
                if note is None:
                    yield from values
                else:
                    for seq, value in zip(map(_seq, chunk), values):
                        note(seq)
                        yield value
                continue
        yield from _one_by_one(pool, chunk, out, note, states)


def _one_by_one(
    pool: Pool,
    chunk: list[Reply],
    out: dict[int, Any],
    note: Callable[[int], Any] | None,
    states: Any = None,
) -> Iterator[Any]:
    """The results of *chunk*'s replies as the consumer takes them; replies it does not take
    (it stopped) give back what they hold."""
    i = 0
    every = states is not None and states.every
    try:
        for i, reply in enumerate(chunk, 1):  # noqa: B007 - the finally reads i
            item = out.pop(reply.seq, None)
            if reply.kind == "end":  # a source worker that ran out
                if every:
                    states.track(reply.worker, reply.seq, 0, "end", reply.state)
                continue
            try:
                value = pool.value(reply)
            except Exception as e:  # the item's own error, rebuilt here
                value = Failure(e, _indices(item, reply.seq), ends=ended(e))
            ones = _unpack(value)
            if every or (states is not None and reply.state is not None):  # noted before
                states.track(reply.worker, reply.seq, len(ones), reply.kind, reply.state)
            for one in ones:
                if note is not None:
                    note(reply.seq)
                yield one
    finally:
        for reply in chunk[i:]:
            pool.drop(reply)


def _unpack(value: Any) -> tuple[Any, ...]:
    """A result, then the failures of the samples its batch went on without."""
    if value.__class__ is WithDropped:
        return (value.value, *value.dropped)
    return (value,)


def _indices(item: Any, seq: int) -> list[Any]:
    where = describe_item(item, seq)
    return where.get("batch") or ([where["index"]] if "index" in where else [])


def _inline(
    job: Any,
    items: Iterator[tuple[int, Any]] | None,
    epoch: int,
    first: int,
    note: PassNote | None = None,
) -> Iterator[tuple[int, Any]]:
    if items is None:
        seq = first
        while True:
            try:
                yield seq, job.run(note, epoch, seq)
            except Exhausted:
                return
            seq += 1
    for seq, item in items:
        try:
            value = job.run(item, epoch, seq)
        except Exception as e:
            value = Failure(e, _indices(item, seq))
        for one in _unpack(value):
            yield seq, one
