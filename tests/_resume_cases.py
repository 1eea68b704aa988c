"""Datasets and a process harness for the resume tests: a state taken in one process, that
process killed, the state loaded by a freshly built loader in another.

Everything here is at module level, so it pickles (spawn workers import this module).
"""

from __future__ import annotations

import json
import multiprocessing
import os
import signal
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.utils.data as tud

import pipeflow as pf


class Squares(tud.Dataset):
    """A map-style dataset whose samples are their index and a draw from torch's global
    generator (an augmentation, as most user code makes it)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, float]:
        return i, round(float(torch.rand(())), 6)


class OwnRng(tud.Dataset):
    """A map-style dataset that draws from a generator of its own and saves it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.rng = np.random.default_rng(7)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        return i, int(self.rng.integers(1000))

    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.rng.bit_generator.state = state["rng"]


class Stream(tud.IterableDataset):
    """An iterable dataset split by worker, counting its epochs and items in its state (as
    torchdata's tests' datasets do): each item is ``(index, epoch)``."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.epoch = 0
        self.done = 0
        self.resume: int | None = None

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        mine = list(range(first, self.n, step))
        skip, self.resume = self.resume or 0, None
        self.done = skip
        for i in mine[skip:]:
            self.done += 1
            yield i, self.epoch
        self.done = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        return {"done": self.done, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.resume, self.epoch = state["done"], state["epoch"]


class PlainStream(tud.IterableDataset):
    """An iterable dataset split by worker, with no state of its own (read again)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Any:
        info = tud.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(first, self.n, step))


@dataclass(frozen=True)
class Case:
    """One loader to resume: what it reads and how."""

    kind: str  # "squares", "own_rng", "stream", "plain_stream"
    n: int
    batch_size: int | None
    workers: int
    persistent: bool
    shuffle: bool
    in_order: bool

    def make(self) -> pf.DataLoader:
        dataset: Any = {
            "squares": Squares,
            "own_rng": OwnRng,
            "stream": Stream,
            "plain_stream": PlainStream,
        }[self.kind](self.n)
        iterable = isinstance(dataset, tud.IterableDataset)
        return pf.DataLoader(
            dataset,
            batch_size=self.batch_size,
            shuffle=None if iterable else self.shuffle,
            num_workers=self.workers,
            persistent_workers=self.persistent and self.workers > 0,
            in_order=self.in_order,
            collate_fn=_listed,
            generator=torch.Generator().manual_seed(11),
        )


def _listed(batch: Any) -> Any:
    if not isinstance(batch, (list, tuple)):
        return batch
    return [list(x) if isinstance(x, tuple) else x for x in batch]


def plain(x: Any) -> Any:
    """A batch as plain Python (for comparing across processes)."""
    return json.loads(json.dumps(x, default=lambda o: o.tolist()))


def _take(case: Case, k: int, conn: Any) -> None:
    """Child A: the first *k* items, then the state; then it waits to be killed."""
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))  # a fresh process's own
    dl = case.make()
    got: list[Any] = []
    it = iter(dl)
    for _ in range(k):
        try:
            got.append(plain(next(it)))
        except StopIteration:
            break
    conn.send((got, json.dumps(dl.state_dict())))
    signal.pause()


def _rest(case: Case, state: str, epochs: int, conn: Any) -> None:
    """Child B: a new loader, the state loaded, the rest of the epoch and *epochs* more."""
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    dl = case.make()
    dl.load_state_dict(json.loads(state))
    out = [[plain(b) for b in dl] for _ in range(1 + epochs)]
    dl.pipeline().close()
    conn.send(out)


def _whole(case: Case, epochs: int, conn: Any) -> None:
    """The uninterrupted run, in a process of its own too."""
    torch.manual_seed(int.from_bytes(os.urandom(4), "little"))
    dl = case.make()
    out = [[plain(b) for b in dl] for _ in range(1 + epochs)]
    dl.pipeline().close()
    conn.send(out)


def _child(target: Any, *args: Any) -> tuple[Any, Any]:
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(target=target, args=(*args, there))
    proc.start()
    there.close()
    for _ in range(600):
        if here.poll(0.1):
            return here.recv(), proc
        if not proc.is_alive() and not here.poll(0.1):
            msg = f"{target.__name__} ended (exit code {proc.exitcode}) and gave nothing"
            raise AssertionError(msg)
    proc.kill()
    raise AssertionError(f"{target.__name__} gave nothing within 60 s")


def interrupted(case: Case, k: int, epochs: int = 1) -> tuple[list[Any], list[list[Any]]]:
    """*k* items in one process, killed (SIGKILL) after its state was taken; the rest of
    that epoch and *epochs* more in a new process from the state."""
    (got, state), a = _child(_take, case, k)
    os.kill(a.pid, signal.SIGKILL)
    a.join(5)
    rest, b = _child(_rest, case, state, epochs)
    b.join(10)
    return got, rest


def uninterrupted(case: Case, epochs: int = 1) -> list[list[Any]]:
    """The same epochs, never interrupted."""
    whole, proc = _child(_whole, case, epochs)
    proc.join(10)
    return whole
