"""loader.stats(): the numbers, the bottleneck, the table, the plot (stats.py)."""

from __future__ import annotations

import json
import sys
import time

import pytest

import pipeflow as pf


def slow(x: int) -> int:
    time.sleep(0.002)
    return x


def test_counts_and_times_add_up() -> None:
    # (from_iterable: over indices(n), batch would cut its batches from the positions without
    # reading them, and indices would count no items.)
    loader = (
        pf.from_iterable(range(200)) | pf.batch(10) | pf.map(lambda b: [slow(i) for i in b[:2]])
    )
    for _ in range(2):
        list(loader)
    stats = loader.stats()
    assert [s.name for s in stats.stages] == ["from_iterable", "batch", "map"]
    assert [s.items for s in stats.stages] == [400, 40, 40]
    assert stats.passes == 2
    own = sum(s.own_seconds for s in stats.stages)
    # Fast stages are timed on a sample of their items: the sum is exact up to that estimate.
    assert own == pytest.approx(stats.stages[-1].seconds, rel=0.05)
    assert stats.consumer_wait_seconds <= stats.wall_seconds
    assert stats.stages[-1].own_seconds > 0.1  # 80 sleeps of 2 ms
    json.dumps(stats.to_dict())


def test_a_slow_single_threaded_stage_is_the_bottleneck() -> None:
    loader = pf.indices(60) | pf.map(slow) | pf.map(abs)
    list(loader)
    stats = loader.stats()
    assert stats.bottleneck == "map"
    assert "parallel_map" in stats.advice
    assert "bottleneck: map:" in str(stats)


def slower(x: int) -> int:
    time.sleep(0.01)
    return x


def test_busy_workers_are_the_bottleneck() -> None:
    # 10 ms items, so the hand-over between threads (~0.1 ms, more on a loaded machine) keeps
    # the workers well above the 80% "busy" threshold (2 ms items sat at 79-80%: a coin flip).
    loader = pf.indices(40) | pf.parallel_map(slower, workers=2)
    list(loader)
    s = loader.stats()
    par = s.stages[-1]
    assert par.workers == 2
    assert par.worker_busy is not None and par.worker_busy > 0.5
    # 10 ms of sleep per item; a busy core wakes the sleeper late, never early
    assert 0.009 <= par.item_seconds_p50 < 0.05
    assert par.queue_occupancy is not None and 0 < par.queue_occupancy <= 1
    assert s.bottleneck == "parallel_map" and "more workers" in s.advice


def test_a_slow_consumer_means_the_loader_keeps_up() -> None:
    loader = pf.indices(30) | pf.batch(3)
    for _ in loader:
        time.sleep(0.01)
    stats = loader.stats()
    assert stats.bottleneck == "consumer"
    assert stats.consumer_wait_fraction < 0.1


# -- the bottleneck rule at its boundaries (synthetic numbers: no timing) -------------------------
from pipeflow.stats import (  # noqa: E402
    BUSY_WORKERS,
    CONSUMER_WAIT_LIMIT,
    UPSTREAM_SHARE,
    LoaderRecord,
    StageStats,
    diagnose,
    ignored_text,
    summarize,
)

EPS = 1e-9


def stage(name: str, own: float, *, busy: float | None = None) -> StageStats:
    """A stage that yielded 10 items and spent *own* seconds in its own code."""
    return StageStats(
        name, 10, own, own, 0.0, 10.0, workers=None if busy is None else 2, worker_busy=busy
    )


def pipeline(busy: float, upstream_own: float = 0.0) -> list[StageStats]:
    """indices -> batch (upstream_own s) -> parallel_map (1 s of own time, workers *busy*)."""
    return [
        stage("indices", 0.0),
        stage("batch", upstream_own),
        stage("parallel_map", 1.0, busy=busy),
    ]


@pytest.mark.parametrize(
    ("wait", "want"),
    [
        (0.0, "consumer"),
        (0.10, "consumer"),  # the demo run: 10% waiting is not a loader bottleneck
        (CONSUMER_WAIT_LIMIT - EPS, "consumer"),
        (CONSUMER_WAIT_LIMIT, "parallel_map"),
        (CONSUMER_WAIT_LIMIT + EPS, "parallel_map"),
        (1.0, "parallel_map"),
    ],
)
def test_consumer_bound_below_the_wait_limit(wait, want) -> None:
    bottleneck, advice = diagnose(pipeline(busy=0.42), wait)
    assert bottleneck == want
    if want == "consumer":
        assert "keeps up" in advice and f"{wait:.0%}" in advice
    else:
        assert "raise max_in_flight" in advice


@pytest.mark.parametrize(
    ("busy", "advice"),
    [
        (BUSY_WORKERS - EPS, "raise max_in_flight"),
        (BUSY_WORKERS, "more workers"),
        (BUSY_WORKERS + EPS, "more workers"),
    ],
)
def test_busy_workers_need_more_workers_from_the_busy_threshold(busy, advice) -> None:
    bottleneck, text = diagnose(pipeline(busy), 0.5)
    assert bottleneck == "parallel_map" and advice in text


@pytest.mark.parametrize(
    ("upstream_own", "want"),
    [
        (UPSTREAM_SHARE - EPS, "parallel_map"),
        (UPSTREAM_SHARE, "batch"),
        (UPSTREAM_SHARE + EPS, "batch"),
    ],
)
def test_idle_workers_point_at_a_slow_stage_before_them(upstream_own, want) -> None:
    bottleneck, text = diagnose(pipeline(busy=0.5, upstream_own=upstream_own), 0.5)
    assert bottleneck == want
    if want == "batch":
        assert "they wait for 'batch'" in text


def test_busy_workers_win_over_a_slow_stage_before_them() -> None:
    assert diagnose(pipeline(busy=BUSY_WORKERS, upstream_own=0.9), 0.5)[0] == "parallel_map"


def test_a_single_threaded_stage_with_the_most_own_time() -> None:
    stages = [stage("indices", 0.1), stage("map", 0.3), stage("batch", 0.1)]
    assert diagnose(stages, 0.5) == (
        "map",
        "the training loop waited 50% of the time; 60% of the loader's time is spent in 'map', "
        "in one thread; run it in pf.parallel_map (threads for I/O, processes for Python-heavy work)",
    )


def test_a_parallel_stage_without_workers_is_told_to_get_some() -> None:
    stages = [stage("indices", 0.0), stage("parallel_map", 1.0)]  # workers=0: no worker stats
    bottleneck, advice = diagnose(stages, 0.5)
    assert bottleneck == "parallel_map"
    assert "give it workers" in advice and "run it in pf.parallel_map" not in advice


def test_equal_own_times_name_the_first_stage() -> None:
    assert diagnose([stage("a", 0.2), stage("b", 0.2)], 0.5)[0] == "a"


def test_nothing_ran_is_none() -> None:
    empty = [StageStats("indices", 0, 0.0, 0.0, 0.0, 0.0)]
    assert diagnose(empty, 1.0) == ("none", "nothing has run yet")
    assert diagnose([], 0.0)[0] == "none"


@pytest.mark.parametrize(
    ("wait_ns", "want", "shown"),
    [
        (199_999_999, "consumer", "19%"),  # rounded down: never reads as reaching 20%
        (200_000_000, "map", "20%"),
        (200_000_001, "map", "20%"),
    ],
)
def test_summarize_applies_the_rule_to_recorded_times(wait_ns, want, shown) -> None:
    # One pass of 1 s in which the last stage's iterator (the consumer's wait) ran wait_ns.
    record = LoaderRecord(["indices", "map"])
    record.passes, record.wall_ns = 1, 1_000_000_000
    for rec in record.stages:
        rec.items = 10
    record.stages[0].busy_ns = 1_000
    record.stages[1].busy_ns = wait_ns
    stats = summarize(record)
    assert stats.consumer_wait_fraction == wait_ns / 1e9
    assert stats.bottleneck == want
    assert f"bottleneck: {want}: " in str(stats)
    assert f"({shown}); per item" in str(stats) and f"waited {shown}" in stats.advice.replace(
        "only ", ""
    )


def test_the_table_explains_its_columns() -> None:
    loader = pf.indices(20) | pf.batch(4)
    list(loader)
    text = str(loader.stats())
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["stage", "items", "items/s"]
    for column in ("own s:", "wait s:", "busy:", "queue:"):
        assert column in text
    assert "Find the bottleneck with stats()" in lines[-1]
    assert max(len(line) for line in lines if not line.startswith("bottleneck:")) <= 100


def test_reset_stats() -> None:
    loader = pf.indices(10)
    list(loader)
    loader.reset_stats()
    assert loader.stats().stages[0].items == 0
    assert loader.stats().bottleneck == "none"


def test_plot_draws_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    loader = pf.indices(2000) | pf.batch(10) | pf.map(lambda b: time.sleep(0.001) or b)
    list(loader)
    path = tmp_path / "stats.png"
    loader.stats().plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    loader = pf.indices(3)
    list(loader)
    with pytest.raises(ImportError, match=r'pip install "pipeflow\[plot\]"'):
        loader.stats().plot("x.png")


def test_stats_cost_little_on_tiny_items() -> None:
    # Not a timing test: the recorded work per item is two clock reads and a few adds, and
    # here it is checked to be counted for every item of every stage.
    loader = pf.indices(1000) | pf.map(abs) | pf.map(abs)
    assert sum(1 for _ in loader) == 1000
    assert [s.items for s in loader.stats().stages] == [1000, 1000, 1000]


def _dropped(errors: int, indices: list[int]) -> StageStats:
    return StageStats(
        "ignore_errors", 5, 0.0, 0.0, 0.0, 0.0, ignored_errors=errors, ignored_indices=indices
    )


@pytest.mark.parametrize(
    ("errors", "indices", "text"),
    [
        (2, [3, 8], "2 (sample indices 3, 8)"),
        (1, [2, 3], "1 (sample indices 2, 3)"),  # a batch dropped whole: one item, two samples
        (3, [3, 8], "3 (sample indices 3, 8, ...)"),  # an item without indices was dropped too
        (16, list(range(16)), f"16 (sample indices {', '.join(map(str, range(16)))})"),
        (17, list(range(17)), f"17 (sample indices {', '.join(map(str, range(16)))}, ...)"),
        (2, [], "2"),
    ],
)
def test_ignored_text_ends_with_dots_when_it_lists_only_some(errors, indices, text) -> None:
    assert ignored_text(_dropped(errors, indices)) == text


def test_a_computed_source_is_the_bottleneck_only_when_alone() -> None:
    computed = StageStats("indices → shuffle (computed)", 128, 0.5, 0.5, 0.0, 100.0)
    workers = StageStats("parallel_map", 128, 0.6, 0.1, 0.5, 100.0, workers=8, worker_busy=0.5)
    # the computed source has more own time, but runs no user code, and feeds no workers
    assert diagnose([computed, workers], 0.9)[0] == "parallel_map"
    assert diagnose([computed], 0.9)[0] == "indices → shuffle (computed)"
    assert "which the loader computes" in diagnose([computed], 0.9)[1]


def test_the_time_series_stays_bounded_however_long_the_run() -> None:
    from pipeflow.stats import _POINTS, _SAMPLE_NS, StageRecord

    rec = StageRecord("s")
    for k in range(1, 50_001):  # 50,000 points due at the first spacing: 83 minutes' worth
        rec.items = k
        rec.sample(k * _SAMPLE_NS * 64)
    assert len(rec.series) < _POINTS
    times = [t for t, _, _ in rec.series]
    assert times == sorted(times) and rec.series[-1][1] >= 49_000  # spans the whole run


# -- pf.DataLoader.stats(): its advice in DataLoader terms (issue 27) -----------------------------
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from pipeflow.stats import DATALOADER_KNOBS  # noqa: E402

#: What a DataLoader has no such argument for: the advice must not name these.
LOADER_WORDS = ("max_in_flight", "give it workers", "pf.parallel_map", "thread backend")


@st.composite
def dataloader_rows(draw: st.DrawFn) -> list[StageStats]:
    """The rows a pf.DataLoader's pipeline has: the sampler, maybe batch, then fetch and
    collate (no workers) or parallel_map (workers), with any times and worker busy."""
    own = st.floats(0.0, 10.0)
    rows = [stage("from_sampler", draw(own))]
    if draw(st.booleans()):
        rows.append(stage("batch", draw(own)))
    if draw(st.booleans()):
        rows.append(stage("parallel_map", draw(own), busy=draw(st.floats(0.0, 1.0))))
    else:
        rows += [stage("fetch", draw(own)), stage("collate", draw(own))]
    return rows


@given(rows=dataloader_rows(), wait=st.floats(0.0, 1.0))
def test_dataloader_advice_names_only_dataloader_arguments(rows, wait) -> None:
    bottleneck, advice = diagnose(rows, wait, DATALOADER_KNOBS)
    assert bottleneck == diagnose(rows, wait)[0]  # the same diagnosis, in other words
    assert not any(word in advice for word in LOADER_WORDS), advice


@pytest.mark.parametrize(
    ("rows", "words"),
    [
        (pipeline(busy=0.42), "raise prefetch_factor"),
        (pipeline(busy=0.9), "raise num_workers"),
        ([stage("from_sampler", 0.0), stage("fetch", 1.0)], "set num_workers above 0"),
    ],
    ids=["idle workers", "busy workers", "no workers"],
)
def test_dataloader_advice_says_which_argument(rows, words) -> None:
    assert words in diagnose(rows, 0.5, DATALOADER_KNOBS)[1]


def test_dataloader_stats_speak_of_its_own_arguments() -> None:
    dl = pf.DataLoader(list(range(40)), batch_size=4, collate_fn=lambda b: [slow(i) for i in b])
    list(dl)
    stats = dl.stats()
    assert stats.bottleneck == "collate"
    assert "set num_workers above 0" in stats.advice
    text = str(stats)
    assert "queue: share of prefetch_factor x num_workers in use" in text
    assert "max_in_flight" not in text
    assert "knobs" not in stats.to_dict()  # the same keys as a loader's
    assert str(dl.pipeline().stats()).count("max_in_flight") == 1  # the loader's own words
