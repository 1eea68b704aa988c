"""Shared test set-up: hypothesis profiles (``ci`` is deterministic; ``dev`` is quick)."""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci",
    derandomize=True,
    database=None,
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
settings.register_profile("dev", max_examples=20, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))

# Ray (tests/test_ray.py, the Ray how-to's blocks) replaces builtins.print the first time it
# shows an actor's output (for its tqdm bars): later doctests that show print's type would
# see Ray's function instead.
os.environ.setdefault("RAY_TQDM_PATCH_PRINT", "0")


def pytest_sessionstart(session: object) -> None:
    # multiprocessing's long-lived helpers start on first use and stay: start them up front so
    # the leak checks below don't count them.
    from multiprocessing import forkserver, resource_tracker

    from pipeflow.parallel.pools import _warm

    forkserver.ensure_running()
    resource_tracker.ensure_running()
    _warm.ensure_running()


# -- leak checks: children, threads, file descriptors, /dev/shm ------------------------------
import contextlib  # noqa: E402
import threading  # noqa: E402
import time  # noqa: E402
from collections.abc import Iterator  # noqa: E402

import pytest  # noqa: E402

SHM = "/dev/shm"


def children(pid: int | None = None) -> set[int]:
    """Live (non-zombie) child processes of *pid* (default: this process), counting those
    a fork server (multiprocessing's, or pipeflow's warm one) forked for it."""
    pid = os.getpid() if pid is None else pid
    out: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            if _mp_helper(entry):  # a fork server stays, but the workers it forked for us don't
                out |= children(int(entry))
            else:
                out.add(int(entry))
    return out


def still_children(pids: set[int], within: float = 2.0) -> set[int]:
    """Those of *pids* still this process's children after up to *within* seconds (the
    RELIABILITY.md bound): a pass's end stops its workers in the background."""
    deadline = time.monotonic() + within
    while (left := pids & children()) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


def _mp_helper(pid: str) -> bool:
    """Long-lived helpers: multiprocessing's forkserver and resource tracker, pipeflow's warm
    forkserver."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"forkserver" in cmd or b"resource_tracker" in cmd


def shm_entries(prefix: str | tuple[str, ...] | None = None) -> set[str]:
    """This process's /dev/shm segments: its pools' (``pipeflow-<pid>-``, also in its
    workers) and the test ``Link``'s (``pipeflow-test-<pid>-``); with *prefix*, those
    starting with it. Not every ``pipeflow-`` file: another program's (a test run beside
    this one) come and go, and would read as this test's leaks."""
    if prefix is None:
        prefix = (f"pipeflow-{os.getpid()}-", f"pipeflow-test-{os.getpid()}-")
    try:
        return {n for n in os.listdir(SHM) if n.startswith(prefix)}
    except OSError:
        return set()


def snapshot() -> tuple[set[int], set[str], set[str], int]:
    threads = {t.name for t in threading.enumerate()}
    return children(), threads, shm_entries(), len(os.listdir("/proc/self/fd"))


@contextlib.contextmanager
def nothing_left(budget: float = 2.0) -> Iterator[None]:
    """Fail if the block leaves processes, threads, fds or /dev/shm segments after *budget* s.

    The ``no_leaks`` fixture checks a whole test; this checks a block inside one, so that a
    leak fails the test's call (which ``xfail`` can mark), not its teardown.
    """
    kids0, threads0, shm0, fds0 = snapshot()
    yield
    deadline = time.monotonic() + budget
    while True:
        kids, threads, shm, fds = snapshot()
        extra = (kids - kids0, threads - threads0, shm - shm0, fds - fds0)
        if not any(extra[:3]) and extra[3] <= 0:
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"leaked: processes {extra[0]}, threads {extra[1]}, shm {extra[2]}, "
                f"{extra[3]} file descriptors"
            )
        time.sleep(0.05)


@pytest.fixture
def no_leaks():
    """Fail the test if it leaves processes, threads, fds or /dev/shm segments after 2 s."""
    with nothing_left():
        yield
