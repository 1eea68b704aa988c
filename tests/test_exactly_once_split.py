"""Exactly once across ranks x workers (issue 24, item 2): a split by rank and by worker,
with and without a source that splits itself, either delivers what a plain-Python count says
or raises an error that says why; never a silent shortfall.

The oracle is the plain count of what ``DistributedSampler``-style sharding keeps: rank *r*
of *w* takes the epoch's positions ``r, r + w, ...`` (the last round padded from the start of
the epoch, or dropped with ``drop_last``), and the ranks together take each position once.
"""

from __future__ import annotations

from collections import Counter

import pytest
import torch.utils.data as tud
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.errors import SplitTwiceError


class Everything:
    """A source that reads every item (0 .. n-1), in every worker."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


class SplitsByWorker:
    """A source that splits itself by worker (pipeflow's or torch's get_worker_info) and by
    rank, as a WebDataset with ``split_by_node`` and ``split_by_worker`` does."""

    def __init__(self, n: int, rank: int, world: int, torch_info: bool) -> None:
        self.n, self.rank, self.world, self.torch_info = n, rank, world, torch_info

    def __iter__(self):
        info = tud.get_worker_info() if self.torch_info else pf.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(self.rank + worker * self.world, self.n, self.world * workers))


def expected(n: int, world: int, drop_last: bool) -> Counter[int]:
    """How often each index comes, over all ranks: the plain count."""
    if n == 0:
        return Counter()
    rounds = n // world if drop_last else -(-n // world)
    return Counter(p % n for r in range(world) for p in range(r, r + rounds * world, world))


def rank_loader(kind: str, n: int, rank: int, world: int, drop_last: bool, torch_info: bool,
                **parallel: object) -> pf.Loader:  # fmt: skip
    shard = pf.shard(rank, world, drop_last=drop_last)
    replica = {
        "computed": pf.indices(n) | shard,  # the planning step computes the share
        "streamed": pf.from_iterable(Everything(n)) | shard,  # the source reads everything
        "self-split": pf.from_iterable(SplitsByWorker(n, rank, world, torch_info)),
        "self-split+shard": pf.from_iterable(SplitsByWorker(n, rank, world, torch_info)) | shard,
    }[kind]
    return pf.parallel_source(replica, **parallel)  # type: ignore[arg-type]


@given(
    kind=st.sampled_from(["computed", "streamed", "self-split", "self-split+shard"]),
    n=st.integers(0, 40),
    world=st.integers(1, 3),
    workers=st.integers(1, 3),
    backend=st.sampled_from(["thread", "process"]),
    ordered=st.booleans(),
    drop_last=st.booleans(),
    torch_info=st.booleans(),
)
@example(
    kind="self-split+shard",
    n=8,
    world=1,
    workers=2,
    backend="thread",
    ordered=True,
    drop_last=False,
    torch_info=False,
)  # the issue's: [0, 3, 4, 7] of 0..7, silently
@example(
    kind="streamed",
    n=7,
    world=1,
    workers=2,
    backend="thread",
    ordered=True,
    drop_last=False,
    torch_info=False,
)  # worker 1 of a lone rank must not pad
@settings(max_examples=30)  # fmt: skip
def test_every_index_exactly_once_over_ranks_and_workers_or_an_error(
    kind: str, n: int, world: int, workers: int, backend: str, ordered: bool,
    drop_last: bool, torch_info: bool,
) -> None:  # fmt: skip
    torch_info = torch_info and backend == "process"  # torch's answers in processes only
    parallel = dict(workers=workers, backend=backend, ordered=ordered)
    got: Counter[int] = Counter()
    refused = ""
    for rank in range(world):
        loader = rank_loader(kind, n, rank, world, drop_last, torch_info, **parallel)
        try:
            items = list(loader)
        except SplitTwiceError as e:  # refused: it names what happened, never a shortfall
            refused = str(e)
            break
        if kind != "self-split" and ordered:  # in order, the rank's share is torch's order
            alone = pf.from_iterable(Everything(n)) | pf.shard(rank, world, drop_last=drop_last)
            assert items == list(alone)
        got.update(items)
    if refused:
        assert kind == "self-split+shard" and n > 0, refused
        assert "split its stream by worker already" in refused
        return
    if kind == "self-split":  # it splits itself (by rank too): each index once, no padding
        assert got == Counter(range(n))
    else:
        assert kind != "self-split+shard" or n == 0, "a double split was not refused"
        assert got == expected(n, world, drop_last)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_rank_gets_the_same_items_whatever_its_workers(backend: str) -> None:
    alone = list(pf.indices(23) | pf.shard(1, 3))
    for workers in (1, 2, 4):
        loader = pf.parallel_source(pf.indices(23) | pf.shard(1, 3), workers=workers, backend=backend)  # fmt: skip
        assert list(loader) == alone
