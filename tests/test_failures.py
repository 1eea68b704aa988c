"""A failed item does not end the epoch: it raises at its turn and the pass goes on (the
ignore_errors stage itself: test_ignore.py)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch.utils.data as tud
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests.flaky import BACKENDS, Flaky, _plain, batches_of, drain


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
    from pipeflow.engine._wrappers import _STUCK

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
