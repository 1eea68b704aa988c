"""The first spawn loader's first batch, pipeflow against its peers, each in a fresh interpreter.

Part of ``python -m pipeflow bench peers``. A child (``python -m benchmarks.peers_first LIB
SHAPE FILE``) builds one 2-worker spawn loader over 10,000 tiny samples, batch 64, and writes the
seconds from building it to its first batch into FILE. Spawn workers import the main module
again (here this one, as ``__mp_main__``), so the two shapes differ in what every process
imports:

- ``torch``: a training script's shape. torch is imported at the top, so the main process and
  every spawn worker import it; batches are torch tensors (Grain's are numpy arrays: converting
  them costs microseconds once torch is imported).
- ``numpy``: a script that never imports torch, whose batches are numpy arrays for every
  library (torch's DataLoader still imports torch: it is torch).

Grain's ``mp_prefetch`` always starts its workers with spawn; the others are given spawn.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from benchmarks.datasets import Points

if os.environ.get("PEERS_FIRST_SHAPE") == "torch":  # a training script imports torch first
    import torch  # noqa: F401

ROOT = Path(__file__).resolve().parent.parent
N, BATCH, WORKERS = 10_000, 64, 2


def np_collate(items: list[tuple[np.ndarray, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A batch of samples as numpy arrays (the ``numpy`` shape's collate, for every library)."""
    xs, ys = zip(*items)
    return np.stack(xs), np.asarray(ys)


class FetchCollate:
    """A batch of indices to a collated batch in a worker (torchdata.nodes, SPDL)."""

    def __init__(self, dataset: Any, tensors: bool) -> None:
        self.dataset = dataset
        self.tensors = tensors

    def __call__(self, idx: list[int]) -> Any:
        items = [self.dataset[i] for i in idx]
        if not self.tensors:
            return np_collate(items)
        from torch.utils.data import default_collate

        return default_collate(items)


def build(lib: str, tensors: bool) -> Any:
    """*lib*'s 2-worker spawn loader over the tiny samples."""
    ds = Points(N)
    if lib == "pipeflow":
        import pipeflow as pf

        work = pf.fetch(ds) | pf.collate(None if tensors else np_collate)
        stage = pf.parallel_map(work, workers=WORKERS, backend="process", mp_context="spawn")
        return pf.indices(ds) | pf.batch(BATCH) | stage
    if lib == "torch":
        import torch.utils.data as tud

        collate = None if tensors else np_collate
        return tud.DataLoader(
            ds, BATCH, num_workers=WORKERS, multiprocessing_context="spawn", collate_fn=collate
        )
    if lib == "nodes":
        import torch.utils.data as tud
        import torchdata.nodes as tn

        node: Any = tn.Batcher(tn.SamplerWrapper(tud.SequentialSampler(ds)), batch_size=BATCH)
        node = tn.ParallelMapper(
            node,
            FetchCollate(ds, tensors),
            num_workers=WORKERS,
            method="process",
            multiprocessing_context="spawn",
        )
        return tn.Loader(node)
    if lib == "grain":
        import grain

        options = grain.MultiprocessingOptions(num_workers=WORKERS)
        return grain.MapDataset.source(ds).batch(BATCH).to_iter_dataset().mp_prefetch(options)
    if lib == "spdl":
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        from spdl.pipeline import PipelineBuilder

        pool = ProcessPoolExecutor(WORKERS, mp_context=multiprocessing.get_context("spawn"))
        builder = PipelineBuilder().add_source(range(N)).aggregate(BATCH)
        builder = builder.pipe(FetchCollate(ds, tensors), concurrency=WORKERS, executor=pool)
        return _Started(builder.add_sink(4).build(num_threads=WORKERS))
    raise ValueError(f"unknown library {lib!r}")


class _Started:
    """An SPDL pipeline as an iterable: started on iter()."""

    def __init__(self, pipeline: Any) -> None:
        self.pipeline = pipeline

    def __iter__(self) -> Any:
        self.pipeline.start()
        return iter(self.pipeline.get_iterator(timeout=60))


def child(lib: str, shape: str, out: str) -> None:
    """Time one loader's build, ``iter()`` and first ``next()``; write the seconds to *out*.
    ``floor``: nothing (see :func:`floor`)."""
    if lib == "floor":  # this module's imports are done: when, for the parent to subtract
        Path(out).write_text(json.dumps({"at": time.time()}))
        return
    if lib == "pipeflow":
        import pipeflow  # noqa: F401  (the library's own import is not the loader's start)
    elif lib == "grain":
        import grain  # noqa: F401
    start = time.perf_counter()
    next(iter(build(lib, shape == "torch")))
    Path(out).write_text(json.dumps({"seconds": time.perf_counter() - start}))
    os._exit(0)  # the workers are killed with this child's session, for every library alike


def _env(shape: str) -> dict[str, str]:
    """A child's environment: this checkout importable, the script's *shape* set."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path, "PEERS_FIRST_SHAPE": shape}


def floor(shape: str, timeout: float = 120) -> float:
    """Seconds from starting a fresh interpreter to the end of this script's imports (torch, in
    the training script's shape): what every spawn worker does before its first item, so no
    library's first spawn batch comes sooner."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp, "at.json")
        start = time.time()  # the child's clock is the same wall clock
        subprocess.run(
            [sys.executable, "-m", "benchmarks.peers_first", "floor", shape, str(out)],
            cwd=ROOT,
            env=_env(shape),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            check=True,
            timeout=timeout,
        )
        return float(json.loads(out.read_text())["at"]) - start


def measure(lib: str, shape: str, timeout: float = 120) -> float:
    """Seconds to *lib*'s first batch in a fresh interpreter of *shape*."""
    with tempfile.TemporaryDirectory() as tmp, open(Path(tmp, "err"), "w+b") as err:
        out = Path(tmp, "seconds.json")
        proc = subprocess.Popen(
            [sys.executable, "-m", "benchmarks.peers_first", lib, shape, str(out)],
            cwd=ROOT,
            env=_env(shape),
            stdout=subprocess.DEVNULL,
            stderr=err,  # a file: workers left running would hold a pipe open
            start_new_session=True,  # its workers too: killed below, whatever the library left
        )
        try:
            proc.wait(timeout=timeout)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if not out.exists():
            err.seek(0)
            tail = err.read().decode(errors="replace")[-2000:]
            raise RuntimeError(f"{lib} ({shape}) gave no first batch: {tail}")
        return float(json.loads(out.read_text())["seconds"])


if __name__ == "__main__":
    child(*sys.argv[1:4])
