"""stages/batch.py: batch and unbatch — sizes, order, lengths, laziness, batches cut from positions."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import pipeflow as pf
from tests.strategies import batch_sizes, epochs, lengths, seeds


# -- exactly once, order, length --------------------------------------------------------------
def batches_of(n: int, size: int, drop_last: bool) -> list[list[int]]:
    out = [list(range(i, min(i + size, n))) for i in range(0, n, size)]
    if drop_last and out and len(out[-1]) < size:
        out.pop()
    return out


@given(n=lengths, size=batch_sizes, drop_last=st.booleans(), seed=seeds, epoch=epochs)
@example(n=0, size=1, drop_last=False, seed=0, epoch=0)
@example(n=1, size=1, drop_last=True, seed=0, epoch=0)
@example(n=5, size=10, drop_last=False, seed=0, epoch=0)
@example(n=5, size=10, drop_last=True, seed=0, epoch=0)
@example(n=12, size=4, drop_last=True, seed=0, epoch=0)
def test_every_index_exactly_once_per_epoch(
    n: int, size: int, drop_last: bool, seed: int, epoch: int
) -> None:
    loader = pf.indices(n) | pf.shuffle(seed=seed) | pf.batch(size, drop_last=drop_last)
    loader.set_epoch(epoch)
    got = list(loader)
    flat = [i for b in got for i in b]
    assert len(flat) == len(set(flat))
    if drop_last:
        assert len(flat) == n - n % size
        assert set(flat) <= set(range(n))
    else:
        assert sorted(flat) == list(range(n))
    assert all(len(b) == size for b in got[:-1])
    assert len(loader) == len(got)


@given(n=lengths, size=batch_sizes, drop_last=st.booleans())
def test_order_preserved_without_shuffle(n: int, size: int, drop_last: bool) -> None:
    loader = pf.indices(n) | pf.batch(size, drop_last=drop_last)
    assert list(loader) == batches_of(n, size, drop_last)
    assert len(loader) == len(batches_of(n, size, drop_last))


# -- batch / unbatch --------------------------------------------------------------------------
@given(items=st.lists(st.integers()), size=batch_sizes)
def test_batch_then_unbatch_is_identity(items: list[int], size: int) -> None:
    assert list(pf.from_iterable(items) | pf.batch(size) | pf.unbatch()) == items


@pytest.mark.parametrize("drop_last", [False, True])
def test_batch_reads_one_batch_per_next(drop_last: bool) -> None:
    pulled = []

    def source():
        for i in range(10):
            pulled.append(i)
            yield i

    it = iter(pf.from_iterable(source()) | pf.batch(3, drop_last=drop_last))
    assert next(it) == [0, 1, 2]
    assert pulled == [0, 1, 2]  # not a whole batch ahead
    assert next(it) == [3, 4, 5]
    assert pulled == [0, 1, 2, 3, 4, 5]
    it.close()


# -- batch over a known input: cut from positions or a permutation, nothing read --------------
def _known_and_read(n: int, size: int, drop_last: bool, seed: int | None) -> tuple[Any, Any]:
    """The same batches twice: computed (batch right after indices / a full shuffle) and read
    (a map in between hides what the input is)."""
    head = pf.indices(n) if seed is None else pf.indices(n) | pf.shuffle(seed=seed)
    known = head | pf.batch(size, drop_last=drop_last)
    read = head | pf.map(int) | pf.batch(size, drop_last=drop_last)
    return known, read


@given(
    n=st.integers(0, 20_000),
    size=batch_sizes,
    drop_last=st.booleans(),
    seed=st.none() | seeds,
    epoch=st.integers(0, 3),
)
@example(n=1024 + 4096 + 1, size=7, drop_last=False, seed=3, epoch=0)  # across the first blocks
@example(n=65536 * 2 + 5, size=64, drop_last=True, seed=None, epoch=0)
def test_batches_cut_from_a_known_input_are_the_batches_read(
    n: int, size: int, drop_last: bool, seed: int | None, epoch: int
) -> None:
    known, read = _known_and_read(n, size, drop_last, seed)
    known.set_epoch(epoch)
    read.set_epoch(epoch)
    assert list(known) == list(read)
    stages = known.stats().stages
    assert [s.items for s in stages][-1] == len(known)
    assert all(s.items == 0 for s in stages[:-1])  # computed: nothing passed above batch


@given(
    n=st.integers(1, 3000),
    size=batch_sizes,
    drop_last=st.booleans(),
    seed=st.none() | seeds,
    data=st.data(),
)
def test_batches_cut_from_a_known_input_resume_exactly(
    n: int, size: int, drop_last: bool, seed: int | None, data: st.DataObject
) -> None:
    known, _ = _known_and_read(n, size, drop_last, seed)
    total = len(known)
    k = data.draw(st.integers(0, total), label="batches before the state")
    it = iter(known)
    got = [next(it) for _ in range(k)]
    state = known.state_dict()
    resumed, _ = _known_and_read(n, size, drop_last, seed)
    resumed.load_state_dict(state)
    got.extend(resumed)
    _, fresh = _known_and_read(n, size, drop_last, seed)
    assert got == list(fresh)


def test_batches_of_a_billion_positions_start_at_once() -> None:
    it = iter(pf.indices(10**9) | pf.batch(64))
    assert next(it) == list(range(64))
    assert next(it) == list(range(64, 128))
