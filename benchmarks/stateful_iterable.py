"""Tracking a stateful ``IterableDataset``'s state per worker: pipeflow's ``StatefulDataLoader``
against torchdata's, on a dataset whose state changes with every item.

The dataset is torchdata's ``DynamicStateIterableDataset`` (its
test/stateful_dataloader/test_state_dict.py), split by worker: its ``state_dict()`` is a new
dict at every item, one that grows with the stream (``2 i + 1`` keys after *i* items, lists and
one-element tensors among them). Both loaders run it with 2 workers, batch 4, a
``state_dict()`` taken every 10 batches and at the end of each epoch, two epochs a loader,
``persistent_workers`` False and True, their default ``snapshot_every_n_steps`` (1: each
worker asks its dataset for its state at every batch). The time is a loader's whole life:
built, two epochs (the workers' start-up included), closed; repetitions alternate which loader
goes first.

Before timing, it checks that the two give the same batches, and that a fresh loader of each
resumed from a mid-epoch state of its own (with and without persistent workers) gives exactly
the rest of the epoch.
Run: ``python -m benchmarks.stateful_iterable [--quick]``.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.utils.data as tud

import pipeflow as pf
from benchmarks._harness import Row, cli, median

BATCH = 4
EVERY = 10  # a state_dict() every EVERY batches
EPOCHS = 2


class DynamicState(tud.IterableDataset):  # type: ignore[type-arg]
    """torchdata's ``DynamicStateIterableDataset``, split by worker (each worker reads every
    other item) and started afresh each epoch: after *i* items its state has ``2 i + 1`` keys,
    ``str(a): {a: list(range(a))}`` and a one-element tensor for each ``a < i``, so it grows
    with every item and costs more to make the longer the stream has run."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0
        self.resume: int | None = None

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        mine = range(first, self.n, step)
        self.i, self.resume = self.resume or 0, None
        for x in mine[self.i :]:
            self.i += 1
            yield x

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"i": self.i}
        for a in range(self.i):
            state[str(a)] = {a: list(range(a))}
            state[f"t{a}"] = torch.tensor(a % 128, dtype=torch.int8)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume = state["i"]


def _torchdata(n: int, persistent: bool) -> Any:
    from torchdata.stateful_dataloader import StatefulDataLoader  # type: ignore[import-untyped]

    return StatefulDataLoader(
        DynamicState(n), batch_size=BATCH, num_workers=2, persistent_workers=persistent
    )


def _pipeflow(n: int, persistent: bool) -> Any:
    return pf.StatefulDataLoader(
        DynamicState(n), batch_size=BATCH, num_workers=2, persistent_workers=persistent
    )


def _close(loader: Any) -> None:
    close = getattr(loader, "close", None)
    if callable(close):
        close()
    else:  # torchdata's: its iterator's workers stop when it is collected
        loader._iterator = None


def life(make: Callable[[], Any]) -> tuple[float, list[list[list[int]]], int]:
    """One loader's life, timed: its batches by epoch, and how many states it gave."""
    start = time.perf_counter()
    loader = make()
    epochs, states = [], 0
    for _ in range(EPOCHS):
        batches = []
        for k, b in enumerate(loader, 1):
            batches.append(b.tolist())
            if k % EVERY == 0:
                loader.state_dict()
                states += 1
        loader.state_dict()
        states += 1
        epochs.append(batches)
    _close(loader)
    return time.perf_counter() - start, epochs, states


def check(n: int) -> None:
    """The same batches from both, and a resume from mid-epoch that gives the rest exactly
    (each loader from its own state)."""
    for persistent in (False, True):
        _, ref, _ = life(functools.partial(_torchdata, n, persistent))
        _, got, _ = life(functools.partial(_pipeflow, n, persistent))
        if got != ref:
            msg = f"pipeflow's batches differ from torchdata's (persistent={persistent})"
            raise SystemExit(msg)
    whole = ref[0]
    half = len(whole) // 2 + 1
    for name, make in (("torchdata", _torchdata), ("pipeflow", _pipeflow)):
        for cut, persistent in ((1, False), (EVERY + 3, True), (half, False), (half, True)):
            loader = make(n, persistent)
            it = iter(loader)
            for _ in range(cut):
                next(it)
            state = loader.state_dict()
            del it
            _close(loader)
            again = make(n, persistent)
            again.load_state_dict(state)
            rest = [b.tolist() for b in again]
            _close(again)
            if rest != whole[cut:]:
                msg = f"{name} resumed after {cut} batches does not give the rest"
                raise SystemExit(f"{msg} (persistent={persistent})")


def run(quick: bool) -> list[Row]:
    n = 300 if quick else 600
    reps = 3 if quick else 5
    check(min(n, 300))
    rows = []
    for persistent in (False, True):
        times: dict[str, list[float]] = {"pipeflow": [], "torch": []}
        makers = {
            "pipeflow": functools.partial(_pipeflow, n, persistent),
            "torch": functools.partial(_torchdata, n, persistent),
        }
        names = list(makers)
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                took, _, _ = life(makers[name])
                times[name].append(took)
        rows.append(
            Row(
                f"dynamic state, {n} items, 2 workers, persistent={persistent}",
                "seconds",
                median(times["pipeflow"]),
                median(times["torch"]),
                "<= 1.2x",
                note=f"{EPOCHS} epochs, batch {BATCH}, state_dict() every {EVERY} batches; "
                "torch = torchdata.stateful_dataloader.StatefulDataLoader",
                higher_is_better=False,
                samples=times,
            )
        )
    return rows


main = cli(__doc__, run)


if __name__ == "__main__":
    sys.exit(main(None))
