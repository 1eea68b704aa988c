"""sources/_basic.py: indices, from_sampler and from_iterable — what they accept, epochs, one-shot input."""

from __future__ import annotations

import pytest

import pipeflow as pf


def test_indices_accepts_sized_and_rejects_bad_input() -> None:
    assert list(pf.indices(range(3))) == [0, 1, 2]
    with pytest.raises(ValueError, match=r"n_or_sized must be at least 0 \(got -2\)"):
        pf.indices(-2)
    with pytest.raises(TypeError):
        pf.indices(True)
    with pytest.raises(TypeError):
        pf.indices(2.5)
    with pytest.raises(TypeError):
        pf.indices(x for x in range(3))


def test_from_sampler_calls_set_epoch_and_is_reiterable() -> None:
    class Sampler:
        def __init__(self) -> None:
            self.epochs: list[int] = []

        def set_epoch(self, e: int) -> None:
            self.epochs.append(e)

        def __iter__(self):
            return iter([2, 0, 1])

        def __len__(self) -> int:
            return 3

    s = Sampler()
    loader = pf.from_sampler(s) | pf.batch(2)
    assert len(loader) == 2
    assert list(loader) == [[2, 0], [1]]
    loader.set_epoch(7)
    assert list(loader) == [[2, 0], [1]]
    assert s.epochs == [0, 7]
    quiet = pf.from_sampler(s, set_epoch=False)
    list(quiet)
    assert s.epochs == [0, 7]


def test_from_sampler_rejects_iterators_and_non_iterables() -> None:
    with pytest.raises(TypeError, match="one-shot iterator"):
        pf.from_sampler(iter([1, 2]))
    with pytest.raises(TypeError, match="must be iterable"):
        pf.from_sampler(3)


def test_from_sampler_works_with_torch_samplers() -> None:
    torch = pytest.importorskip("torch")
    from torch.utils.data import BatchSampler, RandomSampler

    g = torch.Generator().manual_seed(0)
    ref_g = torch.Generator().manual_seed(0)
    ours = pf.from_sampler(BatchSampler(RandomSampler(range(10), generator=g), 3, False))
    ref = BatchSampler(RandomSampler(range(10), generator=ref_g), 3, False)
    assert list(ours) == list(ref)
    assert list(ours) == list(ref)
    assert len(ours) == len(ref) == 4


def test_one_shot_iterator_raises_on_second_pass() -> None:
    loader = pf.from_iterable(iter([1, 2, 3])) | pf.map(abs)
    assert list(loader) == [1, 2, 3]
    with pytest.raises(RuntimeError, match="one-shot iterator"):
        list(loader)


def test_from_iterable_reiterable_gives_every_epoch() -> None:
    loader = pf.from_iterable([1, 2, 3])
    assert list(loader) == list(loader) == [1, 2, 3]
    assert len(loader) == 3
