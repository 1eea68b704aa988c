"""Datasets whose chosen samples fail, and a pass read outcome by outcome; shared by
test_failures.py and test_ignore.py (module level, so they pickle for process workers)."""

from __future__ import annotations

from typing import Any

import numpy as np
import torch


class Flaky:
    """Samples 0 .. n-1 as arrays; the indices in *bad* raise OSError ("a corrupt file")."""

    def __init__(self, n: int, bad: frozenset[int] | set[int] = frozenset()) -> None:
        self.n = n
        self.bad = frozenset(bad)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise OSError(f"corrupt sample {i}")
        return np.array([i])


class FlakyBatched(Flaky):
    def __getitems__(self, idx: list[int]) -> list[np.ndarray]:
        return [self[i] for i in idx]


def drain(loader: Any) -> list[Any]:
    """Every outcome of one pass: a batch as a list of ints, or ("error", type, message)."""
    out: list[Any] = []
    it = iter(loader)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return out
        except Exception as e:
            out.append(("error", type(e).__name__, str(e)))
        else:
            out.append(_plain(item))


def _plain(item: Any) -> Any:
    if isinstance(item, torch.Tensor):
        return item.flatten().tolist()
    if isinstance(item, list):
        return [_plain(x) for x in item]
    return item


def batches_of(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order), size)]


BACKENDS = [(0, "thread"), (1, "thread"), (2, "thread"), (2, "process")]
