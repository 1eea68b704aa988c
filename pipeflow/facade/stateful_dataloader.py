"""``pipeflow.StatefulDataLoader``: torchdata's ``StatefulDataLoader``, on pipeflow.

The same constructor as torchdata's (torch's, plus ``snapshot_every_n_steps``) and the same
``state_dict()`` / ``load_state_dict()`` behaviour, so a user of torchdata switches with one
import. It is :class:`pipeflow.DataLoader` (a ``torch.utils.data.DataLoader``), whose states
are exact at every step anyway; ``snapshot_every_n_steps`` says how often the workers of an
``IterableDataset`` ask their replica for its objects' states (every step by default; between
two, a resumed worker reads the items after the last one again).

This module imports torch; ``import pipeflow`` loads it on first access to
``pipeflow.StatefulDataLoader``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, TypeVar

import torch
import torch.utils.data as tud

from pipeflow import _checks
from pipeflow._hints import checked_keywords
from pipeflow.engine._stage import Stage
from pipeflow.facade.dataloader import DataLoader

__all__ = ["StatefulDataLoader"]

T_co = TypeVar("T_co", covariant=True)


class StatefulDataLoader(DataLoader[T_co]):
    """torchdata's ``StatefulDataLoader``: :class:`pipeflow.DataLoader` with its constructor.

    Args:
        snapshot_every_n_steps: how often (in items each worker of an ``IterableDataset``
            makes) the worker asks its replica for the states of its stateful objects; ``0``
            or ``None``: at the end of its stream only. The state stays exact: a resumed
            worker reads again what came after the last one. Map-style datasets' workers
            report their dataset's state with every batch whatever this says (a map's
            items can't be read again in a worker), as torchdata's do at its default, 1.
            Every other argument is torch's ``DataLoader``'s, and ``ignore_errors``
            :class:`pipeflow.DataLoader`'s.

    Examples:
        >>> import torch, pipeflow as pf
        >>> dl = pf.StatefulDataLoader(torch.arange(10), batch_size=4)
        >>> it = iter(dl)
        >>> next(it).tolist()
        [0, 1, 2, 3]
        >>> state = dl.state_dict()
        >>> again = pf.StatefulDataLoader(torch.arange(10), batch_size=4)
        >>> again.load_state_dict(state)
        >>> [b.tolist() for b in again]
        [[4, 5, 6, 7], [8, 9]]
    """

    @checked_keywords
    def __init__(
        self,
        dataset: tud.Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: tud.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: tud.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        snapshot_every_n_steps: int | None = 1,
        ignore_errors: bool | Stage[Any, Any] = False,
    ) -> None:
        every = _checks.optional_integer(
            "StatefulDataLoader", "snapshot_every_n_steps", snapshot_every_n_steps, low=0
        )
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            in_order=in_order,
            ignore_errors=ignore_errors,
        )
        self.snapshot_every_n_steps = every or 0
