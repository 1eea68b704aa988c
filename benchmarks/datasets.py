"""Datasets and per-sample work for the benchmarks, at module level so that spawn can pickle them.

Nothing here imports torch: a spawned pipeflow worker that unpickles these pays only for numpy.
"""

from __future__ import annotations

import time

import numpy as np


class Points:
    """In-memory rows of 32 float32 features and an int label: the tiny-sample workload."""

    def __init__(self, n: int, seed: int = 0) -> None:
        rng = np.random.default_rng(seed)
        self.x = rng.random((n, 32), dtype=np.float32)
        self.y = rng.integers(0, 10, n)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.x[i], int(self.y[i])


class PointsBatched(Points):
    """The same rows, with a vectorised ``__getitems__`` (one gather per batch)."""

    def __getitems__(self, idx: list[int]) -> list[tuple[np.ndarray, int]]:
        return list(zip(self.x[idx], self.y[idx].tolist()))


class NumpyAugment:
    """~1 ms of numpy per sample on a 3x224x224 image; numpy releases the GIL while it works.

    Few operations on large arrays, as an image augmentation does: numpy runs each one without
    the GIL. (Many operations on small arrays would hold the GIL between them, and measure
    the interpreter rather than the loader.)
    """

    def __init__(self, n: int, rounds: int = 1) -> None:
        self.n = n
        self.rounds = rounds
        self.base = np.random.default_rng(0).random((3, 224, 224), dtype=np.float32)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        img = self.base + np.float32(i % 7)
        for _ in range(self.rounds):
            img = np.sqrt(np.abs(np.sin(img) * 1.5 + np.cos(img)))
        return img


class PythonWork:
    """~1 ms of pure-Python work per sample: holds the GIL all along."""

    def __init__(self, n: int, loops: int = 12_000) -> None:
        self.n = n
        self.loops = loops

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        acc = i
        for k in range(self.loops):
            acc = (acc * 31 + k) % 1_000_003
        return acc, i


class Remote:
    """5 ms of latency per sample (a remote store), then a small array."""

    def __init__(self, n: int, latency: float = 0.005) -> None:
        self.n = n
        self.latency = latency

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        time.sleep(self.latency)
        return np.full(16, i, dtype=np.float32), i


class Images:
    """Large samples: 3x224x224 float32 (588 KiB) each."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full((3, 224, 224), i, dtype=np.float32)
