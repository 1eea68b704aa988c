"""``pf.DataLoader(num_workers>0)``: torch's semantics, on pipeflow's parallel stages."""

from __future__ import annotations

import random
from collections import Counter
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import pipeflow as pf
from tests.test_dataloader import ArrayDataset, assert_same, assert_same_epochs


class RandomAugment(tud.Dataset):
    """Draws from every global generator inside the worker: equal only if seeded like torch."""

    def __len__(self) -> int:
        return 24

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {
            "i": i,
            "torch": torch.rand(2),
            "numpy": np.random.rand(2),
            "random": random.random(),
        }


class WorkerSharded(tud.IterableDataset):
    """Splits itself with torch's get_worker_info, as torch's docs teach."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        for i in range(start, self.n, step):
            yield {"i": i, "x": torch.tensor([i, i * 2])}


class Uneven(tud.IterableDataset):
    """Workers with very different amounts of data: worker 0 has 2 items, worker 1 has 9."""

    def __iter__(self):
        info = tud.get_worker_info()
        wid = 0 if info is None else info.id
        yield from ((wid, k) for k in range(2 if wid == 0 else 9))


def both(dataset: Any, **kwargs: Any) -> tuple[Any, Any]:
    ours = pf.DataLoader(dataset, generator=torch.Generator().manual_seed(3), **kwargs)
    ref = tud.DataLoader(dataset, generator=torch.Generator().manual_seed(3), **kwargs)
    return ours, ref


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_same_batches_as_torch_map_style(workers: int) -> None:
    assert_same_epochs(*both(ArrayDataset(37), batch_size=4, shuffle=True, num_workers=workers))


def test_same_batches_as_torch_with_global_rngs_in_workers() -> None:
    ours, ref = both(RandomAugment(), batch_size=4, shuffle=True, num_workers=2)
    assert_same_epochs(ours, ref, epochs=2)


@pytest.mark.parametrize(
    "kwargs", [dict(batch_size=3), dict(batch_size=None), dict(batch_size=4, drop_last=True)]
)
def test_same_batches_as_torch_iterable_style(kwargs: dict[str, Any]) -> None:
    assert_same_epochs(*both(WorkerSharded(17), num_workers=2, **kwargs))


def test_uneven_iterable_workers_interleave_like_torch() -> None:
    assert_same_epochs(*both(Uneven(), batch_size=None, num_workers=2))


def test_unordered_is_the_same_multiset() -> None:
    ours = pf.DataLoader(ArrayDataset(30), batch_size=4, num_workers=2, in_order=False)
    got = Counter(tuple(b[1].tolist()) for b in ours)
    want = Counter(tuple(b[1].tolist()) for b in tud.DataLoader(ArrayDataset(30), batch_size=4))
    assert got == want


def test_persistent_workers_across_epochs() -> None:
    ours, ref = both(
        RandomAugment(), batch_size=4, shuffle=True, num_workers=2, persistent_workers=True
    )
    assert_same_epochs(ours, ref, epochs=3)


def report_worker(_: int) -> None:
    info = tud.get_worker_info()  # answers in torch's workers and in ours
    assert info is not None
    assert isinstance(info.dataset, WhoAmI)
    pinfo = pf.get_worker_info()  # answers in ours
    if pinfo is not None:
        assert (info.id, info.num_workers, info.seed) == (pinfo.id, pinfo.num_workers, pinfo.seed)


class WhoAmI(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = tud.get_worker_info()
        return i, info.id, info.seed


def test_worker_info_and_seeds_match_torch() -> None:
    ours, ref = both(WhoAmI(), batch_size=2, num_workers=2, worker_init_fn=report_worker)
    assert_same_epochs(ours, ref)


@pytest.mark.slow
def test_spawn_context_works() -> None:
    ours, ref = both(ArrayDataset(10), batch_size=3, num_workers=2, multiprocessing_context="spawn")
    assert_same_epochs(ours, ref, epochs=1)


class Slow(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 2:
            import time

            time.sleep(30)
        return i


def test_timeout_raises_naming_the_indices() -> None:
    dl = pf.DataLoader(Slow(), batch_size=1, num_workers=2, timeout=0.5)
    with pytest.raises(TimeoutError, match=r"sample indices \[2\]"):
        list(dl)


def test_worker_error_names_index_worker_and_pid() -> None:
    class Bad(ArrayDataset):
        def __getitem__(self, i: int) -> Any:
            if i == 9:
                raise ZeroDivisionError("bad sample")
            return super().__getitem__(i)

    with pytest.raises(ZeroDivisionError, match="bad sample") as info:
        list(pf.DataLoader(Bad(12), batch_size=4, num_workers=2))
    note = info.value.__notes__[0]
    assert (
        "stage 'fetch' failed on sample index 9 (batch [8, 9, 10, 11], epoch 0, worker 0 of 2, pid"
        in note
    )


def test_len_and_attributes_with_workers() -> None:
    ours, ref = both(ArrayDataset(10), batch_size=3, num_workers=2)
    assert len(ours) == len(ref) == 4
    assert ours.prefetch_factor == ref.prefetch_factor == 2
    assert_same(next(iter(ours)), next(iter(ref)))


def test_two_threads_may_share_one_iterator_as_torchs() -> None:
    # torch's iterator, shared so, delivered all 100 in 2 of 6 runs here and hung in the others;
    # pipeflow's runs one next() at a time: every batch once between the threads, no hang.
    import threading

    it = iter(pf.DataLoader(list(range(100)), batch_size=None, num_workers=2))
    got: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def read(k: int) -> None:
        try:
            got[k].extend(int(x) for x in it)
        except BaseException as e:  # the test fails below, naming it
            errors.append(e)

    threads = [threading.Thread(target=read, args=(k,)) for k in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a reader hung"
    assert errors == []
    assert sorted(got[0] + got[1]) == list(range(100))
