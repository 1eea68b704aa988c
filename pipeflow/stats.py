"""See inside a loader: per-stage counts and times, the consumer's wait, and the bottleneck.

Every loader records these as it runs: every item is counted; slow items (batches) are all
timed, and of fast ones (indices) about one in 64 (see
:class:`pipeflow.engine._wrappers.Meter`), so the cost is nothing measurable.
``loader.stats()`` returns a :class:`Stats`: plain data, whose ``str()`` is a table that
names the bottleneck and what to try.

How times are measured: each stage's iterator is timed from the moment the stage below asks
it for an item until it hands one over. That span includes the time it spent waiting for its
own upstream; subtracting the upstream's span leaves the stage's *own* time. The consumer's
*wait* is the span of the last stage: how long the training loop waited for each batch.
"""

from __future__ import annotations

import math
import time
from collections import deque
from dataclasses import asdict, dataclass, field, replace
from typing import Any, NamedTuple

__all__ = [
    "DATALOADER_KNOBS",
    "LOADER_KNOBS",
    "Knobs",
    "LoaderRecord",
    "StageRecord",
    "StageStats",
    "Stats",
]

_SAMPLE_NS = 100_000_000  # one point of the time series every 0.1 s, at first
_POINTS = 2_000  # then, at this many, every other point goes and the spacing doubles
_KEEP = 10_000  # per-item times kept for the percentiles


class StageRecord:
    """What one stage's watcher accumulates while the loader runs (mutable, internal)."""

    __slots__ = (
        "auto",
        "auto_base",
        "busy_ns",
        "ignored",
        "ignored_indices",
        "in_flight",
        "in_flight_samples",
        "items",
        "last_sample",
        "max_in_flight",
        "name",
        "padded_tokens",
        "real_tokens",
        "series",
        "spacing",
        "taken",
        "task_ns",
        "task_total_ns",
        "workers",
    )

    def __init__(self, name: str) -> None:
        self.name = name
        self.items = 0
        self.busy_ns = 0
        self.last_sample = 0
        self.series: list[tuple[int, int, int]] = []  # (clock ns, items, busy ns)
        self.spacing = _SAMPLE_NS  # ns between two points of the series
        # parallel stages only
        self.workers = 0
        self.max_in_flight = 0
        self.auto: Any = None  # workers="auto": the stage's tuner (its count and history)
        self.auto_base = 0  # its worker-nanoseconds before this record began
        self.task_ns: deque[int] = deque(maxlen=_KEEP)
        self.task_total_ns = 0
        self.in_flight = 0
        self.in_flight_samples = 0
        # ignore_errors only: items dropped, and the sample indices they stood for
        self.ignored = 0
        self.ignored_indices: list[Any] = []
        # the sequence stages (pack, bucket, batch by max_tokens): the real tokens in what
        # they made, and its padded size
        self.real_tokens = 0
        self.padded_tokens = 0
        # a source read unwatched (pipeflow.engine._plan's direct link): its iterator, and its
        # length when it was registered
        self.taken: tuple[Any, int] | None = None

    def count_by_remaining(self, it: Any) -> None:
        """Count this source's items by what *it* (an iterator with an exact
        ``__length_hint__``: a ``range``'s) has left, since the stage after it reads it
        directly; an earlier pass's iterator is counted in for good."""
        self.items = self.counted()
        self.taken = (it, it.__length_hint__())

    def counted(self) -> int:
        """The items this stage handed on so far."""
        if self.taken is None:
            return self.items
        it, start = self.taken
        left: int = it.__length_hint__()
        return self.items + start - left

    def sample(self, now: int) -> None:
        """Add a point to the time series, if one is due: the series stays under ``_POINTS``
        points however long the run (every other one dropped, the spacing doubled)."""
        if now - self.last_sample >= self.spacing:
            self.last_sample = now
            self.series.append((now, self.items, self.busy_ns))
            if len(self.series) >= _POINTS:
                del self.series[1::2]
                self.spacing *= 2


class LoaderRecord:
    """The loader-wide part: passes, wall time, the consumer's waits."""

    __slots__ = ("passes", "stages", "started", "waits", "wall_ns")

    def __init__(self, names: list[str]) -> None:
        self.stages = [StageRecord(n) for n in names]
        self.passes = 0
        self.wall_ns = 0
        self.waits: deque[int] = deque(maxlen=_KEEP)
        self.started = time.perf_counter_ns()


class Knobs(NamedTuple):
    """The settings the advice names (see :func:`diagnose`), in the words of what the user
    built: a loader's stage arguments (:data:`LOADER_KNOBS`), or ``pf.DataLoader``'s
    (:data:`DATALOADER_KNOBS`: it has ``num_workers`` and ``prefetch_factor``, not
    ``workers`` and ``max_in_flight``)."""

    #: for workers busy most of the time
    more_workers: str
    #: for workers idle, waiting for the main process
    in_flight: str
    #: for a slow stage in one thread
    parallel: str
    #: for a parallel stage with no workers
    give_workers: str
    #: what the ``queue`` column is a share of
    queue: str


LOADER_KNOBS = Knobs(
    more_workers="try more workers, or the thread backend if the work waits on I/O or "
    "releases the GIL",
    in_flight="raise max_in_flight",
    parallel="run it in pf.parallel_map (threads for I/O, processes for Python-heavy work)",
    give_workers="give it workers (threads for I/O, processes for Python-heavy work)",
    queue="max_in_flight",
)
DATALOADER_KNOBS = Knobs(
    more_workers="raise num_workers",
    in_flight="raise prefetch_factor (the batches in flight per worker)",
    parallel="set num_workers above 0 (the fetch and collate then run in worker processes)",
    give_workers="raise num_workers above 0",
    queue="prefetch_factor x num_workers",
)


def legend(knobs: Knobs = LOADER_KNOBS) -> str:
    """The last lines of ``str(stats)``: what the columns mean, and where to read more."""
    return (
        "own s: in the stage's own code; wait s: waiting for the stage above; busy: workers' "
        f"time on items;\nqueue: share of {knobs.queue} in use. More: the how-to "
        '"Find the bottleneck with stats()"'
    )


#: The legend of a loader's table.
LEGEND = legend()


@dataclass(frozen=True)
class StageStats:
    """One stage's numbers (source first).

    Attributes:
        name: the stage's name.
        items: items it yielded.
        seconds: time inside the stage's iterator, its upstream's included.
        own_seconds: time in the stage's own code: ``seconds`` minus its upstream's.
        wait_seconds: time it waited for its upstream.
        items_per_second: ``items`` over the time the passes ran (summed).
        workers: for a parallel stage, its workers (else ``None``).
        worker_busy: the fraction of the workers' time spent on items (parallel stages).
        queue_occupancy: the average fraction of ``max_in_flight`` in use (parallel stages).
        item_seconds_p50: median per-item time in a worker (parallel stages).
        item_seconds_p90: 90th percentile of the per-item time in a worker.
        item_seconds_p99: 99th percentile of the per-item time in a worker.
        series: ``(seconds since the start, items so far)`` points, for plots.
        ignored_errors: for ``ignore_errors``, the failed items it dropped (else 0).
        ignored_indices: the sample indices those items stood for (the first 1,000).
        real_tokens: for ``pack``, ``bucket`` and ``batch(max_tokens=...)``, the tokens of
            the items in the rows or batches it made (else 0).
        padded_tokens: their padded size: rows times the row length (``pack``), or each
            batch's count times its longest item.
        efficiency: ``real_tokens / padded_tokens``, the share of what the stage made that
            is real tokens, not padding (``None`` for the other stages).
        cache_hits: for ``cache`` (or a parallel stage that runs one in its workers), the
            samples it had, in every process, since its loader started it (``reset_stats()``
            leaves them: they are the cache's, not the pass's).
        cache_misses: the samples the stages above it made, and it kept (or, past
            ``max_bytes``, recomputes).
        cache_bytes: the bytes it keeps (in memory, shared memory and ``path``).
        cache_saved_seconds: about how long the hits would have taken: the hits times the
            mean time the stages above it took for a miss.
        auto: for a parallel stage with ``workers="auto"``, the count it uses and why
            (``"auto: 2 processes (the budget: 2 CPUs)"``); else ``None``.
        auto_history: its changes of count, a line each (epoch, after how many items, the
            count, why).
    """

    name: str
    items: int
    seconds: float
    own_seconds: float
    wait_seconds: float
    items_per_second: float
    workers: int | None = None
    worker_busy: float | None = None
    queue_occupancy: float | None = None
    item_seconds_p50: float | None = None
    item_seconds_p90: float | None = None
    item_seconds_p99: float | None = None
    series: list[tuple[float, int]] = field(default_factory=list, repr=False)
    ignored_errors: int = 0
    ignored_indices: list[Any] = field(default_factory=list, repr=False)
    real_tokens: int = 0
    padded_tokens: int = 0
    efficiency: float | None = None
    cache_hits: int = 0
    cache_misses: int = 0
    cache_bytes: int = 0
    cache_saved_seconds: float = 0.0
    auto: str | None = None
    auto_history: list[str] = field(default_factory=list, repr=False)


@dataclass(frozen=True)
class Stats:
    """A loader's statistics since it was built: :meth:`Loader.stats` returns one.

    Attributes:
        stages: one :class:`StageStats` per stage, the source first.
        passes: passes started.
        wall_seconds: the time the passes ran, summed (until now for one in progress).
        consumer_wait_seconds: total time the consumer waited for items.
        consumer_wait_fraction: that, over the time the passes ran.
        consumer_wait_p50: the median wait for one item, in seconds.
        consumer_wait_p99: the 99th percentile of the wait for one item, in seconds.
        bottleneck: the stage that limits the loader, or ``"consumer"`` when the loader keeps
            up (the consumer waited less than 20 % of the time: the training step is the slow
            part), or ``"none"`` before any item. The rule, with its thresholds, is
            ``pipeflow.stats.diagnose``.
        advice: why, and what to try.
    """

    stages: list[StageStats]
    passes: int
    wall_seconds: float
    consumer_wait_seconds: float
    consumer_wait_fraction: float
    consumer_wait_p50: float | None
    consumer_wait_p99: float | None
    bottleneck: str
    advice: str
    knobs: Knobs = field(default=LOADER_KNOBS, repr=False, compare=False)

    def to_dict(self) -> dict[str, Any]:
        """The statistics as plain dicts and lists (for JSON or a logger)."""
        out = asdict(self)
        del out["knobs"]
        return out

    def advising(self, knobs: Knobs) -> Stats:
        """These statistics with the advice (and the legend) in the words of *knobs*:
        ``pf.DataLoader.stats()`` says ``num_workers`` where a loader says ``workers``."""
        bottleneck, advice = diagnose(self.stages, self.consumer_wait_fraction, knobs)
        return replace(self, bottleneck=bottleneck, advice=advice, knobs=knobs)

    def __str__(self) -> str:
        head = (
            f"{'stage':<16} {'items':>9} {'items/s':>10} {'own s':>8} {'wait s':>8} "
            f"{'workers':>8} {'busy':>6} {'queue':>6} {'p50 ms':>8} {'p99 ms':>8}"
        )
        lines = [head, "-" * len(head), *map(_table_row, self.stages), self._consumer_line()]
        lines.append(f"bottleneck: {self.bottleneck}: {self.advice}")
        for st in self.stages:
            if st.ignored_errors:
                lines.append(f"ignored errors: {ignored_text(st)} (in {st.name!r})")
            if st.efficiency is not None:
                lines.append(f"efficiency: {efficiency_text(st)} (in {st.name!r})")
            if st.cache_hits or st.cache_misses:
                lines.append(f"cache: {cache_text(st)} (in {st.name!r})")
            if st.auto is not None:
                lines.append(f"{st.auto} (in {st.name!r})")
        lines.append(legend(self.knobs))
        return "\n".join(lines)

    def _consumer_line(self) -> str:
        p50 = _opt(self.consumer_wait_p50, "{:.2f}", 1e3)
        p99 = _opt(self.consumer_wait_p99, "{:.2f}", 1e3)
        return (
            f"consumer waited {self.consumer_wait_seconds:.3f} s of {self.wall_seconds:.3f} s "
            f"({_pct(self.consumer_wait_fraction)}); per item p50 {p50} ms, p99 {p99} ms"
        )

    def plot(self, path: str) -> None:
        """Draw per-stage throughput and own time over the run into *path* (a PNG, say).

        Needs matplotlib (``pip install "pipeflow[plot]"``).

        Raises:
            ImportError: if matplotlib is not installed, saying how to install it.
        """
        try:
            import matplotlib

            matplotlib.use("Agg")
            import matplotlib.pyplot as plt
        except ImportError as e:
            msg = 'Stats.plot needs matplotlib: pip install "pipeflow[plot]" (or matplotlib)'
            raise ImportError(msg) from e
        fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=False)
        _plot_throughput(top, self.stages)
        _plot_times(bottom, self.stages, self.bottleneck)
        fig.tight_layout()
        fig.savefig(path)
        plt.close(fig)


def _table_row(s: StageStats) -> str:
    """One stage's line of the table ``str(stats)`` prints; a name too long for its column
    (a computed source's) takes a line of its own above the numbers."""
    name = f"{s.name:<16}" if len(s.name) <= 16 else f"{s.name}\n{'':<16}"
    return (
        f"{name} {s.items:>9,} {s.items_per_second:>10,.1f} "
        f"{s.own_seconds:>8.3f} {s.wait_seconds:>8.3f} "
        f"{_opt(s.workers, '{:d}'):>8} {_pct_opt(s.worker_busy):>6} "
        f"{_pct_opt(s.queue_occupancy):>6} "
        f"{_opt(s.item_seconds_p50, '{:.2f}', 1e3):>8} "
        f"{_opt(s.item_seconds_p99, '{:.2f}', 1e3):>8}"
    )


def _plot_throughput(axes: Any, stages: list[StageStats]) -> None:
    """Items per second of each stage between the points of its time series."""
    for s in stages:
        if len(s.series) >= 2:
            xs = [t for t, _ in s.series]
            rates = [
                (b - a) / (tb - ta) if tb > ta else 0.0
                for (ta, a), (tb, b) in zip(s.series, s.series[1:])
            ]
            axes.plot(xs[1:], rates, label=s.name)
    axes.set_ylabel("items/s")
    axes.set_xlabel("seconds")
    axes.set_title("throughput per stage")
    axes.legend(fontsize="small")


def _plot_times(axes: Any, stages: list[StageStats], bottleneck: str) -> None:
    """Each stage's own time and its wait for upstream, as stacked horizontal bars."""
    names = [s.name for s in stages]
    axes.barh(names, [s.own_seconds for s in stages], label="own")
    axes.barh(
        names,
        [s.wait_seconds for s in stages],
        left=[s.own_seconds for s in stages],
        label="waiting for upstream",
    )
    axes.invert_yaxis()
    axes.set_xlabel("seconds")
    axes.set_title(f"time per stage — bottleneck: {bottleneck}")
    axes.legend(fontsize="small")


def ignored_text(stage: StageStats) -> str:
    """``2 (sample indices 3, 8)``: how many items a stage dropped, and which.

    The list ends with ``...`` when it is not all of them: more than 16 indices were kept, or
    more items were dropped than indices kept (items without an index, or past the 1,000
    kept).

    Examples:
        >>> ignored_text(StageStats("ignore_errors", 5, 0.0, 0.0, 0.0, 0.0, ignored_errors=2,
        ...                         ignored_indices=[3, 8]))
        '2 (sample indices 3, 8)'
        >>> ignored_text(StageStats("ignore_errors", 5, 0.0, 0.0, 0.0, 0.0, ignored_errors=3,
        ...                         ignored_indices=[3, 8]))
        '3 (sample indices 3, 8, ...)'
    """
    shown = stage.ignored_indices[:16]
    if not shown:
        return str(stage.ignored_errors)
    more = len(stage.ignored_indices) > len(shown) or stage.ignored_errors > len(shown)
    listed = ", ".join(map(str, shown)) + (", ..." if more else "")
    return f"{stage.ignored_errors} (sample indices {listed})"


def efficiency_text(stage: StageStats) -> str:
    """``96.2% real tokens (1,924 of 2,000)``: how much of what a sequence stage made is real.

    Examples:
        >>> efficiency_text(StageStats("pack", 2, 0.0, 0.0, 0.0, 0.0, real_tokens=1924,
        ...                            padded_tokens=2000, efficiency=0.962))
        '96.2% real tokens (1,924 of 2,000)'
    """
    share = math.floor((stage.efficiency or 0.0) * 1000 + 1e-9) / 10  # rounded down
    return f"{share:.1f}% real tokens ({stage.real_tokens:,} of {stage.padded_tokens:,})"


def cache_text(stage: StageStats) -> str:
    """``900 hits, 100 misses (90% hits), 12.5 MB kept, about 1.80 s saved``.

    Examples:
        >>> cache_text(StageStats("cache", 1000, 0.0, 0.0, 0.0, 0.0, cache_hits=900,
        ...                       cache_misses=100, cache_bytes=12_500_000,
        ...                       cache_saved_seconds=1.8))
        '900 hits, 100 misses (90% hits), 12.5 MB kept, about 1.80 s saved'
    """
    asked = stage.cache_hits + stage.cache_misses
    share = _pct(stage.cache_hits / asked) if asked else "0%"
    return (
        f"{stage.cache_hits:,} hits, {stage.cache_misses:,} misses ({share} hits), "
        f"{stage.cache_bytes / 1e6:,.1f} MB kept, about {stage.cache_saved_seconds:.2f} s saved"
    )


def with_caches(stats: Stats, counts: dict[int, tuple[int, ...]]) -> Stats:
    """*stats* with the caches' *counts* (hits, misses, the misses' nanoseconds, bytes) on
    the rows of the stages that hold them, by row."""
    rows = list(stats.stages)
    for row, (hits, misses, miss_ns, kept) in counts.items():
        saved = hits * miss_ns / misses / 1e9 if misses else 0.0
        rows[row] = replace(
            rows[row],
            cache_hits=hits,
            cache_misses=misses,
            cache_bytes=kept,
            cache_saved_seconds=saved,
        )
    return replace(stats, stages=rows)


def _opt(value: float | None, fmt: str, scale: float = 1.0) -> str:
    if value is None:
        return "-"
    return fmt.format(value * scale if scale != 1.0 else value)


def _pct(fraction: float) -> str:
    """A whole percentage, rounded down: a value under a threshold never reads as reaching it
    (0.7996 is "79%", not "80%", next to "busy only")."""
    return f"{math.floor(fraction * 100 + 1e-9):d}%"


def _pct_opt(fraction: float | None) -> str:
    return "-" if fraction is None else _pct(fraction)


def _percentile(values: list[int], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] / 1e9


def summarize(record: LoaderRecord) -> Stats:
    """Turn what the watchers recorded into :class:`Stats`."""
    now = time.perf_counter_ns()
    wall = max(record.wall_ns, 1) / 1e9 if record.passes else 0.0
    since_start = (now - record.started) / 1e9
    stages: list[StageStats] = []
    upstream_busy = 0
    for rec in record.stages:
        stages.append(_stage_stats(rec, upstream_busy, record, wall))
        upstream_busy = rec.busy_ns
    waits = list(record.waits)
    # The consumer waits exactly while the last stage's iterator runs.
    wait_s = record.stages[-1].busy_ns / 1e9 if record.stages else 0.0
    fraction = wait_s / wall if wall else 0.0
    bottleneck, advice = diagnose(stages, fraction)
    return Stats(
        stages=stages,
        passes=record.passes,
        wall_seconds=wall if wall else since_start,
        consumer_wait_seconds=wait_s,
        consumer_wait_fraction=fraction,
        consumer_wait_p50=_percentile(waits, 0.5),
        consumer_wait_p99=_percentile(waits, 0.99),
        bottleneck=bottleneck,
        advice=advice,
    )


def _stage_stats(
    rec: StageRecord, upstream_busy: int, record: LoaderRecord, wall: float
) -> StageStats:
    """One stage's numbers: its own time is its span less its upstream's (*upstream_busy*)."""
    own = max(rec.busy_ns - upstream_busy, 0)
    wait = min(upstream_busy, rec.busy_ns)
    return StageStats(
        name=rec.name,
        items=rec.counted(),
        seconds=rec.busy_ns / 1e9,
        own_seconds=own / 1e9,
        wait_seconds=wait / 1e9,
        items_per_second=rec.counted() / wall if wall else 0.0,
        **(_worker_numbers(rec, max(record.wall_ns, 1)) if rec.workers > 0 else {}),
        series=[((t - record.started) / 1e9, n) for t, n, _ in rec.series],
        ignored_errors=rec.ignored,
        ignored_indices=list(rec.ignored_indices),
        real_tokens=rec.real_tokens,
        padded_tokens=rec.padded_tokens,
        efficiency=rec.real_tokens / rec.padded_tokens if rec.padded_tokens else None,
        auto=None if rec.auto is None else rec.auto.text(),
        auto_history=[] if rec.auto is None else rec.auto.steps(),
    )


def _worker_numbers(rec: StageRecord, active_ns: int) -> dict[str, Any]:
    """A parallel stage's numbers about its workers, over *active_ns* of passes."""
    tasks = list(rec.task_ns)
    # workers="auto": the count changed as it ran; its tuner knows each count's time
    if rec.auto is not None and rec.auto.fixed is None:  # a count that moved as it ran
        capacity = rec.auto.capacity() - rec.auto_base
    else:
        capacity = rec.workers * active_ns
    return {
        "workers": rec.workers,
        "worker_busy": min(rec.task_total_ns / max(capacity, 1), 1.0),
        "queue_occupancy": (
            rec.in_flight / rec.in_flight_samples / rec.max_in_flight
            if rec.in_flight_samples
            else None
        ),
        "item_seconds_p50": _percentile(tasks, 0.5),
        "item_seconds_p90": _percentile(tasks, 0.9),
        "item_seconds_p99": _percentile(tasks, 0.99),
    }


# The bottleneck rule's thresholds (see :func:`diagnose`).
CONSUMER_WAIT_LIMIT = 0.2
BUSY_WORKERS = 0.8
UPSTREAM_SHARE = 0.5
_PARALLEL = ("parallel_map", "parallel_source")


def diagnose(
    stages: list[StageStats], wait_fraction: float, knobs: Knobs = LOADER_KNOBS
) -> tuple[str, str]:
    """Name the bottleneck and say what to try: ``(bottleneck, advice)``, naming the settings
    as *knobs* words them.

    A fixed rule on the summed numbers, the same answer for the same numbers (no state from
    earlier calls), checked in this order:

    1. No stage yielded an item: ``"none"``.
    2. The consumer waited less than ``CONSUMER_WAIT_LIMIT`` (20 %) of the time the passes ran:
       ``"consumer"``. The training step sets the pace; a loader that never kept it waiting
       would save at most that fraction. (A few percent is normal: the first batch of a pass
       waits for the workers to start.)
    3. Otherwise the loader holds the consumer back, and the stage with the most *own* time
       is looked at (the first of equals):

       a. a single-threaded stage is the bottleneck: run it in ``pf.parallel_map`` (or, for
          a parallel stage with ``workers=0``, give it workers). A computed source (see
          :mod:`pipeflow.engine._plan`) runs no user code: it is looked at only when it is the
          only row, and then the rest is light;
       b. a parallel stage whose workers are busy ``BUSY_WORKERS`` (80 %) of the time or more
          is the bottleneck: more workers, or threads;
       c. a parallel stage whose workers are idle more, while the stage before it has at least
          ``UPSTREAM_SHARE`` (half) of its own time: that stage before it, which can't feed
          the workers;
       d. else the parallel stage: its workers wait for the main process (too little in
          flight, or decoding results).

    Each comparison is "at least the threshold": a value exactly at it takes the later branch
    (20 % waiting is loader-bound, 80 % busy needs more workers).

    Examples:
        >>> idle = StageStats("batch", 10, 0.1, 0.1, 0.0, 100.0)
        >>> diagnose([idle], 0.05)[0], diagnose([idle], 0.2)[0]
        ('consumer', 'batch')
    """
    if not stages or not any(s.items for s in stages):
        return "none", "nothing has run yet"
    if wait_fraction < CONSUMER_WAIT_LIMIT:
        return "consumer", (
            f"the training loop waited only {_pct(wait_fraction)} of the time (under "
            f"{_pct(CONSUMER_WAIT_LIMIT)}): the loader keeps up, and the model's step sets the pace"
        )
    waited = f"the training loop waited {_pct(wait_fraction)} of the time"
    # A computed source (pipeflow.engine._plan) runs no user code: it is looked at only when alone.
    candidates = [s for s in stages if not _computed(s)] or stages
    slowest = max(candidates, key=lambda s: s.own_seconds)
    if slowest.workers is None or slowest.worker_busy is None:
        return slowest.name, _one_thread_advice(slowest, stages, waited, knobs)
    if slowest.worker_busy >= BUSY_WORKERS:
        more = knobs.more_workers
        if slowest.auto is not None:  # the tuner already sized it: say what it found
            more = (
                f"{slowest.auto}: more did not pay or would not fit; make each item cheaper, "
                "give the process more CPUs, or set a count yourself"
            )
        return slowest.name, (
            f"{waited}; workers busy {_pct(slowest.worker_busy)} of the time; {more}"
        )
    at = stages.index(slowest)
    upstream = stages[at - 1] if at and not _computed(stages[at - 1]) else None
    if upstream is not None and upstream.own_seconds >= UPSTREAM_SHARE * slowest.own_seconds:
        return upstream.name, (
            f"{waited}; the workers of {slowest.name!r} are busy only "
            f"{_pct(slowest.worker_busy)} of the time: they wait for {upstream.name!r}, which "
            "runs in one thread"
        )
    return slowest.name, (
        f"{waited}; workers busy only {_pct(slowest.worker_busy)} of the time: "
        f"{knobs.in_flight}, or look at the main process's share (decoding results, the "
        "consumer)"
    )


def _computed(stage: StageStats) -> bool:
    """Whether *stage* is a source the loader computes (see :mod:`pipeflow.engine._plan`)."""
    return stage.name.endswith(" (computed)")


def _one_thread_advice(
    slowest: StageStats, stages: list[StageStats], waited: str, knobs: Knobs
) -> str:
    """What to try when the slowest stage runs in one thread (rule 3a of :func:`diagnose`)."""
    if _computed(slowest):  # the only row: no user code to move
        return (
            f"{waited}; the most time is in {slowest.name!r}, which the loader computes "
            "from positions: the stages after it (or the loop) are light, not slow"
        )
    share = slowest.own_seconds / max(sum(s.own_seconds for s in stages), 1e-12)
    # a parallel stage with workers=0 runs in the calling thread
    fix = knobs.give_workers if slowest.name in _PARALLEL else knobs.parallel
    return (
        f"{waited}; {_pct(share)} of the loader's time is spent in {slowest.name!r}, in one "
        f"thread; {fix}"
    )
