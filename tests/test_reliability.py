"""The reliability contract (shared/RELIABILITY.md), with real processes and real signals.

Every scenario runs in its own interpreter (tests/_scenario.py) under a timeout, so a hang fails
one test instead of the suite; the test then checks from outside that no worker process and no
``/dev/shm`` segment of that interpreter is left.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests._scenario import STOP_WITHIN
from tests.conftest import shm_entries

pytestmark = pytest.mark.slow  # every test here runs a scenario in its own interpreter

#: What the contract promises is "about a second" to report a dead worker and 2 s to stop
#: every worker (STOP_WITHIN, which the scenarios wait). The bounds add room for CI's two busy cores; each still fails for
#: what the test is about: a hang, or a reap as slow as torch's (~10 s).
REPORT_WITHIN = 5.0

ROOT = Path(__file__).resolve().parent.parent


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def wait_gone(pids: list[int], budget: float = STOP_WITHIN) -> list[int]:
    deadline = time.monotonic() + budget
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.02)


def start(scenario: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        [sys.executable, "-m", "tests._scenario", scenario],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def events(proc: subprocess.Popen[str], timeout: float = 30) -> tuple[dict[str, dict], str]:
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"scenario hung\nstdout: {out}\nstderr: {err}")
    got = {}
    for line in out.splitlines():
        e = json.loads(line)
        got[e["event"]] = e
    return got, err


def first_event(proc: subprocess.Popen[str]) -> dict:
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line, proc.stderr.read() if proc.stderr else "no output"
    return json.loads(line)


def no_segments_of(pid: int) -> None:
    assert not shm_entries(f"pipeflow-{pid}-")


@pytest.mark.parametrize(
    ("how", "words"),
    [
        ("sigkill", "was killed by signal SIGKILL"),
        ("exit", "exited with code 3"),
        ("segfault", "was killed by signal SIGSEGV"),
        ("sigbus", "/dev/shm"),
    ],
)
def test_a_dying_worker_raises_within_a_second_naming_pid_and_cause(how, words) -> None:
    proc = start(f"die:{how}")
    got, err = events(proc)
    assert "error" in got, err
    e = got["error"]
    assert e["type"] == "WorkerDiedError" and e["runtime_error"]
    assert words in e["msg"]
    assert "pid " in e["msg"] and "sample indices" in e["msg"] and "5" in e["msg"]
    assert e["elapsed"] < REPORT_WITHIN
    assert got["done"]["workers"] == []
    assert not wait_gone(got["started"]["workers"])
    no_segments_of(proc.pid)


@pytest.mark.parametrize("how", ["break", "del", "close", "break-thread", "del-thread"])
def test_stopping_early_leaves_nothing_within_two_seconds(how) -> None:
    proc = start(f"early:{how}")
    got, err = events(proc)
    assert "done" in got, err
    assert got["done"]["workers"] == []
    assert got["done"]["threads"] == 1
    assert got["done"]["elapsed"] < STOP_WITHIN
    no_segments_of(proc.pid)


@pytest.mark.skipif(
    signal.getsignal(signal.SIGINT) is signal.SIG_IGN,
    reason="SIGINT is ignored here (pytest run as a background job), and so in the scenario",
)
def test_ctrl_c_prints_one_traceback_and_stops_every_worker() -> None:
    proc = start("interrupt")
    workers = first_event(proc)["workers"]
    assert len(workers) == 2
    os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole group
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # leave no scenario running behind the suite
        proc.communicate()
        pytest.fail("Ctrl-C did not stop the loader within 10 s")
    assert err.count("Traceback (most recent call last)") == 1, err
    assert "KeyboardInterrupt" in err
    assert not wait_gone(workers)
    no_segments_of(proc.pid)


def test_interpreter_exit_stops_the_workers() -> None:
    proc = start("exit_midway")
    workers = first_event(proc)["workers"]
    assert workers
    proc.communicate(timeout=10)
    assert proc.returncode == 0
    assert not wait_gone(workers)
    no_segments_of(proc.pid)


def test_orphaned_workers_exit_when_the_main_process_is_killed() -> None:
    proc = start("orphan")
    workers = first_event(proc)["workers"]
    assert len(workers) == 2
    time.sleep(0.3)  # let the workers fill /dev/shm with results nobody will read
    os.kill(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=10)
    assert not wait_gone(workers)
    no_segments_of(proc.pid)


def test_a_stall_with_timeout_raises_and_the_hung_worker_is_terminated() -> None:
    proc = start("stall")
    got, err = events(proc)
    assert "error" in got, err
    e = got["error"]
    assert e["type"] == "WorkerTimeoutError"
    assert "timeout=0.5" in e["msg"] and "sample indices [4" in e["msg"]
    assert got["done"]["workers"] == []
    # 0.5 s timeout + up to ~1.3 s to stop a hung worker; without either, 3600 s
    assert got["done"]["elapsed"] < 0.5 + REPORT_WITHIN + STOP_WITHIN
    no_segments_of(proc.pid)


#: How late a timeout may fire. Before issue 24 the error waited for the stuck worker's grace
#: to stop (1 s more), and a SIGSTOPped persistent worker stayed in the kept pool.
TIMEOUT_MARGIN = 0.6


@pytest.mark.parametrize("how", ["dataloader", "sigstop", "thread"])
def test_a_timeout_fires_within_a_small_margin_and_nothing_stuck_is_kept(how) -> None:
    proc = start(f"late:{how}")
    got, err = events(proc)
    assert "error" in got, err
    e = got["error"]
    assert e["type"] == "WorkerTimeoutError" and e["timeout_error"] and e["runtime_error"]
    assert e["after"] < 1 + TIMEOUT_MARGIN, e["after"]
    assert got["done"]["workers"] == []  # the kept pool was not kept: its workers are gone
    if how != "thread":  # torch's words, and torch's class (a RuntimeError)
        assert "DataLoader timed out after 1 seconds" in e["msg"]
    assert "timeout=1" in e["msg"] and "not delivered" in e["msg"]
    assert not wait_gone(got["started"]["workers"])
    no_segments_of(proc.pid)


def test_an_uncaught_error_at_exit_prints_no_stray_traceback() -> None:
    """An uncaught dataset error ends a ``for`` loop over process workers while later
    results wait in shared memory. Exit-time cleanup closed the pool before the pass's
    generators were finalized, which then read the closed reader: ``Exception ignored in:
    <generator object ...> KeyError``, in 8 of 8 runs of this scenario before the fix."""
    procs = [start("exit_after_error") for _ in range(3)]
    for proc in procs:
        _, err = events(proc)
        assert proc.returncode == 1, err
        assert "ValueError: bad sample 100" in err
        assert "Exception ignored" not in err, err
        no_segments_of(proc.pid)
