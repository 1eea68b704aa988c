"""Coroutine functions in ``parallel_map``: event loops in threads and in worker processes.

Checked against a plain oracle (``[fn(i) for i in items]``): ordering, exactly-once, the
in-flight bound, errors with their type and note, cancellation (``finally`` blocks run, loops
and workers gone within a second), resumption, statistics, and the stages that refuse a
coroutine function when they are built.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import gc
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.errors import WorkerTimeoutError
from tests.conftest import children

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = [pytest.param("thread", id="thread"), pytest.param("process", id="fork")]


# -- coroutine functions, at module level so they pickle ----------------------------------------
async def square(i: int) -> int:
    await asyncio.sleep((i * 7 % 5) * 0.0005)  # finish out of order
    return i * i


@dataclass(frozen=True)
class RaiseAt:
    """Raise at one index (after awaiting, as real I/O would)."""

    index: int

    async def __call__(self, i: int) -> int:
        await asyncio.sleep(0)
        if i == self.index:
            raise KeyError(f"no object {i}")
        return i


@dataclass(frozen=True)
class Hang:
    """Indices from *first* on wait (almost) forever; each leaves a file when it starts and
    one in its ``finally``."""

    folder: str
    first: int = 2

    async def __call__(self, i: int) -> int:
        if i < self.first:
            return i
        Path(self.folder, f"started-{i}").touch()
        try:
            await asyncio.sleep(60)
        finally:
            Path(self.folder, f"cancelled-{i}").touch()
        return i


@dataclass(frozen=True)
class StuckAt:
    """Every item takes *seconds*, but *index*, which waits (almost) forever."""

    index: int
    seconds: float

    async def __call__(self, i: int) -> int:
        await asyncio.sleep(60 if i == self.index else self.seconds)
        return i


class Gauge:
    """Counts the coroutines in flight, over every loop."""

    def __init__(self, delay: float) -> None:
        self.delay = delay
        self.lock = threading.Lock()
        self.now = self.peak = self.started = 0

    async def __call__(self, i: int) -> int:
        with self.lock:
            self.now += 1
            self.started += 1
            self.peak = max(self.peak, self.now)
        await asyncio.sleep(self.delay)
        with self.lock:
            self.now -= 1
        return i


def loop_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "-loop-" in t.name]


# -- ordering and completeness against the plain oracle -----------------------------------------
@given(
    n=st.integers(0, 60),
    workers=st.integers(1, 3),
    max_in_flight=st.none() | st.integers(1, 20),
    ordered=st.booleans(),
    round_robin=st.booleans(),
)
@example(n=0, workers=1, max_in_flight=None, ordered=True, round_robin=False)
@example(n=1, workers=3, max_in_flight=1, ordered=False, round_robin=False)
@example(n=60, workers=3, max_in_flight=2, ordered=True, round_robin=False)  # loops without share
@settings(max_examples=30, deadline=None)
def test_threads_match_the_plain_map_within_both_bounds(
    n, workers, max_in_flight, ordered, round_robin
) -> None:
    """The plain map's results; never more than max_in_flight coroutines running, nor more
    than twice as many items started and not yet consumed."""
    gauge = Gauge(0.002)
    stage = pf.parallel_map(
        gauge,
        workers=workers,
        max_in_flight=max_in_flight,
        ordered=ordered,
        round_robin=round_robin,
    )
    bound = max_in_flight or 64 * workers
    got = []
    for x in pf.indices(n) | stage:
        got.append(x)
        with gauge.lock:
            started = gauge.started
        assert started - len(got) <= 2 * bound
    want = list(range(n))  # what map(gauge, range(n)) gives
    assert got == want if ordered else sorted(got) == want
    assert gauge.peak <= bound


@given(
    n=st.integers(0, 40),
    workers=st.integers(1, 2),
    max_in_flight=st.none() | st.integers(1, 20),
    ordered=st.booleans(),
)
@example(n=0, workers=2, max_in_flight=None, ordered=True)
@settings(max_examples=8)
def test_processes_match_the_plain_map(n, workers, max_in_flight, ordered) -> None:
    stage = pf.parallel_map(
        square, workers=workers, backend="process", max_in_flight=max_in_flight, ordered=ordered
    )
    got = list(pf.indices(n) | stage)
    want = [i * i for i in range(n)]
    assert got == want if ordered else sorted(got) == want


def test_no_worker_awaits_in_the_calling_thread() -> None:
    assert list(pf.indices(4) | pf.parallel_map(square, workers=0)) == [0, 1, 4, 9]


def test_a_callable_object_and_a_partial_are_coroutine_functions_too(no_leaks) -> None:
    async def scaled(i: int, k: int) -> int:
        await asyncio.sleep(0)
        return i * k

    by_object = pf.parallel_map(RaiseAt(-1), workers=1)
    by_partial = pf.parallel_map(functools.partial(scaled, k=3), workers=2)
    assert list(pf.indices(5) | by_object) == [0, 1, 2, 3, 4]
    assert list(pf.indices(5) | by_partial) == [0, 3, 6, 9, 12]


def test_max_in_flight_bounds_the_coroutines_over_all_loops(no_leaks) -> None:
    gauge = Gauge(0.01)
    loader = pf.indices(200) | pf.parallel_map(gauge, workers=3, max_in_flight=24)
    assert list(loader) == list(range(200))
    assert gauge.peak == 24  # reached, never passed: one loop holds many at once


def test_the_default_bound_lets_each_loop_hold_many(no_leaks) -> None:
    gauge = Gauge(0.05)
    list(pf.indices(300) | pf.parallel_map(gauge, workers=2, ordered=False))
    assert gauge.peak == 128  # 64 per loop


async def slow_first(i: int) -> int:
    await asyncio.sleep(0.3 if i == 0 else 0.001)
    return i


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_slow_coroutine_does_not_hold_back_the_others_unordered(backend, no_leaks) -> None:
    stage = pf.parallel_map(slow_first, workers=2, backend=backend, ordered=False)
    got = list(pf.indices(30) | stage)
    assert sorted(got) == list(range(30))
    assert got[-1] == 0


async def big(i: int) -> Any:
    import numpy as np

    await asyncio.sleep(0.001)
    return np.full((128, 256), i, dtype=np.float64)  # 256 kB: through shared memory


def test_large_results_come_back_through_shared_memory(no_leaks) -> None:
    loader = pf.indices(40) | pf.parallel_map(big, workers=2, backend="process", max_in_flight=16)
    for i, array in enumerate(loader):
        assert array.shape == (128, 256) and (array == i).all()


@pytest.mark.slow
@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_coroutine_workers_start_with_spawn_and_forkserver(method, no_leaks) -> None:
    stage = pf.parallel_map(square, workers=2, backend="process", mp_context=method)
    assert list(pf.indices(20) | stage) == [i * i for i in range(20)]


async def die_at_five(i: int) -> int:
    await asyncio.sleep(0.001)
    if i == 5:
        os.kill(os.getpid(), signal.SIGKILL)
    return i


def test_a_dying_coroutine_worker_is_named(no_leaks) -> None:
    loader = pf.indices(40) | pf.parallel_map(die_at_five, workers=2, backend="process")
    with pytest.raises(pf.WorkerDiedError, match=r"was killed by signal SIGKILL") as info:
        list(loader)  # (a wait instead would end at the test's timeout, not here)
    assert "pid " in str(info.value) and "5" in str(info.value)


# -- errors -------------------------------------------------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
def test_an_error_keeps_its_type_names_the_item_and_the_pass_goes_on(backend, no_leaks) -> None:
    it = iter(pf.indices(8) | pf.parallel_map(RaiseAt(3), workers=2, backend=backend))
    assert [next(it) for _ in range(3)] == [0, 1, 2]
    with pytest.raises(KeyError, match="no object 3") as info:
        next(it)
    assert list(it) == [4, 5, 6, 7]  # the next next() goes on with the next item
    note = "\n".join(info.value.__notes__)
    assert "stage 'parallel_map' failed on sample index 3 (epoch 0" in note
    assert ("thread worker" if backend == "thread" else "worker") in note
    if backend == "process":
        assert "test_async.py" in str(info.value.__cause__)  # the worker's own traceback


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("ordered", [True, False])
def test_ignore_errors_drops_the_failed_coroutines_items(backend, ordered, no_leaks) -> None:
    stage = pf.parallel_map(RaiseAt(3), workers=2, backend=backend, ordered=ordered)
    loader = pf.indices(8) | stage | pf.ignore_errors(exceptions=KeyError)
    got = list(loader)
    assert got == [0, 1, 2, 4, 5, 6, 7] if ordered else sorted(got) == [0, 1, 2, 4, 5, 6, 7]


async def exit_at_two(i: int) -> int:
    if i == 2:
        raise SystemExit(3)
    return i


@pytest.mark.parametrize("backend", BACKENDS)
def test_system_exit_in_a_coroutine_reaches_the_consumer(backend, no_leaks) -> None:
    with pytest.raises(SystemExit):
        list(pf.indices(5) | pf.parallel_map(exit_at_two, workers=1, backend=backend))


def test_no_result_within_the_timeout_names_the_items_in_flight(tmp_path, no_leaks) -> None:
    loader = pf.indices(4) | pf.parallel_map(Hang(str(tmp_path), 1), workers=1, timeout=0.3)
    with pytest.raises(WorkerTimeoutError, match=r"in flight: sample indices \[1, 2, 3\]"):
        list(loader)


@pytest.mark.parametrize("ordered", [False, True], ids=["unordered", "ordered"])
@pytest.mark.parametrize("backend", BACKENDS)
def test_a_stuck_coroutine_is_reported_before_the_others_drain_the_input(
    backend, ordered, no_leaks
) -> None:
    """Issue 37, for coroutines: the timeout counts from when the stuck item began on its
    loop, whatever the other coroutines deliver meanwhile. 1,200 items of 50 ms, 6 at once,
    need 10 s: before, unordered, the error came once they had all been delivered."""
    n = 1200
    stage = pf.parallel_map(
        StuckAt(5, 0.05), workers=3, backend=backend, ordered=ordered, max_in_flight=6, timeout=1
    )
    got: list[int] = []
    with pytest.raises(WorkerTimeoutError, match=r"no result within timeout=1\.0 s") as info:
        collections.deque(map(got.append, pf.indices(n) | stage), 0)
    # About 100 items a second for a second came before the error, not all 1,199.
    assert len(got) < n // 2, len(got)
    assert 5 in info.value.undelivered


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_consumer_slower_than_the_timeout_times_out_no_coroutine(backend, no_leaks) -> None:
    """Items of 20 ms, ``timeout=0.2``, a consumer that takes 0.3 s per result: an item
    counts from when it began on its loop (and an item waiting on a loop for a running one
    to end has not begun), never the time the consumer held results."""
    stage = pf.parallel_map(
        StuckAt(-1, 0.02), workers=1, backend=backend, max_in_flight=2, timeout=0.2
    )
    got = []
    for x in pf.indices(8) | stage:
        time.sleep(0.3)
        got.append(x)
    assert got == list(range(8))


def test_a_failing_worker_init_is_named(no_leaks) -> None:
    def init(wid: int) -> None:
        raise OSError("no credentials")

    with pytest.raises(OSError, match="no credentials") as info:
        list(pf.indices(3) | pf.parallel_map(square, workers=1, worker_init=init))
    assert "pipeflow: worker_init in event-loop thread 0 failed" in info.value.__notes__


READY: dict[str, Any] = {}  # worker_init's mark, per process and loop thread


def here() -> str:
    return f"{os.getpid()}-{threading.get_ident()}"


async def slow_init(wid: int) -> None:
    await asyncio.sleep(0.05)  # items arrive meanwhile: they wait for it
    READY[here()] = asyncio.get_running_loop()


async def init_done(i: int) -> bool:
    return READY.get(here()) is asyncio.get_running_loop()


async def failing_init(wid: int) -> None:
    await asyncio.sleep(0)
    raise OSError("no credentials")


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_async_worker_init_runs_on_the_loop_before_its_first_item(backend, no_leaks) -> None:
    stage = pf.parallel_map(init_done, workers=2, backend=backend, worker_init=slow_init)
    assert list(pf.indices(40) | stage) == [True] * 40


def test_an_async_worker_init_for_a_plain_function_is_refused_when_built() -> None:
    with pytest.raises(TypeError, match="worker_init must be a plain function"):
        pf.parallel_map(abs, workers=1, worker_init=slow_init)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_failing_async_worker_init_is_named(backend, no_leaks) -> None:
    stage = pf.parallel_map(square, workers=1, backend=backend, worker_init=failing_init)
    with pytest.raises(OSError, match="no credentials") as info:
        list(pf.indices(3) | stage)
    assert any("worker_init" in note for note in info.value.__notes__)


class MarkedLoop(asyncio.SelectorEventLoop):
    """An event loop a policy makes (as uvloop's policy makes its own)."""


class MarkedPolicy(asyncio.DefaultEventLoopPolicy):
    def new_event_loop(self) -> asyncio.AbstractEventLoop:
        return MarkedLoop()


async def loop_kind(i: int) -> str:
    return type(asyncio.get_running_loop()).__name__


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_loops_follow_the_event_loop_policy(backend, no_leaks) -> None:
    old = asyncio.get_event_loop_policy()
    asyncio.set_event_loop_policy(MarkedPolicy())
    try:  # a fork worker inherits the policy; spawn's would set it in worker_init
        stage = pf.parallel_map(loop_kind, workers=2, backend=backend)
        assert set(pf.indices(8) | stage) == {"MarkedLoop"}
    finally:
        asyncio.set_event_loop_policy(old)


# -- cancellation: finally blocks run, nothing is left --------------------------------------------
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("how", ["break", "close", "gc"])
def test_stopping_early_cancels_the_coroutines_in_flight(tmp_path, backend, how, no_leaks) -> None:
    loader = pf.indices(100) | pf.parallel_map(
        Hang(str(tmp_path)), workers=2, backend=backend, max_in_flight=6
    )
    if how == "break":
        got = []
        for x in loader:  # CPython drops the iterator at the break: its finally runs at once
            got.append(x)
            if len(got) == 2:
                wait_for(lambda: marks(tmp_path)[0])
                break
    else:
        it = iter(loader)
        got = [next(it), next(it)]
        wait_for(lambda: marks(tmp_path)[0])  # hanging ones are in flight
        if how == "close":
            it.close()
        else:
            del it
            gc.collect()
    assert got == [0, 1]
    started, cancelled = marks(tmp_path)
    # every coroutine in flight ran its finally: cancelled, not left hanging past a grace
    assert started and started == cancelled
    assert not loop_threads()


def marks(folder: Path) -> tuple[list[int], list[int]]:
    """The indices whose coroutines started, and those whose ``finally`` ran."""
    names = [p.name.split("-") for p in folder.iterdir()]
    return (
        sorted(int(i) for what, i in names if what == "started"),
        sorted(int(i) for what, i in names if what == "cancelled"),
    )


def test_a_persistent_pool_cancels_an_abandoned_pass_at_the_next(tmp_path, no_leaks) -> None:
    hang = Hang(str(tmp_path), first=3)
    loader = pf.indices(5) | pf.parallel_map(hang, workers=1, max_in_flight=4, persistent=True)
    it = iter(loader)
    assert next(it) == 0
    wait_for(lambda: marks(tmp_path)[0] == [3, 4])  # 4 started as 0, 1 and 2 ended
    it.close()
    time.sleep(0.05)
    assert marks(tmp_path) == ([3, 4], [])  # the pool and its coroutines are kept...
    it = iter(loader)
    assert next(it) == 0
    wait_for(lambda: marks(tmp_path)[1] == [3, 4])  # ...until the next pass starts
    it.close()
    loader.close()
    assert not loop_threads()


async def slow_from_two(i: int) -> int:
    await asyncio.sleep(0.2 if i >= 2 else 0)
    return i


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_persistent_pool_delivers_whole_epochs_after_abandoned_ones(backend, no_leaks) -> None:
    stage = pf.parallel_map(
        slow_from_two, workers=1, backend=backend, max_in_flight=8, persistent=True
    )
    loader = pf.indices(10) | stage
    for _ in range(3):  # each pass abandoned with coroutines in flight and tasks queued
        it = iter(loader)
        assert next(it) == 0
        it.close()
    # whole epochs, none of the abandoned passes' results among them (that their coroutines
    # are cancelled, the test above shows by their finally blocks)
    assert list(loader) == list(range(10))
    assert list(loader) == list(range(10))
    loader.close()


def wait_for(condition: Any, budget: float = 30.0) -> None:
    deadline = time.monotonic() + budget
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.01)


# -- resumption and statistics ----------------------------------------------------------------
@pytest.mark.parametrize(
    ("backend", "ordered"), [("thread", True), ("thread", False), ("process", False)]
)
def test_resume_mid_epoch_yields_exactly_the_rest(backend, ordered, no_leaks) -> None:
    def make() -> pf.Loader:
        stage = pf.parallel_map(square, workers=2, backend=backend, ordered=ordered, seed=1)
        return pf.indices(50) | stage | pf.batch(4)

    first = make()
    it = iter(first)
    got = [next(it) for _ in range(5)]
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = make()
    second.load_state_dict(state)
    got += list(second)
    second.close()
    flat = [x for batch in got for x in batch]
    want = [i * i for i in range(50)]
    assert flat == want if ordered else sorted(flat) == want


def test_stats_show_the_coroutines_in_flight(no_leaks) -> None:
    async def wait(i: int) -> int:
        await asyncio.sleep(0.003)
        return i

    loader = pf.indices(400) | pf.parallel_map(wait, workers=2, max_in_flight=64)
    assert len(list(loader)) == 400
    stage = next(s for s in loader.stats().stages if s.name == "parallel_map")
    assert stage.workers == 2
    assert stage.queue_occupancy is not None and stage.queue_occupancy > 0.5
    assert stage.item_seconds_p50 is not None and stage.item_seconds_p50 >= 0.003


# -- where nothing can await a coroutine function: refused when the stage is built ---------------
async def load(i: int) -> int:
    return i


async def agen(items: Any) -> Any:
    for x in items:
        yield x


def _async_generator_stage() -> Any:
    return pf.stage(agen)


def _async_stage() -> Any:
    async def per_batch(items: Any) -> Any:
        return items

    return pf.stage(per_batch)


class AsyncTable:
    async def __getitem__(self, i: int) -> int:
        return i


REFUSED = {
    "fetch-async-getitem": lambda: pf.fetch(AsyncTable()),
    "map": lambda: pf.map(load),
    "map-partial": lambda: pf.map(functools.partial(load)),
    "map-object": lambda: pf.map(RaiseAt(0)),
    "filter": lambda: pf.filter(load),
    "random_map": lambda: pf.random_map(load, seed=0),
    "collate": lambda: pf.collate(load),
    "stage-async-def": _async_stage,
    "stage-async-generator": _async_generator_stage,
    "parallel_map-of-a-stage": lambda: pf.parallel_map(
        pf.Stage(lambda items, fn: map(fn, items), "map", {"fn": load}, length="same")
        | pf.collate(),
        workers=2,
    ),
}


@pytest.mark.parametrize("build", REFUSED.values(), ids=REFUSED.keys())
def test_a_coroutine_function_nothing_awaits_is_refused_when_built(build) -> None:
    with pytest.raises(TypeError, match=r"pf\.parallel_map\(fn, workers=\.\.\.\)"):
        build()


# -- Ctrl-C: a real SIGINT to the process group -------------------------------------------------
SCRIPT = """
import signal
import sys
import pipeflow as pf
# a shell's background job starts with SIGINT ignored, and a child inherits that: take it back
signal.signal(signal.SIGINT, signal.default_int_handler)
from tests.test_async import Hang
backend, folder = sys.argv[1], sys.argv[2]
loader = pf.indices(100) | pf.parallel_map(Hang(folder), workers=2, backend=backend, max_in_flight=4)
it = iter(loader)
next(it), next(it)
print("started", flush=True)
next(it)
"""


@pytest.mark.slow
@pytest.mark.parametrize("backend", BACKENDS)
def test_ctrl_c_cancels_the_coroutines_and_stops_everything(tmp_path, backend) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", SCRIPT, backend, str(tmp_path)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "started\n"
    time.sleep(0.3)  # the hanging coroutines are in flight, the second worker started
    workers = children(proc.pid)
    assert len(workers) == (2 if backend == "process" else 0)
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail("hung after Ctrl-C")
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "KeyboardInterrupt" in err
    started, cancelled = marks(tmp_path)
    assert started == cancelled and len(started) >= 2
    wait_for(lambda: not any(os.path.exists(f"/proc/{pid}") for pid in workers))
