"""The main job: a pipeline over a small generated dataset, printing what it loaded and how fast."""

from __future__ import annotations

import time
from typing import Any

import numpy as np

import pipeflow as pf


class PointsDataset:
    """An in-memory dataset of ``(features, label)``: 32 float32 features, 10 classes.

    Each class is a Gaussian blob around its own centre, generated from *seed*.
    """

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        centres = rng.normal(size=(10, 32)).astype(np.float32)
        self.labels = rng.integers(10, size=n)
        noise = rng.normal(scale=0.5, size=(n, 32)).astype(np.float32)
        self.features = centres[self.labels] + noise

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], int]:
        return self.features[i], int(self.labels[i])


def run_demo(*, samples: int, batch_size: int, epochs: int, seed: int) -> int:
    """Build the pipeline, run *epochs* passes and print a summary of each, then compare
    ``pf.DataLoader`` with ``torch.utils.data.DataLoader`` on the same data."""
    start = time.perf_counter()
    import torch
    import torch.utils.data as tud

    print(f"torch {torch.__version__} imported in {time.perf_counter() - start:.2f} s")
    ds = PointsDataset(samples, seed=seed)
    loader = (
        pf.indices(len(ds))
        | pf.shuffle(seed=seed)
        | pf.batch(batch_size)
        | pf.fetch(ds)
        | pf.collate()
    )
    print(f"dataset: {len(ds)} samples of (float32[32], int label)")
    print(f"pipeline: {loader}")
    print(f"batches per epoch: {len(loader)}")
    for epoch in range(epochs):
        loader.set_epoch(epoch)
        start = time.perf_counter()
        n_samples = 0
        class_counts = np.zeros(10, dtype=np.int64)
        first: Any = None
        for x, y in loader:
            if first is None:
                first = (tuple(x.shape), x.dtype, tuple(y.shape), y.dtype, y[:8].tolist())
            n_samples += len(y)
            class_counts += np.bincount(y.numpy(), minlength=10)
        elapsed = time.perf_counter() - start
        print(
            f"epoch {epoch}: {n_samples} samples in {elapsed:.3f} s "
            f"({n_samples / elapsed:,.0f} samples/s); first batch x{first[0]} {first[1]}, "
            f"y{first[2]} {first[3]}, first labels {first[4]}"
        )
        print(f"  samples per class: {class_counts.tolist()}")

    print(
        f"pf.DataLoader against torch.utils.data.DataLoader (batch {batch_size}, shuffled, "
        "num_workers=0; median of 5 epochs each):"
    )
    rates = {}
    for name, make in (("pipeflow", DataLoaderOf(pf)), ("torch", DataLoaderOf(tud))):
        dl = make(
            ds, batch_size=batch_size, shuffle=True, generator=torch.Generator().manual_seed(seed)
        )
        rates[name] = _median_rate(dl, 5)
        print(f"  {name:<8} {rates[name]:>12,.0f} samples/s")
    print(f"  ratio     {rates['pipeflow'] / rates['torch']:>11.2f}x")
    return 0


def DataLoaderOf(module: Any) -> Any:  # noqa: N802 - returns a class
    """``module.DataLoader`` (pipeflow's or torch's)."""
    return module.DataLoader


def _median_rate(loader: Any, epochs: int) -> float:
    rates = []
    for _ in range(epochs):
        start = time.perf_counter()
        n = sum(len(y) for _, y in loader)
        rates.append(n / (time.perf_counter() - start))
    return sorted(rates)[len(rates) // 2]
