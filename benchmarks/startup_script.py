"""The script the warm-start rows of :mod:`benchmarks.startup` run: a training script's shape.

It imports torch at the top (so spawn re-imports torch in every worker, running this file as
``__mp_main__``), and its dataset is a ``TensorDataset``, whose module imports torch. It builds
one loader after another in one process and prints each one's time to its first batch.

Run: ``python benchmarks/startup_script.py KIND METHOD [LOADERS]`` (KIND ``pipeflow`` or
``torch``), from the repository root with it on ``PYTHONPATH``.
"""

from __future__ import annotations

import json
import sys
import time

import torch
import torch.utils.data as tud


def first_batch(kind: str, method: str, ds: tud.Dataset[object]) -> float:
    """Seconds from building a 2-worker loader to its first batch (the loader then closes)."""
    start = time.perf_counter()
    if kind == "torch":
        loader = tud.DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=method)
    else:
        import pipeflow as pf

        loader = pf.DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=method)
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    del it, loader
    return elapsed


def main(kind: str, method: str, loaders: int = 3) -> None:
    g = torch.Generator().manual_seed(0)
    ds = tud.TensorDataset(torch.rand(10_000, 32, generator=g), torch.arange(10_000) % 10)
    print(json.dumps({"seconds": [first_batch(kind, method, ds) for _ in range(loaders)]}))


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], *map(int, sys.argv[3:4]))
