"""Determinism independent of workers, and exact mid-epoch resumption."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf

DATA = [i * 10 for i in range(300)]


def jitter(x: int, rng: np.random.Generator) -> float:
    return x + float(rng.random())


def build(
    n: int, size: int, drop_last: bool, seed: int, workers: int, backend: str, ordered: bool
) -> pf.Loader:
    return (
        pf.indices(n)
        | pf.shuffle(seed=seed)
        | pf.random_map(lambda i, rng: (i, int(rng.integers(1000))), seed=seed)
        | pf.batch(size, drop_last=drop_last)
        | pf.parallel_map(pf.map(_key), workers=workers, backend=backend, ordered=ordered)
    )


def _key(batch: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    return tuple(batch)


def run_interrupted(make, k: int, make_resumed, epochs: int = 2) -> tuple[list[Any], dict]:
    """Consume k outputs (across epochs), take the state, resume in a fresh loader, finish."""
    first = make()
    got: list[Any] = []
    for _ in range(epochs):
        it = iter(first)
        while len(got) < k:
            try:
                got.append(next(it))
            except StopIteration:
                break
        if len(got) == k:
            break
    state = json.loads(json.dumps(first.state_dict()))
    first.close()
    second = make_resumed()
    second.load_state_dict(state)
    second.load_state_dict(state)  # loading twice is the same as once
    done_epochs = state["epoch"]
    while done_epochs < epochs:
        got.extend(second)
        done_epochs += 1
    second.close()
    return got, state


@given(
    n=st.integers(0, 90),
    size=st.integers(1, 12),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**63),
    workers=st.sampled_from([0, 1, 2, 3]),
    resume_workers=st.sampled_from([0, 1, 2]),
    ordered=st.booleans(),
    data=st.data(),
)
@example(n=0, size=1, drop_last=False, seed=0, workers=0, resume_workers=0, ordered=True, data=None)
@settings(max_examples=40)
def test_first_k_plus_resumed_rest_equals_uninterrupted(
    n, size, drop_last, seed, workers, resume_workers, ordered, data
) -> None:
    def make(w: int = workers) -> pf.Loader:
        return build(n, size, drop_last, seed, w, "thread", ordered)

    reference = make(0)
    want = list(reference) + list(reference)
    k = 0 if data is None else data.draw(st.integers(0, len(want)), label="k")
    got, state = run_interrupted(make, k, lambda: make(resume_workers))
    if ordered:
        assert got == want
    else:  # the same items, each exactly once
        assert Counter(got) == Counter(want)
    assert len(json.dumps(state)) < 2000


@pytest.mark.parametrize("ordered", [True, False])
@pytest.mark.parametrize(("before", "after"), [(2, 1), (1, 3), (2, 0)])
def test_resume_across_process_worker_counts(before: int, after: int, ordered: bool) -> None:
    def make(w: int) -> pf.Loader:
        return build(80, 7, False, 11, w, "process", ordered)

    ref = make(0)
    want = list(ref) + list(ref)
    for k in (0, 5, 12, len(want)):
        got, _ = run_interrupted(lambda: make(before), k, lambda: make(after))
        assert got == want if ordered else Counter(got) == Counter(want)


def test_output_is_bit_identical_for_any_worker_count_and_backend() -> None:
    def make(workers: int, backend: str) -> pf.Loader:
        aug = pf.fetch(DATA) | pf.random_map(jitter, seed=3)
        return (
            pf.indices(60)
            | pf.shuffle(seed=1)
            | pf.parallel_map(aug, workers=workers, backend=backend)
            | pf.batch(8)
        )

    want = list(make(0, "thread"))
    for workers, backend in [(1, "thread"), (2, "thread"), (4, "thread"), (2, "process")]:
        assert list(make(workers, backend)) == want


def test_unordered_output_is_the_same_multiset_for_any_worker_count() -> None:
    def make(workers: int, backend: str) -> pf.Loader:
        aug = pf.fetch(DATA) | pf.random_map(jitter, seed=3)
        stage = pf.parallel_map(aug, workers=workers, backend=backend, ordered=False)
        return pf.indices(60) | pf.shuffle(seed=1) | stage

    want = Counter(make(0, "thread"))
    for workers, backend in [(1, "thread"), (4, "thread"), (2, "process")]:
        assert Counter(make(workers, backend)) == want


def test_random_map_torch_generators_are_deterministic() -> None:
    def noise(x: int, g: torch.Generator) -> float:
        return float(torch.rand(1, generator=g))

    a = pf.indices(5) | pf.random_map(noise, seed=2, generator="torch")
    b = pf.indices(5) | pf.parallel_map(pf.random_map(noise, seed=2, generator="torch"), workers=2)
    first = list(a)
    assert first == list(b)
    assert len(set(first)) == 5
    assert list(a) != first  # epoch 1 draws other numbers


# -- resuming is cheap: consumed items are not fetched again -------------------------------------
class Counting:
    def __init__(self, n: int) -> None:
        self.n = n
        self.fetched: list[int] = []

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        self.fetched.append(i)
        return i


def test_skip_is_pushed_down_to_the_indices() -> None:
    def make(ds: Counting) -> pf.Loader:
        return pf.indices(ds) | pf.shuffle(seed=0) | pf.batch(10) | pf.fetch(ds) | pf.collate(sum)

    first_ds = Counting(100)
    first = make(first_ds)
    it = iter(first)
    consumed = [next(it) for _ in range(9)]
    state = first.state_dict()
    resumed_ds = Counting(100)
    resumed = make(resumed_ds)
    resumed.load_state_dict(state)
    rest = list(resumed)
    assert len(rest) == 1 and len(resumed_ds.fetched) == 10  # only the last batch is fetched
    assert sorted(first_ds.fetched[:90] + resumed_ds.fetched) == list(range(100))
    assert sum(consumed) + sum(rest) == sum(range(100))


def test_a_filter_is_replayed_not_skipped_and_still_exact() -> None:
    def make(ds: Counting) -> pf.Loader:
        return pf.indices(ds) | pf.fetch(ds) | pf.filter(lambda x: x % 3) | pf.batch(4)

    want = list(make(Counting(40)))
    first = make(Counting(40))
    it = iter(first)
    head = [next(it) for _ in range(3)]
    resumed = make(Counting(40))
    resumed.load_state_dict(first.state_dict())
    assert head + list(resumed) == want


# -- the state itself ---------------------------------------------------------------------------
def test_state_at_epoch_boundaries_and_after_set_epoch() -> None:
    loader = pf.indices(10) | pf.batch(3)
    assert loader.state_dict()["epoch"] == 0 and loader.state_dict()["position"] == 0
    list(loader)
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (1, 0)
    it = iter(loader)
    for _ in range(4):  # every batch of epoch 1, but not yet the end of the iterator
        next(it)
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (1, 4)
    with pytest.raises(StopIteration):
        next(it)
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (2, 0)
    loader.set_epoch(7)
    assert (loader.state_dict()["epoch"], loader.state_dict()["position"]) == (7, 0)


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_on_the_last_step_resumes_to_the_next_epoch_not_a_repeat(workers) -> None:
    """A loop that checkpoints every N steps, N dividing the epoch, saves on the last step of
    the epoch before the pass ends: resumed, the rest of that epoch is empty, and the next
    pass is the next epoch (it used to replay the whole next epoch as "the rest")."""

    def make() -> pf.Loader:
        work = pf.parallel_map(sorted, workers=workers) if workers else pf.map(sorted)
        return pf.indices(12) | pf.shuffle(seed=3) | pf.batch(4) | work

    loader = make()
    saved = None
    epochs = []
    for epoch in range(2):
        loader.set_epoch(epoch)
        got = []
        for step, batch in enumerate(loader, 1):
            got.append(batch)
            if epoch == 0 and step == 3:  # the last step of epoch 0: checkpoint
                saved = loader.state_dict()
        epochs.append(got)
    assert saved is not None and (saved["epoch"], saved["position"]) == (0, 3)
    resumed = make()
    resumed.load_state_dict(saved)
    assert list(resumed) == []  # the rest of epoch 0
    assert resumed.epoch == 0
    assert list(resumed) == epochs[1]  # then epoch 1, once
    assert resumed.epoch == 1


NO_WORKER = """
import json
import pipeflow as pf
from tests.conftest import children
loader = pf.indices(10) | pf.parallel_map(abs, workers=2, backend="process", persistent=True)
before = children()
state = loader.state_dict()
print(json.dumps({"started": sorted(children() - before), "position": state["position"]}))
"""


def test_state_dict_starts_no_worker() -> None:
    # In a process of its own: in this one, another test's workers may still be starting or
    # ending on a busy machine, and a child count here would count them.
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(root)}
    done = subprocess.run(
        [sys.executable, "-c", NO_WORKER], cwd=root, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got == {"started": [], "position": 0}


# -- the DataLoader facade -----------------------------------------------------------------------
class Pairs(tud.Dataset):
    def __len__(self) -> int:
        return 45

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return np.full(2, i, dtype=np.float32), i


def dl(workers: int, in_order: bool = True) -> pf.DataLoader:
    return pf.DataLoader(
        Pairs(),
        batch_size=4,
        shuffle=True,
        num_workers=workers,
        in_order=in_order,
        generator=torch.Generator().manual_seed(5),
    )


@pytest.mark.parametrize(("before", "after"), [(0, 0), (2, 0), (0, 2), (2, 1)])
@pytest.mark.parametrize("in_order", [True, False])
def test_dataloader_state_dict_resumes_across_worker_counts(before, after, in_order) -> None:
    ref = dl(0)
    want = [b[1].tolist() for _ in range(2) for b in ref]
    for k in (0, 4, 11, 12, 20):
        first = dl(before, in_order)
        got: list[Any] = []
        for _ in range(2):
            it = iter(first)
            while len(got) < k:
                try:
                    got.append(next(it)[1].tolist())
                except StopIteration:
                    break
            if len(got) == k:
                break
        state = json.loads(json.dumps(first.state_dict()))
        second = dl(after, in_order)
        second.load_state_dict(state)
        for _ in range(state["loader"]["epoch"], 2):
            got.extend(b[1].tolist() for b in second)
        if in_order:
            assert got == want, k
        else:
            assert sorted(map(tuple, got)) == sorted(map(tuple, want)), k
