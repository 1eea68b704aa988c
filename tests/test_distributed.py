"""Sharding across ranks: DistributedSampler's semantics, and a real gloo process group."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch.utils.data as tud
from hypothesis import given
from hypothesis import strategies as st

import pipeflow as pf

ROOT = Path(__file__).resolve().parent.parent


@given(
    n=st.integers(0, 60),
    world=st.integers(1, 5),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**40),
    epoch=st.integers(0, 50),
)
def test_shards_equal_distributed_samplers(n, world, drop_last, seed, epoch) -> None:
    everything = []
    for rank in range(world):
        loader = (
            pf.indices(n)
            | pf.shuffle(seed=seed, generator="torch")
            | pf.shard(rank, world, drop_last=drop_last)
        )
        loader.set_epoch(epoch)
        sampler = tud.DistributedSampler(
            range(n), num_replicas=world, rank=rank, seed=seed, drop_last=drop_last
        )
        sampler.set_epoch(epoch)
        got = list(loader)
        assert got == list(sampler)
        assert len(loader) == len(sampler) == len(got)
        everything.append(got)
    assert len({len(shard) for shard in everything}) <= 1  # every rank the same count
    flat = [i for shard in everything for i in shard]
    if drop_last:
        assert len(flat) == len(set(flat)) == n - n % world
    else:
        assert set(flat) == set(range(n))
        assert len(flat) == (-(-n // world) * world if n else 0)


def test_shard_streams_holding_at_most_world_size_items() -> None:
    pulled = []

    def stream():
        for i in range(10_000):
            pulled.append(i)
            yield i

    it = iter(pf.from_iterable(stream()) | pf.shard(1, 4))
    assert [next(it) for _ in range(3)] == [1, 5, 9]
    assert len(pulled) <= 12
    it.close()


def test_rank_and_world_size_come_from_torchrun_environment(monkeypatch) -> None:
    monkeypatch.setenv("RANK", "2")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert list(pf.indices(9) | pf.shard()) == [2, 5, 8]
    assert len(pf.indices(9) | pf.shard()) == 3


class Stream:
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        return iter(range(self.n))


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_iterable_sources_split_over_ranks_and_workers_without_duplicates(backend) -> None:
    shards = []
    for rank in range(2):
        replica = pf.from_iterable(Stream(50)) | pf.shard(rank, 2, drop_last=True)
        loader = pf.parallel_source(replica, workers=3, backend=backend)
        shards.append(list(loader))
    flat = [i for s in shards for i in s]
    assert sorted(flat) == list(range(50))  # 25 a rank: no round is incomplete, none dropped
    assert len(shards[0]) == len(shards[1])
    for rank, got in enumerate(shards):  # a rank's items, in its order, whatever the workers
        assert got == list(pf.from_iterable(Stream(50)) | pf.shard(rank, 2, drop_last=True))


def test_resume_stays_exact_per_rank() -> None:
    def make(rank: int) -> pf.Loader:
        return pf.indices(37) | pf.shuffle(seed=1) | pf.shard(rank, 3) | pf.batch(4)

    for rank in range(3):
        want = list(make(rank))
        first = make(rank)
        it = iter(first)
        head = [next(it) for _ in range(2)]
        resumed = make(rank)
        resumed.load_state_dict(first.state_dict())
        assert head + list(resumed) == want


@pytest.mark.parametrize(
    ("kwargs", "exc"),
    [
        (dict(rank=-1), ValueError),
        (dict(rank=3, world_size=3), ValueError),
        (dict(world_size=0), ValueError),
        (dict(rank=1.0), TypeError),
        (dict(drop_last="no"), TypeError),
    ],
)
def test_bad_shard_arguments(kwargs, exc) -> None:
    with pytest.raises(exc, match="shard"):
        pf.shard(**kwargs)


def check_ranks(out: Path, world: int) -> None:
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in range(world)]
    for epoch in range(2):
        shards = [r["pipeline"][epoch] for r in ranks]
        for r in ranks:
            assert r["pipeline"][epoch] == r["sampler"][epoch] == r["facade"][epoch]
        assert len({len(s) for s in shards}) == 1
        assert set().union(*shards) == set(range(23))
        per_rank_batches = -(-len(shards[0]) // 4)
        assert all(r["reduced"][epoch] == per_rank_batches * world for r in ranks)
    assert ranks[0]["pipeline"][0] != ranks[0]["pipeline"][1]  # a new order every epoch
    for epoch in range(2):  # a DataPipe: every item on one rank, as with torch's loader
        for r in ranks:
            assert r["datapipe_pf"][epoch] == r["datapipe_torch"][epoch]
        items = [i for r in ranks for i in r["datapipe_pf"][epoch]]
        assert sorted(items) == list(range(20))


@pytest.mark.slow
@pytest.mark.parametrize("world", [2, 3])
def test_a_real_gloo_process_group_under_torchrun(world, tmp_path) -> None:
    env = {**os.environ, "PIPEFLOW_DDP_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    # Under pytest-timeout's 120 s, so that a hang shows the ranks' output (their stacks,
    # printed by faulthandler at 60 s) instead of only the test's own.
    try:
        run = _torchrun(world, tmp_path, env)
    except subprocess.TimeoutExpired as e:  # what the ranks printed, stacks included
        out = (e.stdout or b"")[-3000:], (e.stderr or b"")[-6000:]
        pytest.fail(f"torchrun did not finish in {e.timeout} s:\n{out[0]!r}\n{out[1]!r}")
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-6000:]
    check_ranks(tmp_path, world)


def _torchrun(world: int, tmp_path: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            f"--nproc-per-node={world}",
            # torchrun's logs (else a /tmp/torchelastic_* folder per run, never removed)
            f"--log-dir={tmp_path / 'torchrun'}",
            "--tee=3",
            str(ROOT / "tests" / "_ddp.py"),
        ],
        env=env,
        cwd=ROOT,
        timeout=100,
        capture_output=True,
        text=True,
    )


def test_shard_after_shuffle_golden() -> None:
    # Rank 2 of 4 over 13 shuffled indices: positions 2, 6, 10 and 14 (padding: position 1).
    order = list(pf.indices(13) | pf.shuffle(seed=5))
    assert list(pf.indices(13) | pf.shuffle(seed=5) | pf.shard(2, 4)) == [0, 4, 10, 12]
    assert [order[p % 13] for p in (2, 6, 10, 14)] == [0, 4, 10, 12]


# -- issue 24, item 2: a stream is split by worker once, or the pass says why it can't be ---------
class SplitsItself:
    """Splits itself by pipeflow's get_worker_info, as parallel_source's docstring shows."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = pf.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


class TarShards(tud.IterableDataset):
    """A WebDataset-style stream: shards (lists of samples) split by worker with torch's
    get_worker_info (webdataset's split_by_worker), then every sample of each shard."""

    def __init__(self, shards: int, per_shard: int) -> None:
        self.shards, self.per_shard = shards, per_shard

    def __iter__(self):
        info = tud.get_worker_info()
        mine = range(self.shards)
        if info is not None:
            mine = mine[info.id :: info.num_workers]
        for s in mine:
            yield from range(s * self.per_shard, (s + 1) * self.per_shard)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_shard_after_a_source_that_split_itself_is_refused(backend: str) -> None:
    # It kept [0, 3, 4, 7] of 0..7 at world size 1.
    replica = pf.from_iterable(SplitsItself(8)) | pf.shard(0, 1)
    loader = pf.parallel_source(replica, workers=2, backend=backend)
    with pytest.raises(pf.errors.SplitTwiceError, match="split its stream by worker already"):
        list(loader)


def test_a_webdataset_style_stream_is_exact_or_refused() -> None:
    # It lost 20 of 40: each worker kept half of the shards it had already chosen.
    data = TarShards(shards=8, per_shard=5)
    alone = pf.parallel_source(pf.from_iterable(data), workers=2)  # it splits itself: exact
    assert sorted(alone) == list(range(40))
    twice = pf.parallel_source(pf.from_iterable(data) | pf.shard(0, 1), workers=2)
    with pytest.raises(pf.errors.SplitTwiceError, match=r"nodesplitter=wds\.split_by_node"):
        list(twice)
    ranks = [list(pf.parallel_source(pf.from_iterable(data), workers=2) | pf.shard(r, 2)) for r in range(2)]  # fmt: skip
    assert sorted(ranks[0] + ranks[1]) == list(range(40))  # the split after: by rank only


def test_ignore_errors_never_drops_a_split_twice() -> None:
    replica = pf.from_iterable(SplitsItself(8)) | pf.shard(0, 1)
    loader = pf.parallel_source(replica, workers=2, backend="thread") | pf.ignore_errors()
    with pytest.raises(pf.errors.SplitTwiceError):
        list(loader)


def test_two_shards_in_one_replica_are_refused_when_built() -> None:
    with pytest.raises(ValueError, match="loader must split by worker once"):
        pf.parallel_source(pf.indices(8) | pf.shard(0, 2) | pf.shard(0, 2), workers=2)


def test_reading_worker_info_without_splitting_is_not_a_split() -> None:
    # A source that reads its worker's seed or id (not how many workers there are) reads
    # everything: the shard after it splits by worker, exactly.
    replica = pf.from_iterable(SeedsOnly(12)) | pf.shard(0, 1)
    got = list(pf.parallel_source(replica, workers=3, backend="thread"))
    assert sorted(got) == list(range(12))


class SeedsOnly:
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = pf.get_worker_info()
        assert info is not None and info.seed >= 0 and info.id >= 0
        return iter(range(self.n))
