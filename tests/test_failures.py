"""A failed item does not end the epoch; ignore_errors drops failures within a budget."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf


class Flaky:
    """Samples 0 .. n-1 as arrays; the indices in *bad* raise OSError ("a corrupt file")."""

    def __init__(self, n: int, bad: frozenset[int] | set[int] = frozenset()) -> None:
        self.n = n
        self.bad = frozenset(bad)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        if i in self.bad:
            raise OSError(f"corrupt sample {i}")
        return np.array([i])


class FlakyBatched(Flaky):
    def __getitems__(self, idx: list[int]) -> list[np.ndarray]:
        return [self[i] for i in idx]


def drain(loader: Any) -> list[Any]:
    """Every outcome of one pass: a batch as a list of ints, or ("error", type, message)."""
    out: list[Any] = []
    it = iter(loader)
    while True:
        try:
            item = next(it)
        except StopIteration:
            return out
        except Exception as e:
            out.append(("error", type(e).__name__, str(e)))
        else:
            out.append(_plain(item))


def _plain(item: Any) -> Any:
    if isinstance(item, torch.Tensor):
        return item.flatten().tolist()
    if isinstance(item, list):
        return [_plain(x) for x in item]
    return item


def batches_of(order: list[int], size: int) -> list[list[int]]:
    return [order[i : i + size] for i in range(0, len(order), size)]


BACKENDS = [(0, "thread"), (1, "thread"), (2, "thread"), (2, "process")]


# -- the default: raise at its turn, go on ------------------------------------------------
@settings(max_examples=25, deadline=None)
@given(
    n=st.integers(0, 40),
    bad=st.sets(st.integers(0, 39), max_size=6),
    size=st.integers(1, 7),
    backend=st.sampled_from(BACKENDS),
    ordered=st.booleans(),
)
@example(n=10, bad={2}, size=2, backend=(0, "thread"), ordered=True)
def test_every_good_batch_once_and_one_raise_per_failed_batch(n, bad, size, backend, ordered):
    workers, kind = backend
    work = pf.fetch(Flaky(n, bad)) | pf.collate()
    if workers:
        work = pf.parallel_map(work, workers=workers, backend=kind, ordered=ordered)
    loader = pf.indices(n) | pf.shuffle(seed=n) | pf.batch(size) | work
    order = list(pf.indices(n) | pf.shuffle(seed=n))
    want = batches_of(order, size)
    got = drain(loader)
    good = [b for b in want if not set(b) & bad]
    failed = [b for b in want if set(b) & bad]
    batches = [x for x in got if not isinstance(x, tuple)]
    errors = [x for x in got if isinstance(x, tuple)]
    assert len(errors) == len(failed)
    assert all(e[1] == "OSError" for e in errors)
    if ordered or not workers:
        # in order: each failed batch raises exactly at its turn
        assert got == [("error", "OSError", _message(b, bad)) if b in failed else b for b in want]
    else:
        assert sorted(batches) == sorted(good)


def _message(batch: list[int], bad: set[int]) -> str:
    first = next(i for i in batch if i in bad)
    return f"corrupt sample {first}"


def test_a_failing_map_goes_on_in_the_pipe_api() -> None:
    loader = pf.indices(6) | pf.map(lambda i: 10 // (i - 2))
    assert drain(loader) == [
        -5,
        -10,
        ("error", "ZeroDivisionError", "integer division or modulo by zero"),
        10,
        5,
        3,
    ]


def test_a_failed_item_keeps_its_type_traceback_and_note() -> None:
    loader = pf.indices(6) | pf.batch(2) | pf.fetch(Flaky(6, {3})) | pf.collate()
    it = iter(loader)
    next(it)
    with pytest.raises(OSError, match="corrupt sample 3") as info:
        next(it)
    assert info.value.__notes__ == [
        "pipeflow: stage 'fetch' failed on sample index 3 (batch [2, 3], epoch 0)"
    ]
    assert any(entry.name == "__getitem__" for entry in info.traceback)
    assert _plain(next(it)) == [4, 5]


def test_a_source_that_raised_ends_the_pass_after_raising() -> None:
    def stream():
        yield 1
        yield 2
        raise OSError("connection lost")

    loader = pf.from_iterable(stream()) | pf.map(lambda x: x * 10)
    assert drain(loader) == [10, 20, ("error", "OSError", "connection lost")]


def test_a_resumed_state_counts_a_raised_failure_as_consumed() -> None:
    make = lambda: pf.indices(8) | pf.batch(2) | pf.fetch(Flaky(8, {2})) | pf.collate()  # noqa: E731
    loader = make()
    it = iter(loader)
    next(it)
    with pytest.raises(OSError):
        next(it)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    assert drain(resumed) == [[4, 5], [6, 7]]


# -- ignore_errors --------------------------------------------------------------------------
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


# -- the facade against torch itself -------------------------------------------------------
def _outcomes(dl: Any) -> list[Any]:
    out = []
    it = iter(dl)
    while True:
        try:
            batch = next(it)
        except StopIteration:
            return out
        except Exception as e:
            out.append(("error", type(e).__name__, str(e).splitlines()[0]))
        else:
            out.append(_plain(batch))


def bad_collate(batch: list[Any]) -> Any:
    if any(int(x[0]) == 6 for x in batch):
        raise ValueError("cannot collate 6")
    return tud.default_collate(batch)


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("where", ["getitem", "collate_fn"])
def test_the_facade_gives_torchs_batches_and_errors(workers, where) -> None:
    ds = Flaky(12, {2} if where == "getitem" else set())
    kwargs: dict[str, Any] = {"batch_size": 2, "num_workers": workers}
    if where == "collate_fn":
        kwargs["collate_fn"] = bad_collate
    ours = _outcomes(pf.DataLoader(ds, **kwargs))
    theirs = _outcomes(tud.DataLoader(ds, **kwargs))
    assert [o if not isinstance(o, tuple) else o[:2] for o in ours] == [
        o if not isinstance(o, tuple) else o[:2] for o in theirs
    ]
    assert len([o for o in ours if isinstance(o, tuple)]) == 1
    # torch's message is the original's, sometimes after "Caught ... in DataLoader worker"
    mine = next(o for o in ours if isinstance(o, tuple))[2]
    assert mine in ("corrupt sample 2", "cannot collate 6")


# -- an iterator that raises on every next() ends the pass; it does not hold it ---------------
class AlwaysRaising:
    """A stream that yields *good* items, then raises on every ``next()`` (a lost connection)."""

    def __init__(self, good: int) -> None:
        self.good = good

    def __iter__(self) -> Iterator[int]:
        return _Raising(self.good)


class _Raising:
    def __init__(self, left: int) -> None:
        self.left = left

    def __iter__(self) -> _Raising:
        return self

    def __next__(self) -> int:
        if self.left == 0:
            raise ConnectionError("the stream's connection is gone")
        self.left -= 1
        return self.left


@pytest.mark.parametrize("workers", [0, 2])
def test_an_iterator_raising_on_every_next_ends_the_pass(workers: int) -> None:
    from pipeflow._wrappers import _STUCK

    loader = pf.from_iterable(AlwaysRaising(5)) | pf.batch(2)
    if workers:  # each worker a replica of the stream, as torch runs an IterableDataset
        loader = pf.parallel_source(loader, workers=workers, backend="process")
    got = drain(loader)  # returns: the pass ends, in bounded time and memory
    batches = [x for x in got if x[0] != "error"]
    errors = [x for x in got if x[0] == "error"]
    replicas = max(workers, 1)
    assert sorted(i for b in batches for i in b) == sorted([4, 3, 2, 1, 0] * replicas)
    stuck = [e for e in errors if e[1] == "StageStuckError"]
    assert len(stuck) == replicas
    assert all(e[1] == "ConnectionError" for e in errors if e not in stuck)
    assert len(errors) == replicas * (_STUCK + 1)


def test_ignore_errors_never_drops_a_stuck_stage() -> None:
    loader = pf.from_iterable(AlwaysRaising(3)) | pf.batch(2) | pf.ignore_errors()
    it = iter(loader)
    assert next(it) == [2, 1]
    with pytest.raises(pf.StageStuckError, match="raised 1000 times in a row") as info:
        next(it)
    assert isinstance(info.value.__cause__, ConnectionError)
    assert loader.stats().stages[-1].ignored_errors == 1000
