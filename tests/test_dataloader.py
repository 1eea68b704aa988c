"""``pipeflow.DataLoader`` against ``torch.utils.data.DataLoader``: the same batches, the same
validation."""

from __future__ import annotations

import warnings
from collections import namedtuple
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import example, given
from hypothesis import strategies as st

import pipeflow as pf

Point = namedtuple("Point", ["x", "label"])


def assert_same(a: Any, b: Any, path: str = "batch") -> None:
    """Same structure, same Python types, same tensor dtypes, shapes and values."""
    assert type(a) is type(b), f"{path}: {type(a)} != {type(b)}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype, f"{path}: {a.dtype} != {b.dtype}"
        assert a.shape == b.shape, f"{path}: {a.shape} != {b.shape}"
        assert torch.equal(a, b), f"{path}: values differ"
    elif isinstance(a, dict):
        assert list(a) == list(b), path
        for k in a:
            assert_same(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, np.ndarray):
        np.testing.assert_array_equal(a, b)
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def assert_same_epochs(ours: Any, ref: Any, epochs: int = 2) -> None:
    for _ in range(epochs):
        got, want = list(ours), list(ref)
        assert len(got) == len(want)
        for i, (a, b) in enumerate(zip(got, want)):
            assert_same(a, b, f"batch {i}")


# -- datasets -------------------------------------------------------------------------------
class ArrayDataset(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
        return self.x[i], int(i % 7)


class DictDataset(tud.Dataset):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "t": torch.full((2,), float(i)),
            "id": i,
            "name": f"s{i}",
            "p": Point(np.float64(i) / 2, True),
        }


class GetItemsDataset(ArrayDataset):
    def __getitems__(self, idx: list[int]) -> list[tuple[np.ndarray, int]]:
        return [(self.x[i], int(i % 7)) for i in idx]


class Stream(tud.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        for i in range(self.n):
            yield {"v": np.array([i, -i]), "i": i}


class SizedStream(Stream):
    def __len__(self) -> int:
        return self.n


def both(dataset: Any, seed: int | None = 0, **kwargs: Any) -> tuple[Any, Any]:
    """The same loader twice: pipeflow's and torch's, each with its own seeded generator."""
    if seed is None:
        return pf.DataLoader(dataset, **kwargs), tud.DataLoader(dataset, **kwargs)
    ours = pf.DataLoader(dataset, generator=torch.Generator().manual_seed(seed), **kwargs)
    ref = tud.DataLoader(dataset, generator=torch.Generator().manual_seed(seed), **kwargs)
    return ours, ref


CASES = {
    "default": dict(),
    "batch": dict(batch_size=4),
    "shuffle": dict(batch_size=4, shuffle=True),
    "shuffle_drop_last": dict(batch_size=4, shuffle=True, drop_last=True),
    "drop_last": dict(batch_size=5, drop_last=True),
    "big_batch": dict(batch_size=100),
    "no_autobatch": dict(batch_size=None),
    "no_autobatch_shuffle": dict(batch_size=None, shuffle=True),
    "custom_collate": dict(batch_size=3, collate_fn=lambda b: [len(b), b[0][1]]),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("make", [ArrayDataset, GetItemsDataset], ids=["getitem", "getitems"])
def test_same_batches_as_torch_map_style(case: str, make: Any) -> None:
    assert_same_epochs(*both(make(17), **CASES[case]), epochs=3)


@pytest.mark.parametrize("case", ["batch", "shuffle", "no_autobatch", "drop_last"])
def test_same_batches_as_torch_nested_samples(case: str) -> None:
    assert_same_epochs(*both(DictDataset(), **CASES[case]))


def test_same_batches_with_samplers() -> None:
    ds = ArrayDataset(20)
    for sampler_kind in ("subset", "weighted", "random_replacement"):

        def make_sampler(g: torch.Generator, kind: str = sampler_kind) -> tud.Sampler[int]:
            if kind == "subset":
                return tud.SubsetRandomSampler(list(range(0, 20, 2)), generator=g)
            if kind == "weighted":
                return tud.WeightedRandomSampler([1.0] * 20, 15, generator=g)
            return tud.RandomSampler(ds, replacement=True, num_samples=13, generator=g)

        ours = pf.DataLoader(
            ds, batch_size=4, sampler=make_sampler(torch.Generator().manual_seed(1))
        )
        ref = tud.DataLoader(
            ds, batch_size=4, sampler=make_sampler(torch.Generator().manual_seed(1))
        )
        assert_same_epochs(ours, ref, epochs=3)


def test_same_batches_with_batch_sampler() -> None:
    ds = ArrayDataset(20)

    def bs(seed: int) -> tud.BatchSampler:
        g = torch.Generator().manual_seed(seed)
        return tud.BatchSampler(tud.RandomSampler(ds, generator=g), 6, drop_last=False)

    assert_same_epochs(
        pf.DataLoader(ds, batch_sampler=bs(3)), tud.DataLoader(ds, batch_sampler=bs(3)), 3
    )
    # Any iterable of index lists is a batch sampler, tuples included.
    plain = [(0, 1), (5, 2, 3)]
    assert_same_epochs(
        pf.DataLoader(ds, batch_sampler=plain), tud.DataLoader(ds, batch_sampler=plain)
    )


def test_same_batches_without_a_generator_from_the_global_rng() -> None:
    ds = ArrayDataset(30)
    torch.manual_seed(123)
    ours = [b[1] for _ in range(2) for b in pf.DataLoader(ds, batch_size=8, shuffle=True)]
    after_ours = torch.rand(1)
    torch.manual_seed(123)
    ref = [b[1] for _ in range(2) for b in tud.DataLoader(ds, batch_size=8, shuffle=True)]
    after_ref = torch.rand(1)
    assert_same(ours, ref)
    assert torch.equal(after_ours, after_ref)  # the global RNG advanced the same way


@pytest.mark.parametrize(
    "kwargs",
    [dict(batch_size=4), dict(batch_size=4, drop_last=True), dict(batch_size=None), dict()],
    ids=["batch", "drop_last", "none", "default"],
)
def test_same_batches_as_torch_iterable_style(kwargs: dict[str, Any]) -> None:
    assert_same_epochs(*both(Stream(11), seed=None, **kwargs))
    ours, ref = both(SizedStream(11), seed=None, **kwargs)
    assert len(ours) == len(ref)
    assert_same_epochs(ours, ref)


def test_iterable_dataset_longer_than_its_len_warns_like_torch() -> None:
    class Liar(Stream):
        def __len__(self) -> int:
            return 3

    for make in (pf.DataLoader, tud.DataLoader):
        dl = make(Liar(5), batch_size=None)
        assert len(dl) == 3
        with pytest.warns(UserWarning, match="was reported to be 3"):
            list(dl)


@given(
    n=st.integers(0, 60),
    batch_size=st.one_of(st.none(), st.integers(1, 70)),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    seed=st.integers(0, 2**63 - 1),
)
@example(n=0, batch_size=1, shuffle=True, drop_last=False, seed=0)
@example(n=10, batch_size=10, shuffle=False, drop_last=True, seed=0)
def test_same_batches_property(
    n: int, batch_size: int | None, shuffle: bool, drop_last: bool, seed: int
) -> None:
    if batch_size is None:
        drop_last = False
    kwargs = dict(batch_size=batch_size, shuffle=shuffle, drop_last=drop_last)
    if n == 0 and shuffle:  # torch's RandomSampler refuses an empty dataset; so do we
        for make in (pf.DataLoader, tud.DataLoader):
            with pytest.raises(ValueError, match="num_samples should be a positive integer"):
                make(ArrayDataset(n), **kwargs)
        return
    assert_same_epochs(*both(ArrayDataset(n), seed=seed, **kwargs), epochs=2)


# -- validation: the same exception types for the same bad combinations ---------------------
BAD = {
    "negative_workers": dict(num_workers=-1),
    "negative_timeout": dict(timeout=-1),
    "prefetch_without_workers": dict(prefetch_factor=2),
    "persistent_without_workers": dict(persistent_workers=True),
    "sampler_and_shuffle": dict(sampler=[0, 1], shuffle=True),
    "batch_sampler_and_batch_size": dict(batch_sampler=[[0]], batch_size=2),
    "batch_sampler_and_shuffle": dict(batch_sampler=[[0]], shuffle=True),
    "batch_sampler_and_drop_last": dict(batch_sampler=[[0]], drop_last=True),
    "none_batch_and_drop_last": dict(batch_size=None, drop_last=True),
    "bad_batch_size": dict(batch_size=0),
    "bad_batch_size_type": dict(batch_size=2.5),
    "bad_drop_last": dict(drop_last="yes"),
    "mp_context_without_workers": dict(multiprocessing_context="spawn"),
}


@pytest.mark.parametrize("case", BAD)
def test_same_validation_errors_as_torch(case: str) -> None:
    kwargs = BAD[case]
    with pytest.raises(Exception) as want:
        tud.DataLoader(ArrayDataset(4), **kwargs)
    with pytest.raises(type(want.value)) as got:
        pf.DataLoader(ArrayDataset(4), **kwargs)
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize(
    "kwargs", [dict(shuffle=True), dict(sampler=[0]), dict(batch_sampler=[[0]])]
)
def test_iterable_dataset_rejects_samplers_like_torch(kwargs: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="IterableDataset") as want:
        tud.DataLoader(Stream(3), **kwargs)
    with pytest.raises(ValueError) as got:
        pf.DataLoader(Stream(3), **kwargs)
    assert str(got.value) == str(want.value)


def test_timeout_without_workers_fails_at_iter_like_torch() -> None:
    for make in (pf.DataLoader, tud.DataLoader):
        dl = make(ArrayDataset(4), timeout=1)
        with pytest.raises(AssertionError):
            iter(dl)


def test_pin_memory_without_accelerator_warns_and_passes_data_through() -> None:
    if torch.accelerator.is_available():
        pytest.skip("an accelerator is present")
    ours, ref = both(ArrayDataset(9), batch_size=4, pin_memory=True)
    with pytest.warns(UserWarning, match="no accelerator is found"):
        got = list(ours)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        want = list(ref)
    assert_same(got, want)


# -- running on pipeflow ----------------------------------------------------------------------
def test_iteration_runs_on_pipeflow_stages() -> None:
    dl = pf.DataLoader(ArrayDataset(10), batch_size=4, shuffle=True)
    loader = dl.pipeline()
    assert isinstance(loader, pf.Loader)
    assert [s.name for s in loader.stages] == ["batch", "fetch", "collate"]
    it = iter(dl)
    assert not isinstance(it, tud.dataloader._BaseDataLoaderIter)
    next(it)


def test_fetch_errors_name_the_sample_index() -> None:
    class Broken(ArrayDataset):
        def __getitem__(self, i: int) -> tuple[np.ndarray, int]:
            if i == 5:
                raise ValueError("corrupt sample")
            return super().__getitem__(i)

    with pytest.raises(ValueError, match="corrupt sample") as info:
        list(pf.DataLoader(Broken(10), batch_size=4))
    assert "sample index 5 (batch [4, 5, 6, 7], epoch 0)" in info.value.__notes__[0]


# -- skipping bad samples without leaving the class (issue 27) ------------------------------
class Flaky(tud.Dataset):
    """Sample i is i, except the *bad* ones, whose read raises OSError (a truncated file)."""

    def __init__(self, n: int, bad: frozenset[int] = frozenset({2, 9})) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i in self.bad:
            raise OSError(f"sample {i} is cut short")
        return i


def _torch_batches_without(dataset: Flaky, **kwargs: Any) -> list[list[int]]:
    """torch's batches of indices for *kwargs*, less the bad samples (batches left empty go)."""
    ref = tud.DataLoader(range(len(dataset)), collate_fn=list, **kwargs)
    kept = [[i for i in b if i not in dataset.bad] for b in ref]
    return [b for b in kept if b]


@pytest.mark.parametrize("workers", [0, 2])
def test_ignore_errors_skips_bad_samples_and_stays_a_dataloader(workers: int) -> None:
    ds = Flaky(20)
    dl = pf.DataLoader(ds, batch_size=4, num_workers=workers, ignore_errors=True)
    assert isinstance(dl, tud.DataLoader) and dl.ignore_errors is True
    assert [b.tolist() for b in dl] == _torch_batches_without(ds, batch_size=4)
    skipped = dl.stats().stages[-1]
    assert (skipped.name, skipped.ignored_errors, skipped.ignored_indices) == (
        "ignore_errors",
        2,
        [2, 9],
    )


@given(
    n=st.integers(1, 40),  # (torch's RandomSampler refuses an empty dataset)
    bad=st.frozensets(st.integers(0, 39), max_size=10),
    batch_size=st.integers(1, 7),
    seed=st.integers(0, 2**32 - 1),
    drop_last=st.booleans(),
)
def test_ignore_errors_drops_exactly_the_bad_samples(n, bad, batch_size, seed, drop_last) -> None:
    """The invariant: every good sample once, in torch's order and batches; each bad one
    dropped and counted; nothing else lost."""
    ds = Flaky(n, frozenset(i for i in bad if i < n))
    dl = pf.DataLoader(
        ds,
        batch_size=batch_size,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(seed),
        ignore_errors=True,
    )
    got = [b.tolist() for b in dl]
    want = _torch_batches_without(
        ds,
        batch_size=batch_size,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(seed),
    )
    assert got == want
    order = tud.DataLoader(
        range(n),
        batch_size=batch_size,
        shuffle=True,
        drop_last=drop_last,
        generator=torch.Generator().manual_seed(seed),
        collate_fn=list,
    )
    read = [i for b in order for i in b]  # the samples the epoch reads
    # (a batch whose every sample failed is one dropped item, naming them all)
    assert sorted(dl.stats().stages[-1].ignored_indices) == sorted(ds.bad.intersection(read))
    assert sorted(i for b in got for i in b) == sorted(set(read) - ds.bad)


def test_ignore_errors_with_a_budget_and_exception_types() -> None:
    only_value_errors = pf.ignore_errors(exceptions=ValueError)
    with pytest.raises(OSError, match="sample 2 is cut short"):
        list(pf.DataLoader(Flaky(20), batch_size=4, ignore_errors=only_value_errors))
    budget = pf.ignore_errors(exceptions=OSError, max_count=1)
    with pytest.raises(pf.ErrorBudgetExceeded, match=r"2 items failed this epoch"):
        list(pf.DataLoader(Flaky(20), batch_size=4, ignore_errors=budget))


def test_without_ignore_errors_the_pipeline_and_the_errors_are_torchs() -> None:
    dl = pf.DataLoader(Flaky(20), batch_size=4)
    assert dl.ignore_errors is False
    assert [s.name for s in dl.pipeline().stages] == ["batch", "fetch", "collate"]
    with pytest.raises(OSError, match="sample 2 is cut short"):
        list(dl)
    dl.ignore_errors = True  # an attribute, as torch's are: the next pass follows it
    assert len(list(dl)) == 5 and dl.pipeline().stages[-1].name == "ignore_errors"


def test_ignore_errors_refuses_other_values_naming_the_parameter() -> None:
    with pytest.raises(
        TypeError,
        match=r"DataLoader: ignore_errors must be True, False or pf\.ignore_errors\(\.\.\.\) \(got 'yes'\)",
    ):
        pf.DataLoader(Flaky(4), ignore_errors="yes")
