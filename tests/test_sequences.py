"""The sequence stages — ``pack``, ``bucket``, ``batch(max_tokens=...)`` — keep every token or
sample exactly once, stay within their row length or budget, give the same output for any
worker count, and resume exactly (issue 26)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import pipeflow as pf
from tests._sequences import STAGES, Corpus, loader, origin, plain
from tests.strategies import epochs, seeds, sequence_lengths

ROOT = Path(__file__).resolve().parent.parent


def tokens_of(corpus: Corpus) -> Counter[int]:
    return Counter(t for i in range(len(corpus)) for t in corpus[i].tolist())


# -- pack ---------------------------------------------------------------------------------------
def check_row(row: dict[str, Any], length: int) -> list[list[int]]:
    """The row's segments (their tokens), after checking that its segment ids and positions
    are what its tokens say: segments 1, 2, ... then 0 on padding, positions from 0 in each,
    and each segment a run of one sequence's consecutive tokens."""
    tokens, ids, pos = row["tokens"], row["segment_ids"], row["positions"]
    assert tokens.shape == ids.shape == pos.shape == (length,)
    used = int((ids > 0).sum())
    assert (ids[used:] == 0).all() and (pos[used:] == 0).all() and (tokens[used:] == 0).all()
    segments = []
    for k in range(1, int(ids.max(initial=0)) + 1):
        where = np.flatnonzero(ids == k)
        assert (
            where.size
            and (np.diff(where) == 1).all()
            and (where[0] == 0 or ids[where[0] - 1] == k - 1)
        )
        seg = tokens[where].tolist()
        assert pos[where].tolist() == list(range(len(seg)))
        seq, first = origin(seg[0])
        assert [origin(t) for t in seg] == [(seq, first + j) for j in range(len(seg))]
        segments.append(seg)
    return segments


@given(lengths=sequence_lengths, window=st.integers(1, 5))
@example(lengths=[], window=1)
@example(lengths=[16, 16, 0, 33], window=1)
def test_first_fit_packs_every_token_once_and_splits_only_what_a_row_cannot_hold(
    lengths, window
) -> None:
    corpus = Corpus(lengths)
    rows = list(pf.indices(corpus) | pf.fetch(corpus, batched=False) | pf.pack(16, window=window))
    segments = [seg for row in rows for seg in check_row(row, 16)]
    assert Counter(t for seg in segments for t in seg) == tokens_of(corpus)
    pieces = Counter(origin(seg[0])[0] for seg in segments)
    assert pieces == {i: -(-n // 16) for i, n in enumerate(lengths) if n}


@given(lengths=sequence_lengths, window=st.integers(1, 5))
@example(lengths=[5, 40, 3], window=1)
def test_concat_keeps_the_order_and_pads_at_most_one_row_per_window(lengths, window) -> None:
    corpus = Corpus(lengths)
    loader_ = (
        pf.indices(corpus)
        | pf.fetch(corpus, batched=False)
        | pf.pack(16, window=window, method="concat")
    )
    rows = list(loader_)
    flat = [t for row in rows for seg in check_row(row, 16) for t in seg]
    assert flat == [t for i in range(len(corpus)) for t in corpus[i].tolist()]
    partial = sum(int((row["segment_ids"] == 0).any()) for row in rows)
    assert partial <= len(rows) // (window + 1) + 1
    stats = next(s for s in loader_.stats().stages if s.name == "pack")
    assert stats.real_tokens == sum(lengths) and stats.padded_tokens == 16 * len(rows)


def test_pack_takes_arrays_tensors_and_lists_and_refuses_what_is_not_1d() -> None:
    import torch

    items = [np.array([1, 2], np.int32), torch.tensor([3, 4, 5], dtype=torch.int32), [6]]
    (row,) = pf.from_iterable(items) | pf.pack(8)
    assert row["tokens"].tolist() == [1, 2, 3, 4, 5, 6, 0, 0] and row["segment_ids"].max() == 3
    with pytest.raises(ValueError, match=r"pack: every item must be a 1-D sequence .*\(2, 2\)"):
        list(pf.from_iterable([np.ones((2, 2))]) | pf.pack(8))


def test_packing_efficiency_is_in_stats() -> None:
    corpus = Corpus([10, 10, 10, 10])
    loader_ = pf.indices(corpus) | pf.fetch(corpus, batched=False) | pf.pack(16, window=2)
    rows = list(loader_)
    stats = loader_.stats()
    (packed,) = (s for s in stats.stages if s.name == "pack")
    assert (packed.real_tokens, packed.padded_tokens) == (40, 16 * len(rows))
    assert packed.efficiency == pytest.approx(40 / (16 * len(rows)))
    assert f"efficiency: {100 * 40 / 64:.1f}% real tokens (40 of 64) (in 'pack')" in str(stats)
    assert all(s.efficiency is None for s in stats.stages if s.name != "pack")


# -- bucket and batch by budget ---------------------------------------------------------------
BUDGET_STAGES = ["batch-in-order", "batch-window", "bucket-window", "bucket-index"]


@pytest.mark.parametrize("name", BUDGET_STAGES)
@given(lengths=sequence_lengths)
@example(lengths=[])
@example(lengths=[48, 0, 0, 1])
def test_every_sample_comes_once_in_batches_within_the_budget(name: str, lengths) -> None:
    corpus = Corpus(lengths)
    batches = [plain(b) for b in loader(name, corpus)]
    seen = Counter(tuple(seq) for b in batches for seq in b)
    assert seen == Counter(tuple(corpus[i].tolist()) for i in range(len(corpus)))
    for b in batches:
        assert b
        if name == "bucket-window":  # one bucket per batch, at most batch_size
            assert len({(len(s) > 4) + (len(s) > 12) for s in b}) == 1 and len(b) <= 3
        else:
            assert len(b) * max(max(len(s) for s in b), 1) <= 48


@given(lengths=sequence_lengths.filter(lambda xs: len(xs) > 1), seed=seeds, epoch=epochs)
def test_bucket_by_index_knows_its_length_and_ignores_the_order_it_reads(
    lengths, seed, epoch
) -> None:
    stage = pf.bucket(4, lengths=lengths, batch_size=3, seed=seed)
    in_order, shuffled = (
        pf.indices(len(lengths)) | stage,
        pf.indices(len(lengths)) | pf.shuffle(seed=1) | stage,
    )
    in_order.set_epoch(epoch)
    shuffled.set_epoch(epoch)
    got = list(in_order)
    assert got == list(shuffled) and len(got) == len(in_order)
    assert sorted(i for b in got for i in b) == list(range(len(lengths)))


def test_bucket_quantiles_split_the_table_into_buckets_of_about_equal_counts() -> None:
    lengths = [int(n) for n in np.random.default_rng(0).lognormal(5, 1, size=1000)]
    stage = pf.bucket(4, lengths=lengths, batch_size=8, seed=0)
    bounds = stage.config["boundaries"]
    counts = np.bincount(np.searchsorted(bounds, lengths, side="left"), minlength=4)
    assert len(bounds) == 3 and counts.min() >= 240 and f"boundaries={bounds}" in repr(stage)


def test_bucket_by_index_refuses_an_input_its_length_would_lie_about() -> None:
    with pytest.raises(ValueError, match="index 1 came more than once"):
        list(pf.from_iterable([0, 1, 1]) | pf.bucket([2], lengths=[1, 2, 3], batch_size=2))
    with pytest.raises(ValueError, match="index 9 is outside lengths="):
        list(pf.from_iterable([9]) | pf.bucket([2], lengths=[1, 2, 3], batch_size=2))
    with pytest.raises(TypeError, match="put it before fetch"):
        list(pf.from_iterable([[1, 2]]) | pf.bucket([2], lengths=[1, 2, 3], batch_size=2))


def test_an_item_over_the_budget_is_refused_with_the_fix() -> None:
    with pytest.raises(
        ValueError, match=r"length 9 is longer than max_tokens=8, so no batch .* crop long items"
    ):
        list(pf.from_iterable(["a" * 9]) | pf.batch(max_tokens=8, length=len))
    with pytest.raises(ValueError, match="length 9 is longer than max_tokens=8"):
        pf.bucket([2], lengths=[1, 9], max_tokens=8)


@pytest.mark.parametrize("name", ["batch-window", "bucket-window", "bucket-index"])
def test_the_order_comes_from_the_seed_and_the_epoch(name: str) -> None:
    corpus = Corpus([int(n) for n in np.random.default_rng(2).integers(0, 30, size=200)])
    first, twin = loader(name, corpus), loader(name, corpus)
    a, b = [plain(x) for x in first], [plain(x) for x in first]  # epochs 0 and 1
    assert a == [plain(x) for x in twin] and a != b


def test_sequence_stages_refuse_bad_combinations_when_built() -> None:
    with pytest.raises(ValueError, match="batch: window goes with max_tokens="):
        pf.batch(4, window=3)
    with pytest.raises(ValueError, match="batch: seed orders the batches of a window"):
        pf.batch(max_tokens=8, length=len, seed=1)
    with pytest.raises(TypeError, match="batch: max_tokens needs length="):
        pf.batch(max_tokens=8)
    with pytest.raises(TypeError, match="bucket: length= reads items in windows; pass window="):
        pf.bucket([2], length=len, batch_size=2)
    with pytest.raises(ValueError, match="bucket: boundaries as a count of buckets"):
        pf.bucket(3, length=len, batch_size=2, window=4)
    with pytest.raises(
        ValueError, match=r"bucket: batch_size needs one size per bucket, 2 \(got 3\)"
    ):
        pf.bucket([2], length=len, batch_size=[1, 2, 3], window=4)


# -- any worker count, and resumption ---------------------------------------------------------
WORKERS = [(0, "thread"), (1, "thread"), (3, "thread"), (2, "process")]


@pytest.mark.parametrize("name", list(STAGES))
def test_the_same_output_for_any_worker_count(name: str, no_leaks) -> None:
    lengths = np.random.default_rng(3).lognormal(2, 0.9, size=150).clip(0, 40)
    corpus = Corpus([int(n) for n in lengths])  # a long tail, within the budgets
    runs = []
    for workers, backend in WORKERS:
        with loader(name, corpus, workers, backend) as run:
            runs.append([plain(x) for x in run])
    assert all(r == runs[0] for r in runs[1:])


@pytest.mark.parametrize("name", list(STAGES))
@given(lengths=sequence_lengths, workers=st.integers(1, 4))
def test_the_same_output_for_any_number_of_thread_workers(name: str, lengths, workers) -> None:
    corpus = Corpus(lengths)
    alone = [plain(x) for x in loader(name, corpus)]
    with loader(name, corpus, workers, "thread") as run:
        assert [plain(x) for x in run] == alone


def test_a_state_from_another_table_of_lengths_is_refused() -> None:
    run = pf.indices(4) | pf.bucket([2], lengths=[1, 2, 3, 4], batch_size=2, seed=0)
    next(iter(run))
    other = pf.indices(4) | pf.bucket([2], lengths=[4, 3, 2, 1], batch_size=2, seed=0)
    with pytest.raises(ValueError, match="the state is from a different pipeline: stage 1"):
        other.load_state_dict(run.state_dict())


@pytest.mark.parametrize("name", list(STAGES))
@given(lengths=sequence_lengths, data=st.data())
@example(lengths=[3] * 30, data=None)
def test_resuming_after_any_output_gives_exactly_the_rest(name: str, lengths, data) -> None:
    corpus = Corpus(lengths)
    whole = [plain(x) for x in loader(name, corpus)]
    k = data.draw(st.integers(0, len(whole))) if data is not None else len(whole) // 2
    first = loader(name, corpus)
    it = iter(first)
    for _ in range(k):
        next(it)
    state = json.loads(json.dumps(first.state_dict()))
    restarted = loader(name, corpus)
    restarted.load_state_dict(state)
    assert [plain(x) for x in restarted] == whole[k:]
    assert [plain(x) for x in restarted] == [plain(x) for x in loader_at(name, corpus, 1)]


def loader_at(name: str, corpus: Corpus, epoch: int) -> Any:
    run = loader(name, corpus)
    run.set_epoch(epoch)
    return run


class Counted:
    """A corpus that counts the sequences read from it."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus, self.reads = corpus, 0

    def __len__(self) -> int:
        return len(self.corpus)

    def __getitem__(self, i: int) -> Any:
        self.reads += 1
        return self.corpus[i]


@pytest.mark.parametrize(
    ("stage", "bound"),
    [
        # tokens: what 4 open rows hold, and the sequence that did not fit
        (pf.pack(16, window=4), lambda lengths: 4 * 16 + max(lengths)),
        (pf.pack(16, window=4, method="concat"), lambda lengths: 5 * 16 + max(lengths)),
        (pf.batch(max_tokens=48, length=len, window=10, seed=0), lambda lengths: 10 * max(lengths)),
    ],
    ids=["first_fit", "concat", "batch-window"],
)
def test_a_resumed_pass_rereads_at_most_one_buffer(stage: Any, bound: Any) -> None:
    lengths = [int(n) for n in np.random.default_rng(4).integers(1, 16, size=600)]
    corpus = Counted(Corpus(lengths))
    run = pf.indices(corpus) | pf.fetch(corpus, batched=False) | stage
    whole = len(list(run))
    for k in (whole // 3, whole * 9 // 10):
        corpus.reads = 0
        it = iter(run)
        for _ in range(k):
            next(it)
        read_before, state = corpus.reads, run.state_dict()
        restart = next(v["inputs"] for v in state["stages"].values())
        reread = lengths[restart:read_before]  # read again by the resumed pass
        assert read_before >= restart and sum(reread) <= bound(lengths)


def test_kill_then_resume_in_a_new_process_gives_exactly_the_rest(tmp_path) -> None:
    name, k = "pack-first_fit", 25
    from tests._sequences import SCENARIO_LENGTHS

    whole = [plain(x) for x in loader(name, Corpus(SCENARIO_LENGTHS))]
    state, rows = str(tmp_path / "state.json"), str(tmp_path / "rows.json")
    cmd = [sys.executable, "-m", "tests._sequences"]
    child = subprocess.Popen(
        [*cmd, "save", state, rows, name, str(k)], cwd=ROOT, start_new_session=True
    )
    try:
        deadline = time.monotonic() + 60
        while not os.path.exists(state) and child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert os.path.exists(state), f"the run wrote no state (exit code {child.poll()})"
        os.killpg(child.pid, signal.SIGKILL)  # the run and its workers, mid-epoch
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            os.killpg(child.pid, signal.SIGKILL)
    subprocess.run([*cmd, "rest", state, rows, name, "0"], cwd=ROOT, check=True, timeout=60)
    with open(rows) as f:
        assert json.load(f) == json.loads(json.dumps(whole[k:]))
