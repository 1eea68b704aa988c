"""pf.DataLoader inside the frameworks that rebuild loaders: Lightning and Accelerate.

Skipped when the framework is not installed (``pip install -e ".[compat]"`` installs both).
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.utils.data as tud

import pipeflow as pf


class Line(tud.Dataset):
    """y = 3x + 1, 64 samples."""

    def __len__(self) -> int:
        return 64

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.tensor([i / 64.0])
        return x, 3 * x + 1


def test_lightning_trains_on_a_pipeflow_loader() -> None:
    lp = pytest.importorskip("lightning.pytorch")

    class Model(lp.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(1, 1)
            self.seen = 0

        def training_step(self, batch, _):
            x, y = batch
            self.seen += len(x)
            return torch.nn.functional.mse_loss(self.layer(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    model = Model()
    loader = pf.DataLoader(Line(), batch_size=8, shuffle=True)
    trainer = lp.Trainer(
        max_epochs=2,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(model, train_dataloaders=loader)
    assert model.seen == 2 * 64


def test_lightning_injects_a_distributed_sampler_into_a_pipeflow_loader() -> None:
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.utilities.data import _update_dataloader

    original = pf.DataLoader(Line(), batch_size=8, shuffle=True)
    shards = []
    for rank in range(2):
        sampler = tud.DistributedSampler(Line(), num_replicas=2, rank=rank, seed=0)
        rebuilt = _update_dataloader(original, sampler)  # what Lightning does under DDP
        assert type(rebuilt) is pf.DataLoader
        shards.append([round(float(x) * 64) for xb, _ in rebuilt for x in xb])
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(64))


class Patchy(Line):
    """Line, with sample 5 unreadable."""

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        if i == 5:
            raise OSError("sample 5 is cut short")
        return super().__getitem__(i)


def test_lightning_keeps_ignore_errors_when_it_rebuilds_a_pipeflow_loader() -> None:
    """Skipping bad samples is an argument of the class (issue 27), so a framework that
    rebuilds the loader from its arguments keeps it."""
    pytest.importorskip("lightning.pytorch")
    from lightning.pytorch.utilities.data import _update_dataloader

    original = pf.DataLoader(Patchy(), batch_size=8, ignore_errors=True)
    sampler = tud.DistributedSampler(Patchy(), num_replicas=1, rank=0, shuffle=False)
    rebuilt = _update_dataloader(original, sampler)
    assert type(rebuilt) is pf.DataLoader and rebuilt.ignore_errors is True
    seen = sorted(round(float(x) * 64) for xb, _ in rebuilt for x in xb)
    assert seen == [i for i in range(64) if i != 5]


def test_accelerate_prepares_and_shards_a_pipeflow_loader() -> None:
    accelerate = pytest.importorskip("accelerate")
    from accelerate.data_loader import prepare_data_loader

    original = pf.DataLoader(Line(), batch_size=8, shuffle=False)
    shards = []
    for rank in range(2):
        prepared = prepare_data_loader(
            original, num_processes=2, process_index=rank, put_on_device=False
        )
        assert isinstance(prepared, tud.DataLoader)
        shards.append([round(float(x) * 64) for xb, _ in prepared for x in xb])
    assert not set(shards[0]) & set(shards[1])
    assert sorted(shards[0] + shards[1]) == list(range(64))

    acc = accelerate.Accelerator(cpu=True)
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt, loader = acc.prepare(model, opt, pf.DataLoader(Line(), batch_size=8))
    steps = 0
    for x, y in loader:
        loss = torch.nn.functional.mse_loss(model(x), y)
        acc.backward(loss)
        opt.step()
        opt.zero_grad()
        steps += 1
    assert steps == 8
