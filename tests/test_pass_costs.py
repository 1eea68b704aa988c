"""No fixed cost per pass (issue 28): the end of a pass hands its workers' shutdown to the
background, and thread pools start their threads as work arrives.

Nothing is timed here: each test checks what must have happened (or not yet) at a point of
the pass, with real processes and threads; a hang fails through the subprocess timeouts.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests.conftest import children, nothing_left, shm_entries
from tests.faults import SleepAt
from tests.test_reliability import alive, wait_gone

ROOT = Path(__file__).resolve().parent.parent


# -- the end of a pass --------------------------------------------------------------------
def test_closing_a_pass_returns_before_its_busy_worker_is_stopped() -> None:
    """A worker busy with an item gets its grace period to finish, but the consumer's
    ``close()`` does not wait it out: the worker is still there when ``close()`` returns, and
    gone (with its segments) within the contract's 2 seconds."""
    with nothing_left():
        loader = pf.indices(4) | pf.parallel_map(
            SleepAt(1, 30.0), workers=1, backend="process", max_in_flight=2, round_robin=True
        )  # round robin: both items are sent at once
        before = children()  # an earlier test's kept pool may still be alive
        it = iter(loader)
        assert next(it) == 0  # the worker now sleeps in item 1
        workers = sorted(children() - before)
        assert len(workers) == 1
        it.close()
        assert all(alive(pid) for pid in workers)  # its stop is in the background
        assert not wait_gone(workers)


def test_a_later_pass_runs_while_the_last_ones_workers_stop() -> None:
    """Passes back to back on non-persistent pools: each pass's workers are new, the old ones
    stop in the background, and none is left after the last pass."""
    loader = pf.indices(40) | pf.parallel_map(str, workers=2, backend="process")
    with nothing_left():
        for _ in range(3):
            assert list(loader) == [str(i) for i in range(40)]


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_loader_close_returns_once_its_kept_workers_are_gone(method: str) -> None:
    """The end of a pass does not wait for workers, but ``loader.close()`` does: when it
    returns, the kept pool's workers have exited and their /dev/shm segments are gone."""
    with nothing_left():
        loader = pf.indices(12) | pf.parallel_map(
            Big(), workers=2, backend="process", persistent=True, mp_context=method
        )
        items = list(loader)
        assert [int(x[0]) for x, _ in items] == list(range(12))
        workers = sorted({pid for _, pid in items})  # spawn's are the warm server's children
        assert len(workers) == 2 and all(alive(pid) for pid in workers)  # kept after the pass
        del items
        loader.close()
        assert not [pid for pid in workers if alive(pid)]  # no wait: gone already
        assert not shm_entries(f"pipeflow-{os.getpid()}-")


class Big:
    """Items of 256 KiB (each travels through a shared-memory segment), and the worker's pid."""

    def __call__(self, i: int) -> Any:
        import numpy as np

        return np.full(1 << 16, i, dtype=np.float32), os.getpid()


_AFTER_A_PASS = """
import json, os, sys
import pipeflow as pf
from tests.conftest import children
seen = set()
loader = pf.indices(64) | pf.parallel_map(str, workers=2, backend="process")
for x in loader:
    seen |= children()
print(json.dumps(sorted(seen)), flush=True)
if sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
"""


@pytest.mark.parametrize("how", ["exit", "interrupt"])
def test_exit_right_after_a_pass_leaves_no_worker(how: str) -> None:
    """The interpreter exits (or a Ctrl-C ends it) while the last pass's workers are being
    stopped in the background: exit waits for that, nothing is left."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen(
        [sys.executable, "-c", _AFTER_A_PASS, how],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    assert proc.returncode == (0 if how == "exit" else -signal.SIGINT), err  # as Ctrl-C
    if how == "interrupt":
        assert err.count("Traceback (most recent call last)") == 1, err
    workers = json.loads(out.splitlines()[0])
    assert len(workers) == 2
    assert not wait_gone(workers)
    assert not shm_entries(f"pipeflow-{proc.pid}-")


# -- thread pools start threads as work arrives -------------------------------------------
def _pool_threads(stage: str, before: frozenset[threading.Thread] = frozenset()) -> list[str]:
    """The names of *stage*'s worker threads alive now, but those in *before* (an earlier
    pass's, which may still be ending: a closed pool's threads end in the background)."""
    return [
        t.name
        for t in threading.enumerate()
        if t.name.startswith(f"pipeflow-{stage}-") and t not in before
    ]


def tagged(i: Any) -> Any:
    return i


def test_a_thread_pool_starts_only_the_threads_its_work_needs(no_leaks) -> None:
    """One item through 8 thread workers starts one thread, not eight."""
    loader = pf.indices(1) | pf.parallel_map(tagged, workers=8, backend="thread")
    before = frozenset(threading.enumerate())
    it = iter(loader)
    assert next(it) == 0
    assert len(_pool_threads("parallel_map", before)) == 1
    it.close()


@given(
    n=st.integers(0, 40),
    workers=st.integers(1, 8),
    max_in_flight=st.integers(1, 12),
    ordered=st.booleans(),
    round_robin=st.booleans(),
)
@example(n=0, workers=8, max_in_flight=4, ordered=True, round_robin=False)
@example(n=1, workers=8, max_in_flight=12, ordered=False, round_robin=True)
@example(n=40, workers=4, max_in_flight=1, ordered=True, round_robin=False)
def test_lazy_threads_deliver_every_item_once_and_start_no_more_than_needed(
    n: int, workers: int, max_in_flight: int, ordered: bool, round_robin: bool
) -> None:
    """Every item exactly once (in order when ordered), for any pool size and bound; and a
    pass never starts more threads than it had items, nor (on the shared queue) more than
    it had items in flight."""
    loader = pf.indices(n) | pf.parallel_map(
        tagged,
        workers=workers,
        backend="thread",
        max_in_flight=max_in_flight,
        ordered=ordered,
        round_robin=round_robin,
    )
    before = frozenset(threading.enumerate())
    most = 0
    got = []
    for x in loader:
        got.append(x)
        most = max(most, len(_pool_threads("parallel_map", before)))
    assert (got if ordered else sorted(got)) == list(range(n))
    assert most <= min(workers, n)
    if not round_robin:
        assert most <= min(workers, max_in_flight)


# -- process workers start without a stagger -------------------------------------------------
@settings(max_examples=12)
@given(
    n=st.integers(0, 30),
    workers=st.integers(1, 3),
    stop_at=st.integers(0, 6),
    round_robin=st.booleans(),
    ordered=st.booleans(),
)
@example(n=30, workers=3, stop_at=1, round_robin=True, ordered=True)
@example(n=30, workers=2, stop_at=0, round_robin=False, ordered=False)
def test_workers_started_late_lose_and_repeat_nothing(
    n: int, workers: int, stop_at: int, round_robin: bool, ordered: bool
) -> None:
    """The workers after the first start when the consumer waits anyway, with the tasks they
    were given; a pass broken off before they started (its tasks never sent) leaves the kept
    pool whole: the next pass delivers every item exactly once, in order when ordered."""
    loader = pf.indices(n) | pf.parallel_map(
        str,
        workers=workers,
        backend="process",
        persistent=True,
        round_robin=round_robin,
        ordered=ordered,
        max_in_flight=2 * workers,
    )
    want = [str(i) for i in range(n)]
    with nothing_left(), loader:
        it = iter(loader)
        head = [x for _, x in zip(range(stop_at), it)]
        it.close()
        assert set(head) <= set(want)
        for _ in range(2):
            got = list(loader)
            assert (got if ordered else sorted(got, key=int)) == want
