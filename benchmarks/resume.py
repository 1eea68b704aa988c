"""Resuming at 90 % of an epoch, in a freshly built loader: what it costs, against skipping
batches by iterating (torch).

torch's DataLoader cannot resume mid-epoch; the usual workaround iterates and throws away the
consumed batches, fetching them all again. pipeflow skips them at the index level (a map-style
dataset), or restores each worker's stream where it stood (an iterable dataset with
``state_dict()``, 2 workers). The cost is the time from ``load_state_dict`` to the first batch,
less one batch's own work, as a fraction of an epoch.
Run: ``python -m benchmarks.resume [--quick]``.
"""

from __future__ import annotations

import sys
import time
from typing import Any

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


class Lines(tud.IterableDataset):
    """A stream split by worker whose samples take ~50 us to make, and that knows where it
    stands (``state_dict``): resuming reads nothing again."""

    def __init__(self, n: int) -> None:
        self.n, self.done, self.skip = n, 0, 0

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        mine = range(first, self.n, step)
        self.done, skip, self.skip = self.skip, self.skip, 0
        for i in mine[skip:]:
            end = time.perf_counter() + 50e-6
            while time.perf_counter() < end:
                pass
            self.done += 1
            yield torch.full((8,), float(i))

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip = state["done"]


def stream(quick: bool) -> Row:
    """The iterable dataset with a state, 2 workers; torch iterates and drops (its workers
    read again what was consumed). Both start their workers: pipeflow's cost is its resumed
    first batch less a fresh loader's first batch (the workers' start-up, not the resume)."""
    n = 6_400 if quick else 25_600
    batches = n // 64
    k = batches * 9 // 10
    pf_costs, torch_costs = [], []
    for _ in range(2 if quick else 3):
        loader = pf.DataLoader(Lines(n), batch_size=64, num_workers=2)
        start = time.perf_counter()
        for _ in loader:
            pass
        epoch = time.perf_counter() - start
        it = iter(loader)
        for _ in range(k):
            next(it)
        state = loader.state_dict()
        del it
        # a fresh loader's first batch costs starting its workers, resumed or not: what the
        # resume costs is the difference
        plain = pf.DataLoader(Lines(n), batch_size=64, num_workers=2)
        start = time.perf_counter()
        next(iter(plain))
        cold = time.perf_counter() - start
        plain.pipeline().close()
        fresh = pf.DataLoader(Lines(n), batch_size=64, num_workers=2)
        start = time.perf_counter()
        fresh.load_state_dict(state)
        next(iter(fresh))
        pf_costs.append(max(time.perf_counter() - start - cold, 0.0) / epoch)
        fresh.pipeline().close()
        loader.pipeline().close()
        ref = tud.DataLoader(Lines(n), batch_size=64, num_workers=2)
        start = time.perf_counter()
        it2 = iter(ref)
        for _ in range(k + 1):
            next(it2)
        torch_costs.append((time.perf_counter() - start - epoch / batches) / epoch)
        del it2
    return Row(
        "  same, IterableDataset with state_dict(), 2 workers",
        "fraction",
        median(pf_costs),
        median(torch_costs),
        "pipeflow < 0.01",
        higher_is_better=False,
        samples={"pipeflow": pf_costs, "torch": torch_costs},
    )


def run(quick: bool) -> list[Row]:
    n = 6_400 if quick else 25_600
    ds = Decoded(n)
    batches = n // 64
    k = batches * 9 // 10
    pf_costs, torch_costs = [], []
    for _ in range(2 if quick else 3):
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
            "resume at 90% of an epoch, map-style (cost / epoch)",
            "fraction",
            median(pf_costs),
            median(torch_costs),
            "pipeflow < 0.01",
            higher_is_better=False,
            samples={"pipeflow": pf_costs, "torch": torch_costs},
        ),
        stream(quick),
    ]


main = cli(__doc__, run)


if __name__ == "__main__":
    sys.exit(main())
