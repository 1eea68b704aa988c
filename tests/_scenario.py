"""Reliability scenarios, each run in its own interpreter by test_reliability.py.

Usage: ``python -m tests._scenario NAME``. Prints one JSON line per event on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from typing import Any

import pipeflow as pf
from tests.conftest import children
from tests.faults import ExitAt, SegfaultAt, SignalAt, SleepAt, square

#: How long a scenario waits for its workers and threads to go before it reports what is left:
#: the contract's 2 s, with room for CI's two busy cores (test_reliability.STOP_WITHIN).
STOP_WITHIN = 5.0


def say(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def slow_square(x: int) -> int:
    time.sleep(0.05)
    return x * x


def big(x: int) -> Any:
    import numpy as np

    return np.full(100_000, x, dtype=np.float64)  # 800 kB: travels through /dev/shm


FAULTS = {
    "sigkill": SignalAt(5, signal.SIGKILL),
    "exit": ExitAt(5, 3),
    "segfault": SegfaultAt(5),
    "sigbus": SignalAt(5, signal.SIGBUS),
}


def die(how: str) -> None:
    loader = pf.indices(40) | pf.parallel_map(FAULTS[how], workers=2, backend="process")
    it = iter(loader)
    next(it)
    say(event="started", workers=sorted(children()))
    start = time.monotonic()
    try:
        for _ in it:
            pass
    except Exception as e:
        say(
            event="error",
            type=type(e).__name__,
            msg=str(e),
            elapsed=time.monotonic() - start,
            runtime_error=isinstance(e, RuntimeError),
        )
    say(event="done", workers=sorted(children()))


def early(how: str) -> None:
    backend = "thread" if how.endswith("thread") else "process"
    loader = pf.indices(10_000) | pf.parallel_map(big, workers=2, backend=backend)
    it = iter(loader)
    for _ in range(3):
        next(it)
    say(event="started", workers=sorted(children()), threads=threading.active_count())
    start = time.monotonic()
    if how.startswith("break"):
        for _ in it:
            break
        it.close()  # what a for-loop's break does to the generator once it is dropped
    elif how.startswith("del"):
        del it
    elif how.startswith("close"):
        loader.close()
    deadline = time.monotonic() + STOP_WITHIN
    while (children() or threading.active_count() > 1) and time.monotonic() < deadline:
        time.sleep(0.02)
    say(
        event="done",
        workers=sorted(children()),
        threads=threading.active_count(),
        elapsed=time.monotonic() - start,
    )


def interrupt() -> None:
    loader = pf.indices(10_000) | pf.parallel_map(slow_square, workers=2, backend="process")
    for n, _ in enumerate(loader, 1):
        if n == 3:
            say(event="started", workers=sorted(children()))


def exit_midway() -> None:
    loader = pf.indices(10_000) | pf.parallel_map(big, workers=2, backend="process")
    it = iter(loader)
    next(it)
    say(event="started", workers=sorted(children()))
    sys.exit(0)  # with the iterator still open: the atexit hook stops the workers


def orphan() -> None:
    loader = pf.indices(10_000) | pf.parallel_map(
        big, workers=2, backend="process", persistent=True, max_in_flight=8
    )
    it = iter(loader)
    for _ in range(4):  # the other worker starts after the first result
        next(it)
    say(event="started", workers=sorted(children()))
    time.sleep(60)  # the test kills us now


def stall() -> None:
    loader = pf.indices(20) | pf.parallel_map(
        SleepAt(4, 3600), workers=2, backend="process", timeout=0.5
    )
    start = time.monotonic()
    it = iter(loader)
    next(it)
    say(event="started", workers=sorted(children()))
    try:
        list(it)
    except TimeoutError as e:
        say(event="error", type=type(e).__name__, msg=str(e), elapsed=time.monotonic() - start)
    deadline = time.monotonic() + STOP_WITHIN
    while children() and time.monotonic() < deadline:
        time.sleep(0.02)
    say(event="done", workers=sorted(children()), elapsed=time.monotonic() - start)


class SleepyDataset:
    """40 samples; sample 9 never comes (a stuck read)."""

    def __len__(self) -> int:
        return 40

    def __getitem__(self, i: int) -> int:
        if i == 9:
            time.sleep(3600)
        time.sleep(0.002)
        return i


def late(how: str) -> None:
    """A timeout: how long after the last result the error comes, and what is left after.

    ``dataloader``: ``pf.DataLoader(timeout=1)`` over a stuck sample (torch: ~1.1 s);
    ``sigstop``: the same with persistent workers, one frozen by SIGSTOP mid-epoch; ``thread``:
    ``parallel_map`` on threads, ``timeout=1``, a stuck item.
    """
    if how == "thread":
        loader: Any = pf.indices(40) | pf.parallel_map(
            SleepAt(9, 3600), workers=2, backend="thread", timeout=1
        )
    else:
        loader = pf.DataLoader(
            SleepyDataset() if how == "dataloader" else list(range(400)),
            batch_size=4,
            num_workers=2,
            timeout=1,
            persistent_workers=how == "sigstop",
        )
    it = iter(loader)
    next(it)
    next(it)
    if how == "sigstop":
        os.kill(it._workers[1].pid, signal.SIGSTOP)
    say(event="started", workers=sorted(children()))
    last = time.monotonic()
    try:
        for _ in it:
            last = time.monotonic()
    except Exception as e:
        say(
            event="error",
            type=type(e).__name__,
            msg=str(e),
            after=time.monotonic() - last,
            runtime_error=isinstance(e, RuntimeError),
            timeout_error=isinstance(e, TimeoutError),
        )
    start = time.monotonic()
    deadline = start + STOP_WITHIN
    while children() and time.monotonic() < deadline:
        time.sleep(0.02)
    say(event="done", workers=sorted(children()), elapsed=time.monotonic() - start)


def exit_after_error() -> None:
    """An uncaught dataset error in a ``for`` loop ends the program while results of the pass
    wait in order behind it (in shared memory): exit-time cleanup must stay silent."""
    from tests.faults import Samples

    loader = pf.indices(200) | pf.batch(4)
    loader = loader | pf.parallel_map(
        pf.fetch(Samples(200, SlowFailure())) | pf.collate(),
        workers=2,
        backend="process",
        max_in_flight=6,
    )
    for _ in loader:
        pass


class SlowFailure:
    """80 KB samples (a batch travels in /dev/shm); sample 100 fails after 0.3 s, when the
    batches behind it have arrived."""

    def __call__(self, i: int) -> Any:
        import numpy as np

        if i == 100:
            time.sleep(0.3)
            raise ValueError("bad sample 100")
        return np.full(20_000, i, dtype=np.float32)


if __name__ == "__main__":
    name, _, arg = sys.argv[1].partition(":")
    {"die": die, "early": early, "late": late}.get(name, lambda a: globals()[name]())(arg)
    _ = square, os
