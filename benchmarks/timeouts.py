"""How long after a worker gets stuck ``parallel_map(..., timeout=T)`` reports it (issue 37).

One item of a pass gets stuck as soon as it starts: on processes it stops its own worker
(``SIGSTOP``, as a frozen worker is), on threads it sleeps. Every other item takes about a
millisecond (``--item-ms``), and there are many of them (``--items``: 10,000 by default,
about 6 s of work for the two healthy workers of three), so they have plenty to do.
Measured: the time from the stuck item's start (its own ``time.monotonic()``, one clock for
every process of a Linux machine) to the ``WorkerTimeoutError`` in the consumer, and how
many results the consumer got before it. Each measurement runs in a fresh interpreter; the
rounds of every case (and of every checkout measured) are interleaved, and the table gives
the median, the smallest and the largest. The ideal is ``T`` (a worker held an item for
``T`` seconds); before issue 37 an unordered pass reported it only once the healthy workers
had drained the input. Run::

    python -m benchmarks.timeouts                          # this checkout
    python -m benchmarks.timeouts --root A --root B        # two checkouts, side by side
    python -m benchmarks.timeouts --rounds 3 --items 3000  # quicker
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
#: The stuck item's number: early, so that most of the input is still to come.
STUCK = 20


@dataclass(frozen=True)
class StuckAt:
    """Item *index* notes when it started in *path*, then never finishes: it stops its own
    worker process (*stop*) or sleeps (a thread); every other item takes *seconds*."""

    index: int
    path: str
    seconds: float
    stop: bool

    def __call__(self, i: int) -> int:
        if i != self.index:
            time.sleep(self.seconds)
            return i
        with open(self.path, "w") as f:
            f.write(repr(time.monotonic()))
        if self.stop:
            os.kill(os.getpid(), signal.SIGSTOP)
        time.sleep(3600)
        return i


def child(backend: str, ordered: bool, timeout: float, items: int, item_ms: float) -> None:
    """One measurement, in this interpreter: print it as a JSON line."""
    import pipeflow as pf

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "started")
        fn = StuckAt(STUCK, path, item_ms / 1000, stop=backend == "process")
        stage = pf.parallel_map(fn, workers=3, backend=backend, ordered=ordered, timeout=timeout)
        delivered = 0
        error = ""
        try:
            for _ in pf.indices(items) | stage:
                delivered += 1
        except pf.WorkerTimeoutError as e:
            error = type(e).__name__
        reported = time.monotonic()
        with open(path) as f:
            started = float(f.read())
    out = {"after": reported - started, "delivered": delivered, "error": error}
    print(json.dumps(out), flush=True)
    os._exit(0)  # a stuck thread sleeps on: no reason to wait for it


def measure(root: str, case: tuple[str, bool, float], items: int, item_ms: float) -> Any:
    backend, ordered, timeout = case
    cmd = [
        sys.executable,
        os.path.abspath(__file__),
        "--child",
        backend,
        str(int(ordered)),
        str(timeout),
        str(items),
        str(item_ms),
    ]
    env = {**os.environ, "PYTHONPATH": root}
    done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=600)
    lines = done.stdout.strip().splitlines()
    if done.returncode or not lines:
        raise RuntimeError(f"{case} under {root} failed:\n{done.stderr[-2000:]}")
    return json.loads(lines[-1])


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        backend, ordered, timeout, items, item_ms = sys.argv[2:7]
        child(backend, ordered == "1", float(timeout), int(items), float(item_ms))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", action="append", help="a pipeflow checkout (repeatable)")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--item-ms", type=float, default=1.0)
    args = parser.parse_args()
    roots = args.root or [_ROOT]
    cases = list(itertools.product(["thread", "process"], [True, False], [1.0, 2.0]))
    got: dict[tuple[str, tuple[str, bool, float]], list[Any]] = {}
    for _ in range(args.rounds):
        for case in cases:
            for root in roots:
                result = measure(root, case, args.items, args.item_ms)
                got.setdefault((root, case), []).append(result)
    print(
        f"{args.items} items of {args.item_ms:g} ms, 3 workers, item {STUCK} stuck; "
        f"median of {args.rounds} rounds; python {sys.version.split()[0]}, "
        f"{os.cpu_count()} CPUs"
    )
    print()
    print("| checkout | backend | order | timeout | stuck to error, s (min-max) | delivered |")
    print("| --- | --- | --- | --- | --- | --- |")
    for case in cases:
        for root in roots:
            rounds = got[(root, case)]
            after = [r["after"] for r in rounds]
            n = statistics.median(r["delivered"] for r in rounds)
            backend, ordered, timeout = case
            order = "ordered" if ordered else "unordered"
            errors = {r["error"] for r in rounds} - {"WorkerTimeoutError"}
            miss = f" (no timeout: {len(errors)} rounds)" if errors else ""
            name, mid = os.path.basename(root), statistics.median(after)
            print(
                f"| {name} | {backend} | {order} | {timeout:g} | {mid:.2f} "
                f"({min(after):.2f}-{max(after):.2f}){miss} | {n:.0f} of {args.items} |"
            )


if __name__ == "__main__":
    main()
