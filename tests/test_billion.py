"""A billion samples (issue 16): shuffle, shard and resume over positions, in constant memory.

Over ``pf.indices(n)`` the full shuffle computes its order per position and a shard after it
computes only its own positions; resuming seeks. Each fast path is checked against the slow
one it replaces (the same order, read and shuffled, then sharded by streaming), and the
random draws after a shard against a run on one rank.
"""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.engine._permutation import Permutation
from tests.strategies import epochs, lengths, seeds

ROOT = Path(__file__).resolve().parent.parent
BIG = 10**12  # far more than fits in memory: only a path that reads nothing gets through
#: Python calls (generator steps included) that "immediate" may take: replaying or reading the
#: items instead of seeking would make hundreds of millions. Counted, not timed, so a busy
#: machine can't fail it; the speed itself is the benchmark's to measure.
FEW_CALLS = 50_000


def python_calls(fn: Callable[[], Any]) -> tuple[Any, int]:
    """``fn()`` and the number of Python function calls and generator resumptions it made."""
    count = 0

    def profile(frame: Any, event: str, arg: Any) -> None:
        nonlocal count
        if event == "call":
            count += 1

    sys.setprofile(profile)
    try:
        result = fn()
    finally:
        sys.setprofile(None)
    return result, count


def order(n: int, seed: int, epoch: int) -> list[int]:
    loader = pf.indices(n) | pf.shuffle(seed=seed)
    loader.set_epoch(epoch)
    return list(loader)


# -- shard over positions = shard over the items ---------------------------------------------
@given(
    n=lengths,
    world=st.integers(1, 9),
    data=st.data(),
    drop_last=st.booleans(),
    seed=seeds,
    epoch=epochs,
)
@example(n=0, world=3, data=None, drop_last=False, seed=0, epoch=0)
@example(n=2, world=7, data=None, drop_last=False, seed=1, epoch=0)  # padding repeats the epoch
def test_shard_over_positions_equals_shard_of_the_items(
    n: int, world: int, data: Any, drop_last: bool, seed: int, epoch: int
) -> None:
    rank = data.draw(st.integers(0, world - 1)) if data is not None else world - 1
    items = order(n, seed, epoch)
    fast = pf.indices(n) | pf.shuffle(seed=seed) | pf.shard(rank, world, drop_last=drop_last)
    slow = pf.from_iterable(items) | pf.shard(rank, world, drop_last=drop_last)
    fast.set_epoch(epoch)
    assert list(fast) == list(slow)
    assert len(fast) == len(list(slow))
    plain = pf.indices(n) | pf.shard(rank, world, drop_last=drop_last)  # the identity
    assert list(plain) == list(
        pf.from_iterable(range(n)) | pf.shard(rank, world, drop_last=drop_last)
    )


def test_nothing_is_read_or_materialised_over_positions() -> None:
    loader = pf.indices(BIG) | pf.shuffle(seed=3) | pf.shard(5, 64) | pf.batch(2)
    assert len(loader) == BIG // 64 // 2
    first, calls = python_calls(lambda: next(iter(loader)))
    assert calls < FEW_CALLS  # reading 10**12 items would take 10**12 steps
    assert first == Permutation(BIG, 3, 0).permute([5, 69]).tolist()


def test_the_shuffles_fact_describes_the_next_stage_only() -> None:
    # A map between the shuffle and the shard changes the items: the shard must read them.
    items = order(20, 1, 0)
    loader = pf.indices(20) | pf.shuffle(seed=1) | pf.map(lambda i: -1 - i) | pf.shard(1, 3)
    assert list(loader) == [-1 - items[p % 20] for p in range(1, 21, 3)]
    loader = pf.indices(20) | pf.map(lambda i: 100 + i) | pf.shard(1, 3)
    assert list(loader) == [100 + p % 20 for p in range(1, 21, 3)]


def test_shuffle_reads_nothing_at_iter() -> None:
    pulled: list[int] = []

    class Counted:
        def __iter__(self) -> Any:
            for i in range(10):
                pulled.append(i)
                yield i

    for stages in (pf.shuffle(seed=0), pf.shuffle(seed=0, generator="torch")):
        pulled.clear()
        it = iter(pf.from_iterable(Counted()) | stages)
        assert pulled == []
        assert sorted(it) == list(range(10)) and len(pulled) == 10


def test_torch_generator_over_positions_reads_nothing_and_equals_randperm() -> None:
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(9 + 2)
    loader = pf.indices(50) | pf.shuffle(seed=9, generator="torch")
    loader.set_epoch(2)
    assert list(loader) == torch.randperm(50, generator=g).tolist()


# -- resuming seeks ----------------------------------------------------------------------------
@given(
    n=lengths,
    world=st.integers(1, 5),
    size=st.integers(1, 7),
    seed=seeds,
    data=st.data(),
)
def test_resume_anywhere_yields_exactly_the_rest(
    n: int, world: int, size: int, seed: int, data: st.DataObject
) -> None:
    rank = data.draw(st.integers(0, world - 1))

    def make() -> pf.Loader[Any]:
        return pf.indices(n) | pf.shuffle(seed=seed) | pf.shard(rank, world) | pf.batch(size)

    want = list(make())
    k = data.draw(st.integers(0, len(want)))
    first = make()
    head = list(itertools.islice(iter(first), k))
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == want


@pytest.mark.parametrize("world", [1, 8])
def test_resume_deep_in_a_billion_is_immediate(world: int) -> None:
    def make() -> pf.Loader[Any]:
        return pf.indices(10**9) | pf.shuffle(seed=0) | pf.shard(world - 1, world)

    loader = make()
    state = loader.state_dict()
    state["position"] = len(loader) * 9 // 10
    resumed = make()
    resumed.load_state_dict(state)
    got, calls = python_calls(lambda: list(itertools.islice(resumed, 3)))
    assert calls < FEW_CALLS  # replaying 9 * 10**8 items would take as many steps
    positions = [world - 1 + world * (state["position"] + j) for j in range(3)]
    assert got == Permutation(10**9, 0, 0).permute(positions).tolist()


def test_resume_through_a_batch_deep_in_a_billion_is_immediate() -> None:
    def make() -> pf.Loader[Any]:
        return pf.indices(10**9) | pf.shuffle(seed=0) | pf.shard(3, 8) | pf.batch(64)

    loader = make()
    state = loader.state_dict()
    state["position"] = 1_900_000  # batches: the shard seeks to its item 64 * 1,900,000
    resumed = make()
    resumed.load_state_dict(state)
    got, calls = python_calls(lambda: next(iter(resumed)))
    assert calls < FEW_CALLS
    positions = [3 + 8 * (64 * 1_900_000 + j) for j in range(64)]
    assert got == Permutation(10**9, 0, 0).permute(positions).tolist()


def test_a_state_past_the_end_of_its_epoch_is_refused() -> None:
    loader = pf.indices(10) | pf.shuffle(seed=0) | pf.shard(0, 2)
    state = loader.state_dict()
    state["position"] = 6  # 5 per epoch on this rank
    with pytest.raises(ValueError, match="past the end"):
        loader.load_state_dict(state)
    state["position"] = 5  # the end itself: an empty rest of the epoch
    loader.load_state_dict(state)
    assert list(loader) == []


# -- random draws after a shard ----------------------------------------------------------------
def draw(i: int, rng: np.random.Generator) -> tuple[int, float]:
    return i, round(float(rng.random()), 4)


def test_ranks_draw_different_streams() -> None:
    # The example: ranks 0 and 1 drew the identical [0.637, 0.2983, 0.8288, 0.2007].
    def rank(r: int) -> list[float]:
        loader = (
            pf.indices(8)
            | pf.shuffle(seed=1, generator="torch")
            | pf.shard(r, 2)
            | pf.random_map(draw, seed=0)
        )
        return [x for _, x in loader]

    assert rank(0) != rank(1)
    assert set(rank(0)).isdisjoint(rank(1))


@pytest.mark.parametrize("generator", ["numpy", "torch"])
def test_a_samples_draw_is_the_same_for_any_world_size(generator: str) -> None:
    n = 23

    def draws(world: int) -> dict[int, Any]:
        seen: dict[int, Any] = {}
        for r in range(world):
            loader = (
                pf.indices(n)
                | pf.shuffle(seed=5)
                | pf.shard(r, world, drop_last=True)
                | pf.random_map(_draw_any, seed=2, generator=generator)
            )
            loader.set_epoch(1)
            for i, x in loader:
                assert i not in seen
                seen[i] = x
        return seen

    one = draws(1)
    for world in (2, 3, 4, 7):
        got = draws(world)
        assert got == {i: one[i] for i in got}  # padding aside, the same draw per sample


def _draw_any(i: int, rng: Any) -> tuple[int, float]:
    if isinstance(rng, np.random.Generator):
        return i, float(rng.random())
    import torch

    return i, float(torch.rand(1, generator=rng))


def test_draws_after_a_shard_survive_resume_and_workers() -> None:
    def make(workers: int) -> pf.Loader[Any]:
        return (
            pf.indices(40)
            | pf.shuffle(seed=2)
            | pf.shard(1, 3)
            | pf.parallel_map(pf.map(_plus_one), workers=workers, backend="thread")
            | pf.random_map(draw, seed=4)
        )

    want = list(make(0))
    assert list(make(2)) == want
    first = make(2)
    head = list(itertools.islice(iter(first), 5))
    resumed = make(0)
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == want


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_draws_inside_parallel_map_after_a_shard_equal_those_outside(backend: str) -> None:
    def ranks(inner: bool, workers: int) -> list[list[Any]]:
        out = []
        for r in range(3):
            loader = pf.indices(20) | pf.shuffle(seed=1) | pf.shard(r, 3)
            if inner:
                augment = pf.random_map(draw, seed=0)
                loader = loader | pf.parallel_map(augment, workers=workers, backend=backend)
            else:
                loader = loader | pf.random_map(draw, seed=0)
            out.append(list(loader))
        return out

    assert ranks(True, 2) == ranks(True, 0) == ranks(False, 0)


def test_a_kept_pool_follows_a_new_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    # The rank is found at each pass (here from RANK / WORLD_SIZE): a persistent pool whose
    # workers hold the old numbering is replaced.
    augment = pf.random_map(draw, seed=0)
    loader = (
        pf.indices(12)
        | pf.shard()
        | pf.parallel_map(augment, workers=2, backend="thread", persistent=True)
    )
    with loader:
        monkeypatch.setenv("RANK", "0")
        monkeypatch.setenv("WORLD_SIZE", "2")
        loader.set_epoch(0)
        rank0 = list(loader)
        monkeypatch.setenv("RANK", "1")
        loader.set_epoch(0)
        rank1 = list(loader)
    expected = list(pf.indices(12) | pf.random_map(draw, seed=0))
    assert rank0 == expected[0::2] and rank1 == expected[1::2]


def _plus_one(i: int) -> int:
    return i + 1


# -- the done-when numbers, in a fresh process --------------------------------------------------
FIRST_10K = """
import itertools, json, sys, time
import pipeflow as pf
world = int(sys.argv[1])
loader = pf.indices(10**9) | pf.shuffle(seed=0) | pf.shard(world - 1, world)
loader.set_stats(False)
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the high-water mark
base = status("VmRSS")
start = time.perf_counter()
head = list(itertools.islice(loader, 10_000))
took = time.perf_counter() - start
print(json.dumps({"seconds": took, "extra_mb": (status("VmHWM") - base) / 2**20, "n": len(head)}))
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/clear_refs"), reason="needs Linux /proc")
@pytest.mark.parametrize("world", [1, 8])
def test_first_ten_thousand_of_a_billion_fast_and_small(world: int) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run(
        [sys.executable, "-c", FIRST_10K, str(world)],
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout
    got = json.loads(out.strip().splitlines()[-1])
    assert got["n"] == 10_000
    assert got["extra_mb"] < 20, got
    # Its speed (0.1 s on a free core) is the benchmark's to measure, not a test's.


# -- a real gloo process group ---------------------------------------------------------------
@pytest.mark.slow
def test_ranks_of_a_gloo_group_draw_different_streams(tmp_path: Path) -> None:
    env = {**os.environ, "PIPEFLOW_DDP_OUT": str(tmp_path), "PYTHONPATH": str(ROOT)}
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(key, None)
    script = ROOT / "tests" / "_ddp_draws.py"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
    command += ["--nproc-per-node=2", str(script)]
    subprocess.run(command, env=env, cwd=ROOT, check=True, timeout=180, capture_output=True)
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    draws = [[x for _, x in r["draws"]] for r in ranks]
    assert set(draws[0]).isdisjoint(draws[1])
    loader = pf.indices(23) | pf.shuffle(seed=4) | pf.random_map(_draw_for_ddp, seed=0)
    one = dict(map(tuple, loader))  # type: ignore[arg-type]
    for r in ranks:
        assert all(one[i] == x for i, x in r["draws"][: 23 // 2])  # padding aside


def _draw_for_ddp(i: int, rng: np.random.Generator) -> tuple[int, int]:
    return i, int(rng.integers(2**30))
