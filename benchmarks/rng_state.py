"""What saving the workers' generators costs a worker (``rng_state``; issue 23's 2% rule).

Run: ``python -m benchmarks.rng_state``. A process worker calls its snapshotter once per task,
after the task: with ``rng_state="torch"`` it reads torch's 5 KB generator state and compares
it with the last one sent. This times, in CPU time (``time.process_time``, which a shared
machine's load moves far less than wall time), a worker's task of ``pf.DataLoader``'s map
pipeline (``fetch | collate`` of one batch) and the snapshot after it, for the tiny-sample
workload (batch 64) and the ~1 ms numpy workload (batch 16): the share is what the saving
adds to a worker's CPU per batch; a loader whose workers are not its bottleneck pays less.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch

import pipeflow as pf
from benchmarks import datasets as data
from pipeflow.parallel.pools._worker import MapJob, Snapshotter


def _micros(fn: Callable[[], Any], n: int) -> float:
    """The median over 5 runs of *fn*'s CPU time a call, in microseconds."""
    runs = []
    for _ in range(5):
        start = time.process_time()
        for _ in range(n):
            fn()
        runs.append((time.process_time() - start) / n * 1e6)
    return statistics.median(runs)


def measure(name: str, dataset: Any, batch: int, tasks: int) -> str:
    job = MapJob(pf.fetch(dataset) | pf.collate(), "bench")
    indices = list(range(batch))
    task = _micros(lambda: job.run(indices, 0, 0), tasks)
    off = _micros(Snapshotter(job, None, own=True), 20_000)
    same = _micros(Snapshotter(job, "torch", own=True), 20_000)
    snap = Snapshotter(job, "torch", own=True)

    def drawn() -> None:  # a task that drew from torch's generator: the state is sent
        torch.rand(1)
        snap()

    changed = _micros(drawn, 5_000) - _micros(lambda: torch.rand(1), 5_000)
    return (
        f"{name}: a task {task:,.1f} us of CPU; rng_state='torch' adds {same - off:.2f} us "
        f"({(same - off) / task:.2%}) when the state is unchanged, {changed - off:.2f} us "
        f"({(changed - off) / task:.2%}) when it changed; load {os.getloadavg()[0]:.1f}"
    )


def main() -> None:
    print(measure("tiny samples, batch 64", data.Points(20_000), 64, 2_000))
    print(measure("numpy ~1 ms/sample, batch 16", data.NumpyAugment(600), 16, 20))


if __name__ == "__main__":
    main()
