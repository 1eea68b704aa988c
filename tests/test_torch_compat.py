"""``pf.DataLoader`` is a ``torch.utils.data.DataLoader`` in the eyes of the ecosystem.

These tests do what Lightning, Accelerate and training scripts do with a loader: check its
type, read its attributes, and rebuild it from them with a ``DistributedSampler`` injected.
"""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud

import pipeflow as pf

PUBLIC_ATTRIBUTES = [
    "dataset",
    "batch_size",
    "drop_last",
    "sampler",
    "batch_sampler",
    "num_workers",
    "collate_fn",
    "pin_memory",
    "timeout",
    "worker_init_fn",
    "multiprocessing_context",
    "generator",
    "prefetch_factor",
    "persistent_workers",
    "in_order",
    "pin_memory_device",
]
FROZEN = ["batch_size", "batch_sampler", "sampler", "drop_last", "dataset", "persistent_workers"]


class Squares(tud.Dataset):
    def __init__(self, n: int = 40) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        return torch.tensor([float(i)]), i * i


def test_isinstance_and_generic_alias() -> None:
    dl = pf.DataLoader(Squares(), batch_size=4)
    assert isinstance(dl, tud.DataLoader)
    assert issubclass(pf.DataLoader, tud.DataLoader)
    alias = pf.DataLoader[int]
    assert alias.__origin__ is pf.DataLoader
    assert isinstance(alias(Squares(), batch_size=2), tud.DataLoader)


def test_same_signature_as_torch() -> None:
    """torch's parameters, in torch's order, kinds and defaults; then pipeflow's own, each
    keyword-only and off by default (issue 27: `ignore_errors`)."""
    ours = inspect.signature(pf.DataLoader.__init__)
    ref = inspect.signature(tud.DataLoader.__init__)
    assert list(ours.parameters)[: len(ref.parameters)] == list(ref.parameters)
    for name, p in ref.parameters.items():
        q = ours.parameters[name]
        assert (q.kind, q.default) == (p.kind, p.default), name
    extra = list(ours.parameters.values())[len(ref.parameters) :]
    assert [(p.name, p.kind, p.default) for p in extra] == [
        ("ignore_errors", inspect.Parameter.KEYWORD_ONLY, False)
    ]


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(batch_size=4, shuffle=True),
        dict(batch_size=None),
        dict(batch_sampler=[[0, 1], [2]]),
        dict(batch_size=3, drop_last=True, sampler=[3, 2, 1, 0], collate_fn=list),
    ],
    ids=["shuffle", "no_batch", "batch_sampler", "sampler"],
)
def test_public_attributes_match_torch(kwargs: dict[str, Any]) -> None:
    g1, g2 = torch.Generator().manual_seed(0), torch.Generator().manual_seed(0)
    ours = pf.DataLoader(Squares(), generator=g1, **kwargs)
    ref = tud.DataLoader(Squares(), generator=g2, **kwargs)
    for name in PUBLIC_ATTRIBUTES:
        a, b = getattr(ours, name), getattr(ref, name)
        if name in ("sampler", "batch_sampler"):
            assert type(a) is type(b), name
        elif name == "generator":
            assert a is g1
        elif name == "dataset":
            assert type(a) is type(b)
        else:
            assert a == b, f"{name}: {a!r} != {b!r}"
    assert len(ours) == len(ref)
    assert ours._auto_collation == ref._auto_collation
    assert ours._index_sampler.__class__ is ref._index_sampler.__class__


@pytest.mark.parametrize("name", FROZEN)
def test_frozen_attributes_raise_like_torch(name: str) -> None:
    ours = pf.DataLoader(Squares(), batch_size=2)
    ref = tud.DataLoader(Squares(), batch_size=2)
    with pytest.raises(ValueError) as want:
        setattr(ref, name, getattr(ref, name))
    with pytest.raises(ValueError) as got:
        setattr(ours, name, getattr(ours, name))
    assert str(got.value) == str(want.value).replace("DataLoader", "DataLoader")


def test_unfrozen_attributes_can_change_and_iteration_follows() -> None:
    dl = pf.DataLoader(Squares(8), batch_size=4)
    dl.collate_fn = lambda batch: [label for _, label in batch]
    assert list(dl) == [[0, 1, 4, 9], [16, 25, 36, 49]]


def rebuild_with_sampler(loader: tud.DataLoader, sampler: tud.Sampler[int]) -> tud.DataLoader:
    """What Lightning's `_update_dataloader` does: read the constructor's arguments off the
    instance, swap in a new sampler, and call the loader's own class again."""
    params = inspect.signature(type(loader).__init__).parameters
    kwargs = {
        name: getattr(loader, name)
        for name in params
        if name not in ("self", "sampler", "batch_sampler", "shuffle") and hasattr(loader, name)
    }
    if loader.batch_sampler is not None and not isinstance(loader.batch_sampler, tud.BatchSampler):
        pytest.fail("custom batch samplers are rebuilt differently")
    kwargs["sampler"] = sampler
    return type(loader)(**kwargs)


@pytest.mark.parametrize("world_size", [2, 3])
def test_rebuilding_with_a_distributed_sampler_shards_the_data(world_size: int) -> None:
    ds = Squares(40)
    original = pf.DataLoader(ds, batch_size=4, shuffle=True, drop_last=False)
    seen: list[list[int]] = []
    for rank in range(world_size):
        sampler = tud.DistributedSampler(ds, num_replicas=world_size, rank=rank, seed=7)
        sampler.set_epoch(1)
        rebuilt = rebuild_with_sampler(original, sampler)
        assert type(rebuilt) is pf.DataLoader
        assert isinstance(rebuilt.sampler, tud.DistributedSampler)
        labels = [int(np.sqrt(v)) for _, batch in rebuilt for v in batch.tolist()]
        # the same indices, in the same order, as the sampler itself gives
        assert labels == list(sampler)
        seen.append(labels)
    flat = [i for shard in seen for i in shard]
    per_rank = -(-40 // world_size)
    assert all(len(s) == per_rank for s in seen)
    assert set(flat) == set(range(40))
    assert len(flat) == per_rank * world_size  # DistributedSampler pads by repeating


def test_rebuilt_loader_matches_torch_rebuilt_loader() -> None:
    ds = Squares(30)
    ours = rebuild_with_sampler(
        pf.DataLoader(ds, batch_size=5), tud.DistributedSampler(ds, num_replicas=2, rank=1)
    )
    ref = rebuild_with_sampler(
        tud.DataLoader(ds, batch_size=5), tud.DistributedSampler(ds, num_replicas=2, rank=1)
    )
    for a, b in zip(ours, ref, strict=True):
        assert torch.equal(a[0], b[0])
        assert torch.equal(a[1], b[1])


def test_accelerate_style_attribute_reads() -> None:
    # Accelerate reads these to decide how to wrap and shard a loader.
    dl = pf.DataLoader(Squares(), batch_size=4, shuffle=True)
    assert isinstance(dl.batch_sampler, tud.BatchSampler)
    assert isinstance(dl.batch_sampler.sampler, tud.RandomSampler)
    assert dl.batch_sampler.batch_size == 4
    assert dl._dataset_kind == tud.dataloader._DatasetKind.Map
