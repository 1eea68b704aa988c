"""``workers="auto"``: the pool sizes itself while it runs, and the data never changes.

The tuner's decisions depend on timing, so the properties are checked under a forced resize
schedule (:func:`pipeflow.parallel._auto.forced`: the count to use after *k* replies), which
drives the same resize path as the measurements do: for any backend and any schedule, the
output equals the fixed-count pipeline's (items, order, random draws), the process budget is
never exceeded (the process's children, counted during the pass), and a state taken after a
resize resumes exactly in a fresh loader.
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections import Counter
from typing import Any

import pytest
from conftest import children, nothing_left
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.errors import WorkerDiedError
from pipeflow.parallel import _auto
from pipeflow.parallel._auto import Tuner, cpus, forced


def jitter(x: int, rng: Any) -> tuple[int, int]:
    """A random stage inside the parallel one: its draw is keyed by position, not worker."""
    time.sleep((x % 3) / 2000)
    return x, int(rng.integers(1 << 30))


def slow_square(x: int) -> int:
    time.sleep((x % 4) / 2000)
    return x * x


def square_and_pid(x: int) -> tuple[int, int]:
    time.sleep(0.001)
    return x * x, os.getpid()


async def async_square(x: int) -> int:
    import asyncio

    await asyncio.sleep((x % 4) / 2000)
    return x * x


def kill_self_at_7(x: int) -> int:
    if x == 7:
        os.kill(os.getpid(), signal.SIGKILL)
    return x


def pipeline(n: int, workers: Any, backend: str, ordered: bool = True, **kw: Any) -> pf.Loader:
    work = pf.random_map(jitter, seed=3)
    return (
        pf.indices(n)
        | pf.shuffle(seed=5)
        | pf.parallel_map(work, workers=workers, backend=backend, ordered=ordered, seed=11, **kw)
    )


def kept(loader: pf.Loader, what: str) -> Any:
    """What the loader keeps for its parallel stage: its tuner ("auto"), its pool ("pool")."""
    return next(r[what] for r in loader.resources.values() if what in r)


def schedules() -> st.SearchStrategy[list[int]]:
    return st.lists(st.integers(1, 6), min_size=1, max_size=8)


def follow(counts: list[int], every: int) -> Any:
    """A resize schedule: ``counts[i]`` from the ``i * every``-th reply on, cycling."""
    return lambda k: counts[(k // every) % len(counts)]


# -- the data never changes -------------------------------------------------------------------
@given(
    counts=schedules(),
    every=st.integers(1, 9),
    backend=st.sampled_from(["thread", "process"]),
    ordered=st.booleans(),
    n=st.integers(0, 60),
)
@settings(max_examples=25, deadline=None)
def test_any_resize_schedule_gives_the_fixed_count_output(
    counts: list[int], every: int, backend: str, ordered: bool, n: int
) -> None:
    fixed = pipeline(n, 2, backend, ordered)
    want = [list(fixed), list(fixed)]  # two epochs
    auto = pipeline(n, "auto", backend, ordered)
    with forced(follow(counts, every)):
        got = [list(auto), list(auto)]
    if ordered:
        assert got == want
    else:
        assert list(map(Counter, got)) == list(map(Counter, want))
    auto.close()


@given(counts=schedules(), every=st.integers(1, 5), n=st.integers(0, 80))
@settings(max_examples=10, deadline=None)
def test_coroutine_loops_resize_without_changing_the_output(
    counts: list[int], every: int, n: int
) -> None:
    auto = pf.indices(n) | pf.parallel_map(async_square, workers="auto", seed=1)
    with forced(follow(counts, every)):
        assert list(auto) == [x * x for x in range(n)]


def test_the_measured_tuner_keeps_the_data_of_a_fixed_count() -> None:
    """No forced schedule: the tuner's own decisions (timing) never show in the data."""
    n = 400
    auto, fixed = pipeline(n, "auto", "thread"), pipeline(n, 3, "thread")
    for _ in range(2):
        assert list(auto) == list(fixed)
    assert auto.stats().stages[-1].auto is not None


# -- the budget -------------------------------------------------------------------------------
def test_process_workers_never_exceed_the_cpus_whatever_the_schedule(no_leaks: None) -> None:
    budget = cpus()
    before = children()
    seen = []
    loader = pf.indices(300) | pf.parallel_map(slow_square, workers="auto", backend="process")
    with forced(follow([1, budget + 3, 2, budget * 4, 1, budget], 13)):
        for _ in loader:
            seen.append(len(children() - before))
    assert max(seen) <= budget, seen
    assert max(seen) == min(budget, max(seen))  # it did run workers
    tuner = kept(loader, "auto")
    assert {s.workers for s in tuner.history} <= set(range(1, budget + 1))
    loader.close()


def test_two_auto_stages_share_the_cpus(no_leaks: None) -> None:
    """Each auto stage of processes gets what the others leave (at least one each)."""
    budget = cpus()
    before = children()
    seen = []
    loader = (
        pf.indices(200)
        | pf.parallel_map(slow_square, workers="auto", backend="process")
        | pf.parallel_map(abs, workers="auto", backend="process")
    )
    with forced(lambda k: budget * 2):
        for _ in loader:
            seen.append(len(children() - before))
    assert max(seen) <= max(budget, 2), seen
    loader.close()


# -- resumption -------------------------------------------------------------------------------
@given(
    counts=schedules(),
    every=st.integers(1, 7),
    backend=st.sampled_from(["thread", "process"]),
    ordered=st.booleans(),
    k=st.integers(0, 40),
)
@settings(max_examples=15, deadline=None)
def test_a_state_taken_after_a_resize_resumes_exactly_in_a_fresh_loader(
    counts: list[int], every: int, backend: str, ordered: bool, k: int
) -> None:
    n = 40
    auto = pipeline(n, "auto", backend, ordered)
    with forced(follow(counts, every)):
        it = iter(auto)
        head = [next(it) for _ in range(k)]
        state = json.loads(json.dumps(auto.state_dict()))
        it.close()
    fresh = pipeline(n, "auto", backend, ordered)
    fresh.load_state_dict(state)
    rest = list(fresh)
    whole = list(pipeline(n, 2, backend, ordered))
    if ordered:
        assert head + rest == whole
    else:
        assert Counter(head + rest) == Counter(whole)
        assert not set(head) & set(rest)
    auto.close()
    fresh.close()


def test_the_state_records_the_count_and_a_resumed_run_starts_there() -> None:
    auto = pipeline(50, "auto", "thread")
    with forced(lambda k: 5):
        it = iter(auto)
        [next(it) for _ in range(20)]
        state = auto.state_dict()
        it.close()
    (record,) = [r for r in state["stages"].values() if isinstance(r, dict) and "auto" in r]
    assert record["auto"] == 5
    fresh = pipeline(50, "auto", "thread")
    fresh.load_state_dict(state)
    it = iter(fresh)
    next(it)
    assert kept(fresh, "auto").count == 5
    it.close()


def test_a_state_with_a_count_out_of_range_is_refused() -> None:
    auto = pipeline(50, "auto", "thread")
    with forced(lambda k: 3):
        it = iter(auto)
        [next(it) for _ in range(10)]
        state = auto.state_dict()
        it.close()
    key = next(k for k, r in state["stages"].items() if isinstance(r, dict) and "auto" in r)
    for bad in (0, -1, 10**6, "2"):
        broken = json.loads(json.dumps(state))
        broken["stages"][key]["auto"] = bad
        with pytest.raises((ValueError, TypeError), match="auto"):
            pipeline(50, "auto", "thread").load_state_dict(broken)


# -- the reliability contract through resizes --------------------------------------------------
def test_a_worker_removed_mid_epoch_leaves_nothing_behind() -> None:
    with nothing_left():
        loader = pf.indices(200) | pf.parallel_map(
            square_and_pid, workers="auto", backend="process"
        )
        with forced(follow([2, 1, 2, 1], 25)):
            it = iter(loader)
            got = [next(it) for _ in range(120)]
            it.close()
        assert [y for y, _ in got] == [x * x for x in range(120)]
        assert len({pid for _, pid in got}) >= 3  # worker 1 left, and a new one took its place
        loader.close()


def test_a_workers_death_is_still_reported() -> None:
    loader = pf.indices(40) | pf.parallel_map(kill_self_at_7, workers="auto", backend="process")
    with forced(follow([1, 2], 3)), pytest.raises(WorkerDiedError, match=r"SIGKILL.*indices \[7"):
        list(loader)


def test_thread_workers_that_leave_are_not_taken_for_dead() -> None:
    """Threads leave as the count goes down (between two items), and are not counted as
    deaths; while items flow, no more run than the largest count plus those still ending
    their item."""
    loader = pf.indices(400) | pf.parallel_map(slow_square, workers="auto")
    alive = []
    with forced(follow([8, 1, 6, 2], 40)):
        for i, y in enumerate(loader):
            assert y == i * i
            pool = next(iter(kept(loader, "pool").passes.values()))
            alive.append(sum(t.is_alive() for t in pool.threads))
    assert max(alive) <= 8 + 8, alive
    assert min(alive[150:]) < 8  # some left


def test_threads_start_while_those_that_left_still_end() -> None:
    """Down to 1 and up to the cap again and again: threads start while those told to
    leave still end their items, so ids run past the pool's size for a moment."""
    loader = pf.indices(1200) | pf.parallel_map(slow_square, workers="auto")
    with forced(follow([_auto.AUTO_THREADS, 1], 7)):
        assert list(loader) == [x * x for x in range(1200)]


# -- what it says -----------------------------------------------------------------------------
def test_stats_and_repr_say_the_count_its_history_and_why() -> None:
    loader = pf.indices(100) | pf.parallel_map(slow_square, workers="auto")
    assert "workers='auto'" in repr(loader)
    with forced(follow([2, 4], 30)):
        list(loader)
    row = loader.stats().stages[-1]
    assert row.auto == "auto: 4 threads (forced (test hook))"
    assert row.workers == 4
    assert any("after 30 items: 4" in line for line in row.auto_history)
    assert "# parallel_map: auto: 4 threads" in repr(loader)
    assert "auto: 4 threads" in str(loader.stats())


def test_the_tuner_climbs_while_it_pays_and_stops_when_it_does_not() -> None:
    """The decision rule on given numbers (no timing): a doubling kept at 1.1x, fourfold
    when the consumer waited nearly all the window, undone short of it after a second
    window, and not tried again from there until the consumer's wait changes."""
    tuner = Tuner("threads", cap=16, shares_cpus=False, start=1)
    tuner.patience = 0
    assert tuner.decide(100.0, 0.5) and tuner.count == 2  # waited half: try twice as many
    assert tuner.decide(190.0, 0.95) and tuner.count == 8  # 1.9x: kept; nearly all: x4
    assert not tuner.decide(200.0, 0.8) and tuner.count == 8  # 1.05x: a second window
    assert tuner.decide(205.0, 0.8) and tuner.count == 2  # still short of 1.1x: back
    assert "8 read only" in tuner.text()
    tuner.patience = 0
    assert not tuner.decide(190.0, 0.85)  # no second try from 2 while the wait is the same
    assert tuner.decide(190.0, 0.5) and tuner.count == 4  # it changed: try again (x2)
    down = Tuner("threads", cap=8, shares_cpus=False, start=8)
    down.patience = 0
    assert down.decide(100.0, 0.0) and down.count == 4  # never waited: try fewer
    assert down.decide(99.0, 0.0) and down.count == 2  # the pace held: fewer again
    assert down.decide(60.0, 0.3) and down.count == 4  # fell behind: back
    assert "fell behind" in down.text()


def test_a_resize_of_processes_is_measured_once_its_workers_answered() -> None:
    """The window after a step up of processes is not judged until every worker of the new
    count has answered once (a start-up on a busy machine is not the count's rate)."""

    class Pool:
        ready = False

        def resize(self, count: int, in_flight: int) -> None:
            pass

        def answered(self, count: int) -> bool:
            return self.ready

    pool = Pool()
    tuner = Tuner("processes", cap=2, shares_cpus=True, start=1)
    tuner.begin(pool, 0)
    tuner.patience = 0
    assert tuner.decide(100.0, 0.9) and tuner.count == 2
    assert not tuner.decide(30.0, 0.9) and tuner.probe is not None  # still starting
    pool.ready = True
    assert not tuner.decide(30.0, 0.9) and tuner.probe is not None  # the window it was in
    assert not tuner.decide(180.0, 0.5) and tuner.count == 2  # judged: 1.8x, kept
    assert tuner.probe is None
    tuner.end()


# -- refused when built -----------------------------------------------------------------------
def test_auto_with_round_robin_is_refused() -> None:
    with pytest.raises(ValueError, match="workers='auto' needs round_robin=False"):
        pf.parallel_map(abs, workers="auto", round_robin=True)


def test_a_word_other_than_auto_is_refused() -> None:
    with pytest.raises(TypeError, match="workers must be an integer or 'auto' \\(got 'many'\\)"):
        pf.parallel_map(abs, workers="many")


def test_the_caps() -> None:
    assert pf.parallel_map(abs, workers="auto").config["settings"].workers == _auto.AUTO_THREADS
    proc = pf.parallel_map(abs, workers="auto", backend="process")
    assert proc.config["settings"].workers == cpus()


# -- parallel_source: a count per pass --------------------------------------------------------
class Shard:
    def __iter__(self) -> Any:
        info = pf.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, 300, step))


def test_a_source_chooses_its_count_once_and_reads_every_item_once() -> None:
    """A stream is split by worker: its count is one per CPU, kept for every pass (the
    passes' order is the fixed count's), whatever a resize schedule asks."""
    loader = pf.parallel_source(pf.from_iterable(Shard()), workers="auto", backend="thread")
    fixed = pf.parallel_source(pf.from_iterable(Shard()), workers=min(cpus(), 64), backend="thread")
    with forced(lambda k: 1):
        for _ in range(3):
            assert list(loader) == list(fixed)
    assert loader.stats().stages[0].auto.startswith(f"auto: {cpus()} thread")


def test_a_source_state_resumes_with_the_count_it_was_taken_with() -> None:
    source = pf.from_iterable(Shard())
    auto = pf.parallel_source(source, workers="auto", backend="thread", seed=2)
    it = iter(auto)
    head = [next(it) for _ in range(37)]
    state = json.loads(json.dumps(auto.state_dict()))
    it.close()
    fresh = pf.parallel_source(source, workers="auto", backend="thread", seed=2)
    fresh.load_state_dict(state)
    assert sorted(head + list(fresh)) == list(range(300))
