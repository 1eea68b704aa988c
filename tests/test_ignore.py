"""stages/ignore.py: ignore_errors — drops failed samples or batches within a budget, counts and logs
them, and resumes exactly."""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests.flaky import BACKENDS, Flaky, FlakyBatched, _plain, batches_of, drain


@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 40),
    bad=st.sets(st.integers(0, 39), max_size=6),
    size=st.integers(1, 7),
    backend=st.sampled_from(BACKENDS),
    ordered=st.booleans(),
    batched=st.booleans(),
)
@example(n=6, bad={2, 3}, size=2, backend=(0, "thread"), ordered=True, batched=False)
def test_ignore_errors_yields_exactly_the_good_samples(n, bad, size, backend, ordered, batched):
    workers, kind = backend
    ds = FlakyBatched(n, bad) if batched else Flaky(n, bad)
    work = pf.fetch(ds) | pf.collate()
    if workers:
        work = pf.parallel_map(work, workers=workers, backend=kind, ordered=ordered)
    loader = pf.indices(n) | pf.batch(size) | work | pf.ignore_errors()
    got = drain(loader)
    assert not [x for x in got if isinstance(x, tuple)]
    want = batches_of(list(range(n)), size)
    if batched:  # __getitems__ fails as a whole: the batch is dropped
        expected = [b for b in want if not set(b) & bad]
    else:  # sample by sample: the batch goes on without its failed samples
        expected = [[i for i in b if i not in bad] for b in want]
        expected = [b for b in expected if b]
    if ordered or not workers:
        assert got == expected
    else:
        assert sorted(got) == sorted(expected)
    ignored = loader.stats().stages[-1]
    failed = sorted(bad & set(range(n)))
    if batched:
        assert sorted(ignored.ignored_indices) == sorted(i for b in want if set(b) & bad for i in b)
    else:  # a batch whose every sample failed is dropped whole, as one item
        assert sorted(ignored.ignored_indices) == failed
        whole = [b for b in want if b and set(b) <= bad]
        assert ignored.ignored_errors == len(failed) - sum(len(b) - 1 for b in whole)


class Counting(Flaky):
    def __init__(self, n: int, bad: set[int]) -> None:
        super().__init__(n, bad)
        self.calls: list[int] = []

    def __getitem__(self, i: int) -> np.ndarray:
        self.calls.append(i)
        return super().__getitem__(i)


@given(n=st.integers(0, 60), bad=st.sets(st.integers(0, 59), max_size=10), size=st.integers(1, 9))
def test_a_batch_with_failed_samples_reads_each_index_once(n, bad, size) -> None:
    ds = Counting(n, bad)
    loader = pf.indices(n) | pf.batch(size) | pf.fetch(ds) | pf.ignore_errors()
    got = [[int(x[0]) for x in b] for b in loader]
    assert ds.calls == list(range(n))  # in order, each once: none skipped, none read twice
    assert got == [
        b for b in ([i for i in b if i not in bad] for b in batches_of(list(range(n)), size)) if b
    ]


def test_ignore_errors_counts_names_and_logs_once_per_epoch(caplog) -> None:
    loader = pf.indices(10) | pf.batch(5) | pf.fetch(Flaky(10, {3, 8})) | pf.ignore_errors()
    with caplog.at_level(logging.WARNING, logger="pipeflow"):
        assert drain(loader) == [[0, 1, 2, 4], [5, 6, 7, 9]]
        drain(loader)
    text = str(loader.stats())
    assert "ignored errors: 4 (sample indices 3, 8, 3, 8) (in 'ignore_errors')" in text
    logged = [r.getMessage() for r in caplog.records]
    assert len(logged) == 2  # once per epoch
    assert logged[0].startswith(
        "pipeflow: ignore_errors dropped 2 failed items in epoch 0 (sample indices [3, 8])"
    )


def test_ignore_errors_lets_other_exceptions_through() -> None:
    def parse(i: int) -> int:
        if i == 1:
            raise ValueError("bad value")
        if i == 3:
            raise OSError("bad file")
        return i

    loader = pf.indices(5) | pf.map(parse) | pf.ignore_errors(exceptions=OSError)
    assert drain(loader) == [0, ("error", "ValueError", "bad value"), 2, 4]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"max_count": 1},
            r"2 items failed this epoch \(sample indices \[2, 5\]\), over the budget \(max_count=1\)",
        ),
        ({"max_fraction": 0.1}, r"2 items failed .* \(max_fraction=0.1 of 12 items\)"),
    ],
)
def test_over_the_budget_raises_saying_how_many_which_and_the_budget(kwargs, message) -> None:
    loader = pf.indices(12) | pf.fetch(Flaky(12, {2, 5})) | pf.ignore_errors(**kwargs)
    with pytest.raises(pf.ErrorBudgetExceeded, match=message) as info:
        list(loader)
    assert isinstance(info.value.__cause__, OSError)


def test_within_the_budget_nothing_is_raised() -> None:
    loader = pf.indices(12) | pf.map(Flaky(12, {2, 5}).__getitem__) | pf.ignore_errors(max_count=2)
    assert len(list(loader)) == 10


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_after_ignored_errors_resumes_exactly_without_reading_them_again(workers) -> None:
    reads: list[int] = []

    class Counting(Flaky):
        def __getitem__(self, i: int) -> np.ndarray:
            reads.append(i)
            return super().__getitem__(i)

    def make() -> pf.Loader:
        work: Any = pf.map(Counting(20, {4, 5, 11}).__getitem__)
        if workers:
            work = pf.parallel_map(Counting(20, {4, 5, 11}).__getitem__, workers=workers)
        return pf.indices(20) | work | pf.ignore_errors()

    whole = [int(x[0]) for x in make()]
    loader = make()
    it = iter(loader)
    head = [int(next(it)[0]) for _ in range(5)]  # 0 1 2 3 6: past the two dropped
    state = loader.state_dict()
    it.close()
    reads.clear()
    resumed = make()
    resumed.load_state_dict(state)
    rest = [int(x[0]) for x in resumed]
    assert head + rest == whole
    assert 4 not in reads and 5 not in reads  # dropped items are not read again


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_after_samples_dropped_from_a_batch_resumes_exactly(workers) -> None:
    def make() -> pf.Loader:
        work: Any = pf.fetch(Flaky(12, {1})) | pf.collate()
        if workers:
            work = pf.parallel_map(work, workers=workers)
        return pf.indices(12) | pf.batch(4) | work | pf.ignore_errors()

    loader = make()
    it = iter(loader)
    assert [_plain(next(it)) for _ in range(2)] == [[0, 2, 3], [4, 5, 6, 7]]
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert drain(resumed) == [[8, 9, 10, 11]]


def test_ignore_errors_costs_nothing_when_nothing_fails() -> None:
    plain = pf.indices(50) | pf.batch(8) | pf.fetch(Flaky(50)) | pf.collate()
    guarded = plain | pf.ignore_errors()
    assert drain(plain) == drain(guarded)
    assert len(guarded) == len(plain)


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"exceptions": "OSError"}, TypeError, "exceptions must be an exception class"),
        ({"exceptions": ()}, TypeError, "exceptions must be an exception class"),
        ({"max_count": -1}, ValueError, r"max_count must be at least 0 \(got -1\)"),
        ({"max_count": 1.5}, TypeError, r"max_count must be an integer or None \(got 1.5\)"),
        ({"max_fraction": 2}, ValueError, r"max_fraction must be between 0 and 1 \(got 2\)"),
        ({"max_fraction": "x"}, TypeError, "max_fraction must be a number or None"),
    ],
)
def test_ignore_errors_bad_arguments_fail_when_built(kwargs, error, message) -> None:
    with pytest.raises(error, match=message):
        pf.ignore_errors(**kwargs)
