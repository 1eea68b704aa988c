"""What runs around each stage in a pass (``pipeflow/engine/_wrappers.py``): the error wrapper and
its meter (counts and sampled times), resume cuts, and the consumer's iterator."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Iterator
from typing import Any

import pytest

import pipeflow as pf
from pipeflow.engine._failure import Failure
from pipeflow.engine._wrappers import Meter, Pass, Route, cut, guarded, remembering
from pipeflow.errors import StageStuckError
from pipeflow.stats import StageRecord


def _raising_at(items: list[int], bad: set[int]) -> Iterator[int]:
    """A map-like iterator (not a generator: it goes on after raising)."""
    it = iter(items)

    class _It:
        def __iter__(self) -> _It:
            return self

        def __next__(self) -> int:
            x = next(it)
            if x in bad:
                raise ValueError(f"bad {x}")
            return x

    return _It()


def test_guarded_turns_an_exception_into_a_failure_in_the_items_place() -> None:
    out = list(guarded(_raising_at([0, 1, 2, 3], {2}), Route("m", 5)))
    assert out[:2] == [0, 1] and out[3] == 3
    failure = out[2]
    assert isinstance(failure, Failure) and isinstance(failure.error, ValueError)
    assert failure.error.__notes__ == ["pipeflow: stage 'm' failed on item 2 (epoch 5)"]


def test_guarded_names_the_keys_a_dataset_stage_read() -> None:
    keys: list[Any] = [None]
    source = remembering(iter([10, 11, 12]), keys)

    def fetch(ks: Iterator[int]) -> Iterator[int]:
        for k in ks:
            if k == 11:
                raise KeyError(k)
            yield k

    out = list(guarded(fetch(source), Route("fetch", 0, keys)))
    assert out[0] == 10 and isinstance(out[1], Failure)
    assert out[1].indices == (11,)
    assert "sample index 11" in out[1].error.__notes__[0]


def test_guarded_routes_failures_around_a_stage_that_takes_none() -> None:
    stash: deque[Failure] = deque()
    first = list(guarded(_raising_at([0, 1, 2], {1}), Route("a", 0, stash=stash)))
    assert first == [0, 2] and len(stash) == 1  # set aside, not handed to the next stage
    # ...and out before the next stage's next item
    second = list(guarded(iter(["x", "y"]), Route("b", 0, bypassed=stash)))
    assert second[1:] == ["x", "y"] and isinstance(second[0], Failure) and not stash


def test_guarded_ends_a_stream_that_raises_on_every_next() -> None:
    class Broken:
        def __iter__(self) -> Broken:
            return self

        def __next__(self) -> int:
            raise OSError("gone")

    stash: deque[Failure] = deque()
    assert list(guarded(Broken(), Route("src", 0, stash=stash))) == []
    assert isinstance(stash[-1].error, StageStuckError)
    assert len(stash) == 1001


def test_a_meter_counts_every_item_and_leaves_them_as_they_are() -> None:
    rec = StageRecord("s")
    assert list(guarded(iter(range(5000)), Route("s", 0), Meter(rec))) == list(range(5000))
    assert rec.items == 5000 and rec.busy_ns > 0


def test_a_meter_counts_failures_as_items() -> None:
    rec = StageRecord("s")
    out = list(guarded(_raising_at(list(range(10)), {3, 4}), Route("s", 0), Meter(rec)))
    assert len(out) == rec.items == 10


def test_a_meter_counts_what_an_early_close_left() -> None:
    rec = StageRecord("s")
    it = guarded(iter(range(100)), Route("s", 0), Meter(rec))
    for _ in range(7):
        next(it)
    it.close()
    assert rec.items == 7


def test_cut_drops_what_a_resumed_pass_replayed() -> None:
    assert list(cut(iter(range(6)), 4)) == [4, 5]


# -- through a loader -------------------------------------------------------------------
def slow_every(n_items: int, every: int, pause: float) -> Iterator[int]:
    for i in range(n_items):
        if i % every == 0:
            time.sleep(pause)
        yield i


def test_fast_items_are_counted_exactly_and_timed_on_a_sample() -> None:
    """Counts are exact; own times are sampled estimates, never negative, and positive for
    every stage. One pass on a machine at load 9 read 0 for a stage once (a preempted sample
    can cancel the little a fast stage adds), so a stage is asked for a positive estimate in
    one of three passes: a meter that reads 0 by construction (the bug this test found) does
    in all three."""
    positive: set[int] = set()
    for _ in range(3):
        loader = pf.indices(200_000) | pf.map(abs)
        assert sum(1 for _ in loader) == 200_000
        stats = loader.stats()
        assert [s.items for s in stats.stages] == [200_000, 200_000]
        assert all(s.own_seconds >= 0 for s in stats.stages)
        positive |= {i for i, s in enumerate(stats.stages) if s.own_seconds > 0}
        if positive == {0, 1}:
            break
    assert positive == {0, 1}


def test_sampled_estimates_nest_along_the_chain() -> None:
    """Each stage's span holds the one above it, sampled or not, and the consumer waited no
    longer than the pass took. A sampled span that held the meter's own work, 64 times, broke
    both: ``map`` read 5 times ``batch`` after it, the consumer "waited 269%". Sampled
    estimates move 5-10% from pass to pass (``batch`` over ``map`` read 0.95-1.6), so the
    bounds leave 20-25%."""
    two = pf.indices(200_000) | pf.map(abs)
    assert sum(1 for _ in two) == 200_000
    stats = two.stats()
    assert stats.consumer_wait_seconds <= 1.25 * stats.wall_seconds
    three = pf.indices(200_000) | pf.map(abs) | pf.batch(64)
    assert sum(len(b) for b in three) == 200_000
    indices, mapped, batched = (s.seconds for s in three.stats().stages)
    assert indices < mapped and batched >= 0.8 * mapped, (indices, mapped, batched)


def test_a_sampled_spike_stands_for_itself() -> None:
    """A wait for the GIL on one sampled item is counted once, not once per item it stood for;
    every item is timed again after it, and sampling comes back later than the first time."""
    rec = StageRecord("s")
    meter = Meter(rec)
    fast, slow = 10_000, 20_000_000  # ns
    n_items, mark, spiked = 100_000, 0, False
    for n in range(n_items):
        if n != mark:
            continue
        if meter.sampling and n > n_items // 2 and not spiked:
            spiked, calm = True, meter.calm  # (4, unless the machine made a spike already)
            mark = meter.took(n, time.perf_counter_ns() - slow - meter.null)
            assert mark == n + 1 and not meter.sampling  # every item timed again
            assert meter.calm == min(2 * calm, 64)  # twice as many fast windows to sample
        else:
            mark = meter.took(n, time.perf_counter_ns() - fast - meter.null)
    meter.done(n_items, None)
    assert spiked
    expected = (n_items - 1) * fast + slow
    assert expected * 0.9 < rec.busy_ns < expected * 1.3  # not 64 x 20 ms more


def test_a_rare_cost_is_estimated() -> None:
    """A cost every 1000 fast items, rarer than a window: timed every time, since sampling
    starts after four fast windows (after one, as first built, it read 0.3x in a third of
    the runs: the cost then hid between the sampled items)."""
    for _ in range(6):  # each pass's meters draw other gaps
        slept: list[float] = []
        src = pf.from_iterable(_Timed(100_000, 1_000, 0.0005, slept)) | pf.map(abs)
        list(src)
        own = src.stats().stages[0].own_seconds
        assert 0.5 * sum(slept) < own < 1.5 * sum(slept) + 0.05  # + the fast items' own


class _Timed:
    """:func:`slow_every`'s items, the pauses' real length kept in *slept*."""

    def __init__(self, n: int, every: int, pause: float, slept: list[float]) -> None:
        self.args, self.slept = (n, every, pause), slept

    def __iter__(self) -> Iterator[int]:
        n, every, pause = self.args
        for i in range(n):
            if i % every == 0:
                t = time.perf_counter()
                time.sleep(pause)
                self.slept.append(time.perf_counter() - t)
            yield i


def test_slow_items_are_all_timed() -> None:
    loader = pf.from_iterable(range(30)) | pf.map(lambda i: time.sleep(0.002) or i)
    list(loader)
    mapped = loader.stats().stages[1]
    assert mapped.items == 30
    assert mapped.own_seconds >= 30 * 0.002  # nothing estimated: every item was timed


def test_a_sampled_estimate_sees_a_periodic_cost() -> None:
    """A cost every 64 items is neither always hit nor always missed by the sampling gaps."""
    src = pf.from_iterable(_Periodic(5_000, 64, 0.0005))
    list(src)
    own = src.stats().stages[0].own_seconds
    expected = 5_000 / 64 * 0.0005
    assert 0.3 * expected < own < 3 * expected


class _Periodic:
    def __init__(self, n: int, every: int, pause: float) -> None:
        self.args = (n, every, pause)

    def __iter__(self) -> Iterator[int]:
        return slow_every(*self.args)


def test_the_consumers_iterator_raises_a_failure_and_goes_on() -> None:
    it = iter(pf.indices(4) | pf.map(lambda i: 1 // (i - 1)))
    assert isinstance(it, Pass)
    assert next(it) == -1
    try:
        next(it)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the failed item did not raise")
    assert list(it) == [1, 0]


class _HoldFirst:
    """A map function that holds item 0 until told: meanwhile another thread calls next()."""

    def __init__(self) -> None:
        self.inside = threading.Event()
        self.go_on = threading.Event()

    def __call__(self, i: int) -> int:
        if i == 0:
            self.inside.set()
            assert self.go_on.wait(10)
        return i


def test_a_second_concurrent_next_is_refused_and_the_pass_goes_on() -> None:
    hold = _HoldFirst()
    it = iter(pf.indices(10) | pf.map(hold))
    first: list[int] = []
    reader = threading.Thread(target=lambda: first.append(next(it)))
    reader.start()
    assert hold.inside.wait(10)
    try:
        with pytest.raises(RuntimeError, match="another next\\(\\) on it was running") as info:
            next(it)  # the reader's next() is running: refused, nothing taken
    finally:
        hold.go_on.set()
        reader.join(10)
    assert "goes on" in str(info.value)
    assert first == [0]
    assert list(it) == list(range(1, 10))  # the pass was not closed: every item, once


def _yield_gil(i: int) -> int:
    time.sleep(0)  # lets the other thread in while this one is inside next()
    return i


def test_two_threads_reading_one_pass_get_every_item_once_or_a_clear_refusal() -> None:
    it = iter(pf.indices(300) | pf.map(_yield_gil))
    got: list[list[int]] = [[], []]
    refused: list[int] = [0, 0]
    messages: set[str] = set()

    def read(k: int) -> None:
        while True:
            try:
                got[k].append(next(it))
            except StopIteration:
                return
            except RuntimeError as e:  # the other thread was in next(): nothing was taken
                messages.add(str(e))
                refused[k] += 1
                time.sleep(0.001)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(got[0] + got[1]) == list(range(300))
    assert sum(refused) > 0  # they did collide (sleep(0) lets the other in at every item)
    assert all("another next() on it was running" in m for m in messages)
