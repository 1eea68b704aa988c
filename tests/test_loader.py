"""engine/loader.py: the Loader — its epoch, laziness, length, pickling, and closing what its stages
started."""

from __future__ import annotations

import pickle

import pytest

import pipeflow as pf


def test_plain_passes_advance_the_epoch() -> None:
    loader = pf.indices(50) | pf.shuffle(seed=3)
    assert loader.epoch == 0
    e0 = list(loader)
    assert loader.epoch == 0
    e1 = list(loader)
    assert loader.epoch == 1
    assert e0 != e1
    loader.set_epoch(0)
    assert list(loader) == e0
    loader.set_epoch(1)
    assert list(loader) == e1


# -- laziness ---------------------------------------------------------------------------------
class CountingDataset:
    def __init__(self, n: int) -> None:
        self.n = n
        self.calls = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.n:
            raise IndexError(i)
        self.calls += 1
        return i * 10


def test_building_pulls_nothing_from_the_source() -> None:
    pulled = []

    class Source:
        def __iter__(self):
            for i in range(10):
                pulled.append(i)
                yield i

    ds = CountingDataset(10)
    loader = (
        pf.from_iterable(Source())
        | pf.shuffle(seed=0, buffer_size=4)
        | pf.batch(2)
        | pf.fetch(ds)
        | pf.collate(list)
    )
    len_error = pytest.raises(TypeError)
    with len_error:
        len(loader)
    assert pulled == []
    assert ds.calls == 0
    it = iter(loader)
    assert pulled == []  # iter() builds the chain; only next() pulls
    assert ds.calls == 0
    next(it)
    assert ds.calls == 2
    it.close()


def test_iter_pulls_lazily_item_by_item() -> None:
    ds = CountingDataset(100)
    it = iter(pf.indices(100) | pf.batch(10) | pf.fetch(ds))
    assert next(it) == [i * 10 for i in range(10)]
    assert ds.calls == 10


# -- length -----------------------------------------------------------------------------------


def test_len_raises_type_error_naming_the_stage() -> None:
    with pytest.raises(TypeError, match="'filter'"):
        len(pf.indices(5) | pf.filter(bool))
    with pytest.raises(TypeError, match="source"):
        len(pf.from_iterable(x for x in range(3)))


# -- pickling ---------------------------------------------------------------------------------


def test_loaders_pickle_and_keep_working() -> None:
    loader = pf.indices(7) | pf.shuffle(seed=2) | pf.batch(3) | pf.map(len)
    clone = pickle.loads(pickle.dumps(loader))
    assert list(clone) == list(loader)
    assert (
        repr(clone)
        == repr(loader)
        == (
            "indices(7)\n| shuffle(seed=2)\n| batch(size=3, drop_last=False)\n| map(fn=len)\n"
            "# computed as one source: indices → shuffle → batch"
        )
    )


# -- resources ------------------------------------------------------------------------------
def test_context_manager_closes_running_passes() -> None:
    closed = []

    @pf.stage
    def holds(items):
        try:
            yield from items
        finally:
            closed.append(True)

    with pf.indices(10) | holds() as loader:
        it = iter(loader)
        next(it)
    assert closed == [True]
    with pytest.raises(StopIteration):
        next(it)


def test_early_break_closes_every_stage() -> None:
    closed = []

    @pf.stage
    def holds(items, *, tag):
        try:
            yield from items
        finally:
            closed.append(tag)

    loader = pf.indices(10) | holds(tag="a") | holds(tag="b")
    for _ in loader:
        break
    assert sorted(closed) == ["a", "b"]
