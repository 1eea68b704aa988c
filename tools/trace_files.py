"""Which pipeflow files run for one steady-state batch of a process-backed parallel map.

Usage::

    python tools/trace_files.py                      # the defaults below; fails above 12 files
    python tools/trace_files.py --batches 20 --max 12

It runs ``indices(N) | batch(B) | parallel_map(fetch(ds) | collate(), workers=2,
backend="process")`` over a small numpy dataset, lets a few batches go by (start-up: the
workers fork, the first segments are made), then records, for ``--batches`` batches, the
pipeflow source files whose Python functions run:

- in the main process, with :func:`sys.setprofile` (and :func:`threading.setprofile`) around
  the ``next()`` calls that take those batches;
- in each worker, with a profiler that ``worker_init`` installs and that the dataset turns on
  at the first sample of the first recorded batch and off at the first sample after the last
  one (what a worker runs between the two is its steady state), and off for good once the main
  process has the last traced batch. Each worker writes the functions it saw to a file in a
  temporary folder as it first sees them.

It prints the main process's files, the workers', their union and its count (each file with
the functions of it that ran), and exits 1 when the union has more than ``--max`` files. What
runs by the clock rather than per batch (:data:`CLOCK`: the statistics' time series) is shown
apart and not counted.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
from pathlib import Path
from types import FrameType
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import numpy as np  # noqa: E402

import pipeflow as pf  # noqa: E402

PACKAGE = str(Path(pf.__file__).resolve().parent) + os.sep
OUT_ENV = "PIPEFLOW_TRACE_DIR"
#: Functions that run when a clock says so, not for each batch: the loader's statistics take
#: a point of their time series every 0.1 s (``StageRecord.sample``), so a slow run of the
#: traced batches (a loaded machine) calls it and a fast one may not. A file whose only calls
#: are these is shown apart and not counted.
CLOCK = {(PACKAGE + "stats.py", "sample")}


class Recorder:
    """The pipeflow functions called while it is on (a profile function), as
    ``(file, function)``."""

    def __init__(self, sink: Path | None = None) -> None:
        self.seen: set[tuple[str, str]] = set()
        self.on = False
        self.sink = sink  # a worker writes each new one here at once

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        code = frame.f_code
        key = (code.co_filename, code.co_name)
        if key not in self.seen and key[0].startswith(PACKAGE):
            if self.sink is not None and (self.sink.parent / "stop").exists():
                self.on = False  # the traced batches are all delivered: shutting down now
                return
            self.seen.add(key)
            if self.sink is not None:
                with self.sink.open("a") as f:
                    f.write(f"{key[0]} {key[1]}\n")


_WORKER: Recorder | None = None


def worker_init(worker_id: int) -> None:
    """Install the worker's recorder (off until the dataset turns it on)."""
    global _WORKER
    sink = Path(os.environ[OUT_ENV]) / f"worker-{os.getpid()}.txt"
    _WORKER = Recorder(sink)
    sys.setprofile(_WORKER)
    threading.setprofile(_WORKER)


class Samples:
    """A small numpy dataset; its samples in ``[start, stop)`` are the recorded ones."""

    def __init__(self, n: int, start: int, stop: int, width: int = 16) -> None:
        self.data = np.arange(n * width, dtype=np.float32).reshape(n, width)
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        if _WORKER is not None:
            _WORKER.on = self.start <= i < self.stop
        return self.data[i]


Calls = set[tuple[str, str]]  # (file, function)


def trace(batches: int, batch_size: int, warmup: int, width: int = 16) -> tuple[Calls, Calls]:
    """The functions that ran in the main process and in the workers for *batches* batches."""
    ahead = 8  # batches the workers may run past the last recorded one (in flight)
    n = (warmup + batches + ahead) * batch_size
    ds = Samples(n, warmup * batch_size, (warmup + batches) * batch_size, width)
    with tempfile.TemporaryDirectory() as tmp:
        os.environ[OUT_ENV] = tmp
        loader = (
            pf.indices(n)
            | pf.batch(batch_size)
            | pf.parallel_map(
                pf.fetch(ds) | pf.collate(),
                workers=2,
                backend="process",
                worker_init=worker_init,
            )
        )
        main = Recorder()
        it = iter(loader)
        for _ in range(warmup):
            next(it)
        sys.setprofile(main)
        threading.setprofile(main)
        main.on = True
        try:
            for _ in range(batches):
                next(it)
        finally:
            main.on = False
            sys.setprofile(None)
            threading.setprofile(None)  # type: ignore[arg-type]
        (Path(tmp) / "stop").touch()  # a worker that made none of the batches after them
        it.close()  # type: ignore[attr-defined]
        loader.close()
        worker: Calls = set()
        for path in Path(tmp).glob("worker-*.txt"):
            words = path.read_text().split()
            worker.update(zip(words[::2], words[1::2]))
    return main.seen, worker


def _per_batch(calls: Calls) -> set[str]:
    """The files of *calls*, less those whose only calls are by the clock (:data:`CLOCK`)."""
    return {f for f, _ in calls - CLOCK}


def _show(title: str, names: set[str], calls: Calls) -> None:
    print(f"{title} ({len(names)}):")
    for name in sorted(names):
        fns = sorted(fn for f, fn in calls if f == name)
        print(f"  {os.path.relpath(name, ROOT)}  ({', '.join(fns)})")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="steady-state batches traced")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=6, help="batches before tracing")
    parser.add_argument(
        "--width",
        type=int,
        default=16,
        help="float32 values per sample (a batch of 64 KiB or more travels in shared memory)",
    )
    parser.add_argument("--max", type=int, default=12, help="fail above this many files")
    args = parser.parse_args(argv)
    main_calls, worker_calls = trace(args.batches, args.batch_size, args.warmup, args.width)
    every = main_calls | worker_calls
    main_files, worker_files = _per_batch(main_calls), _per_batch(worker_calls)
    _show("main process", main_files, main_calls)
    _show("workers", worker_files, worker_calls)
    union = main_files | worker_files
    _show("union", union, every)
    clock = {f for f, _ in every} - union
    if clock:
        _show("by the clock, not per batch (not counted)", clock, every)
    print(f"files: {len(union)} (at most {args.max})")
    return 0 if len(union) <= args.max else 1


if __name__ == "__main__":
    sys.exit(main())
