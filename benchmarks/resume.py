"""Resuming at 90 % of an epoch: what it costs, against skipping batches by iterating (torch).

torch's DataLoader cannot resume mid-epoch; the usual workaround iterates and throws away the
consumed batches, fetching them all again. pipeflow skips them at the index level.
Run: ``python -m benchmarks.resume [--quick]``.
"""

from __future__ import annotations

import sys
import time

import torch
import torch.utils.data as tud

import pipeflow as pf
from benchmarks._harness import Row, cli, median


class Decoded:
    """A dataset whose samples take ~50 us to make (a small decode)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> torch.Tensor:
        end = time.perf_counter() + 50e-6
        while time.perf_counter() < end:
            pass
        return torch.full((8,), float(i))


def run(quick: bool) -> list[Row]:
    n = 6_400 if quick else 25_600
    ds = Decoded(n)
    batches = n // 64
    k = batches * 9 // 10
    pf_costs, torch_costs = [], []
    for _ in range(3):
        loader = pf.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        start = time.perf_counter()
        for _ in loader:
            pass
        epoch = time.perf_counter() - start
        # the state after k batches, then resume from it in a fresh loader
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
        del it
        fresh = pf.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        start = time.perf_counter()
        fresh.load_state_dict(state)
        first = next(iter(fresh))
        resume = time.perf_counter() - start - epoch / batches  # minus one batch's own work
        pf_costs.append(max(resume, 0.0) / epoch)
        # torch's workaround: iterate k batches and drop them
        ref = tud.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
        )
        start = time.perf_counter()
        it2 = iter(ref)
        for _ in range(k):
            next(it2)
        next(it2)
        torch_costs.append((time.perf_counter() - start - epoch / batches) / epoch)
        assert first.shape == (64, 8)
    return [
        Row(
            "resume at 90% of an epoch (cost / epoch)",
            "fraction",
            median(pf_costs),
            median(torch_costs),
            "pipeflow < 0.05",
            higher_is_better=False,
            samples={"pipeflow": pf_costs, "torch": torch_costs},
        )
    ]


main = cli(__doc__, run)


if __name__ == "__main__":
    sys.exit(main())
