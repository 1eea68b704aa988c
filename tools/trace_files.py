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
  one (what a worker runs between the two is its steady state). Each worker writes the files
  it saw to a file in a temporary folder as it first sees them.

It prints the main process's files, the workers', their union and its count, and exits 1 when
the union has more than ``--max`` files.
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


class Recorder:
    """The pipeflow files whose functions are called while it is on (a profile function)."""

    def __init__(self, sink: Path | None = None) -> None:
        self.files: set[str] = set()
        self.on = False
        self.sink = sink  # a worker writes each new file here at once

    def __call__(self, frame: FrameType, event: str, arg: Any) -> None:
        if not self.on or event != "call":
            return
        name = frame.f_code.co_filename
        if name.startswith(PACKAGE) and name not in self.files:
            self.files.add(name)
            if self.sink is not None:
                with self.sink.open("a") as f:
                    f.write(name + "\n")


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

    def __init__(self, n: int, start: int, stop: int) -> None:
        self.data = np.arange(n * 16, dtype=np.float32).reshape(n, 16)
        self.start, self.stop = start, stop

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> Any:
        if _WORKER is not None:
            _WORKER.on = self.start <= i < self.stop
        return self.data[i]


def trace(batches: int, batch_size: int, warmup: int) -> tuple[set[str], set[str]]:
    """The files that ran in the main process and in the workers for *batches* batches."""
    ahead = 8  # batches the workers may run past the last recorded one (in flight)
    n = (warmup + batches + ahead) * batch_size
    ds = Samples(n, warmup * batch_size, (warmup + batches) * batch_size)
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
        it.close()  # type: ignore[attr-defined]
        loader.close()
        worker: set[str] = set()
        for path in Path(tmp).glob("worker-*.txt"):
            worker.update(path.read_text().split())
    return main.files, worker


def _show(title: str, files: set[str]) -> None:
    print(f"{title} ({len(files)}):")
    for name in sorted(files):
        print(f"  {os.path.relpath(name, ROOT)}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20, help="steady-state batches traced")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--warmup", type=int, default=6, help="batches before tracing")
    parser.add_argument("--max", type=int, default=12, help="fail above this many files")
    args = parser.parse_args(argv)
    main_files, worker_files = trace(args.batches, args.batch_size, args.warmup)
    _show("main process", main_files)
    _show("workers", worker_files)
    union = main_files | worker_files
    _show("union", union)
    print(f"files: {len(union)} (at most {args.max})")
    return 0 if len(union) <= args.max else 1


if __name__ == "__main__":
    sys.exit(main())
