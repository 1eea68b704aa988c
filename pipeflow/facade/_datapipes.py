"""DataPipes under ``pipeflow.DataLoader``: split per worker, shuffled from one seed per epoch.

torch's ``DataLoader`` treats a ``torch.utils.data`` DataPipe (``IterDataPipe`` or
``MapDataPipe``) two ways that a plain dataset does not get:

* **sharding** — each worker calls ``graph_settings.apply_sharding`` on its copy of the pipe
  with its place among all workers (``num_workers * world_size`` of them, worker-major), so a
  ``sharding_filter`` lets each item through in one worker only; without workers the process
  shards by its rank;
* **one shuffle seed per epoch** (``IterDataPipe`` only) — at ``iter()`` the main process draws
  an ``int64`` from the loader's ``generator`` (before the workers' base seed), seeds every
  random pipe of the graph from it (``graph_settings.apply_random_seed``) and sends it to the
  workers, which do the same to their copies, also when they persist across epochs: so every
  worker shuffles alike, and ``torch.manual_seed(s)`` before an epoch reproduces it.

torch's DataPipe machinery is imported only here, and this module only when the facade's
dataset is a DataPipe.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.utils.data as tud

from pipeflow.facade._facade import _Stream

__all__ = [
    "DataPipeStream",
    "ShardInWorker",
    "is_datapipe",
    "shard_here",
    "shard_in_worker",
    "share_seed",
]


def is_datapipe(dataset: Any) -> bool:
    """Whether torch's DataLoader would shard *dataset* (an ``IterDataPipe``/``MapDataPipe``)."""
    return isinstance(dataset, (tud.IterDataPipe, tud.MapDataPipe))


def _world() -> tuple[int, int]:
    """``(world_size, rank)`` of the default process group, ``(1, 0)`` outside one."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size(), dist.get_rank()
    return 1, 0


def shard_here(dataset: Any) -> None:
    """Shard *dataset* for this process alone (no workers): by its rank, as torch does."""
    from torch.utils.data import graph_settings

    world_size, rank = _world()
    graph_settings.apply_sharding(dataset, world_size, rank)


def share_seed(dataset: Any, generator: torch.Generator | None, owner: Any) -> int | None:
    """Draw this epoch's shuffle seed for an ``IterDataPipe`` and seed its random pipes.

    Returns the seed (for the workers), or ``None`` when *dataset* takes none. The draw comes
    from *generator* (else torch's global generator), where torch's iterator makes it. In a
    ``torch.distributed`` job every rank then takes rank 0's seed, broadcast over a gloo
    group that *owner* (the DataLoader) keeps, so that the ranks shuffle alike and their
    shards add up to the whole pipe.
    """
    if not isinstance(dataset, tud.IterDataPipe):
        return None
    drawn = torch.empty((), dtype=torch.int64).random_(generator=generator)
    if dist.is_available() and dist.is_initialized():
        group = owner.__dict__.get("_pf_seed_group")
        if group is None:  # a collective: every rank makes it at the same iter()
            group = owner.__dict__["_pf_seed_group"] = dist.new_group(backend="gloo")
        dist.broadcast(drawn, src=0, group=group)
    seed = int(drawn.item())
    _seed_graph(dataset, seed)
    return seed


def _seed_graph(dataset: Any, seed: int) -> None:
    from torch.utils.data import graph_settings

    graph_settings.apply_random_seed(dataset, torch.Generator().manual_seed(seed))


class ShardInWorker:
    """A worker's first act: shard its copy of the DataPipe, then run the user's init.

    The copy is the one ``torch.utils.data.get_worker_info().dataset`` names in the worker.
    It shows as the user's function (or ``None``) so a saved state compares equal.
    """

    def __init__(self, init: Callable[[int], Any] | None, world_size: int, rank: int) -> None:
        self.init = init
        self.world_size = world_size
        self.rank = rank

    def __call__(self, worker_id: int) -> None:
        from torch.utils.data import graph_settings

        info = tud.get_worker_info()
        dataset: Any = None if info is None else info.dataset
        if info is None or not is_datapipe(dataset):  # pragma: no cover - a wiring bug
            msg = "pf.DataLoader: a DataPipe worker does not see its DataPipe"
            raise AssertionError(msg)
        graph_settings.apply_sharding(
            dataset,
            info.num_workers * self.world_size,
            worker_id * self.world_size + self.rank,
        )
        if self.init is not None:
            self.init(worker_id)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardInWorker) and (
            (self.init, self.world_size, self.rank) == (other.init, other.world_size, other.rank)
        )

    def __hash__(self) -> int:
        return hash((ShardInWorker, self.world_size, self.rank))

    def __repr__(self) -> str:
        return repr(self.init)


def shard_in_worker(init: Callable[[int], Any] | None) -> ShardInWorker:
    """*init* preceded by the sharding of the worker's DataPipe copy."""
    return ShardInWorker(init, *_world())


class DataPipeStream(_Stream):
    """An ``IterDataPipe`` as the workers' source: each pass tells them its shuffle seed.

    In the main process :meth:`pass_note` hands ``parallel_source`` the seed drawn for the pass
    starting; in a worker :meth:`begin_pass` gets it with the pass's first task and seeds the
    worker's copy of the pipe before iterating it.
    """

    def __init__(self, dataset: Any) -> None:
        super().__init__(dataset)
        self.seed: int | None = None

    def pass_note(self) -> int | None:
        """The seed of the pass being started (set by the facade just before)."""
        return self.seed

    def begin_pass(self, seed: int) -> None:
        """In a worker, before its pass: seed the random pipes as the main process did."""
        _seed_graph(self.iterable, seed)
