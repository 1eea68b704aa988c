"""pipeflow: data loading for PyTorch, built from plain generator stages.

Stages are generator functions bound to their configuration and chained with ``|``::

    import pipeflow as pf

    loader = pf.indices(len(ds)) | pf.shuffle(seed=0) | pf.batch(32) | pf.fetch(ds) | pf.collate()

``import pipeflow`` does not import torch: the stages that need it import it when they run, and
``pipeflow.DataLoader`` (a ``torch.utils.data.DataLoader`` subclass) is resolved on first
access. Worker processes started with spawn or forkserver so pay for torch only when the user's
code needs it.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeflow.engine._context import Context
    from pipeflow.engine._decorate import stage
    from pipeflow.engine._stage import Source, Stage, Traits
    from pipeflow.engine.loader import Loader
    from pipeflow.errors import (
        PipeflowError,
        StageStuckError,
        WorkerDiedError,
        WorkerError,
        WorkerTimeoutError,
    )
    from pipeflow.facade.dataloader import DataLoader
    from pipeflow.facade.stateful_dataloader import StatefulDataLoader
    from pipeflow.parallel import parallel_map, parallel_source
    from pipeflow.parallel.pools._warm import set_warm_start
    from pipeflow.resume._objects import Stateful
    from pipeflow.shared import SharedList, shared_list
    from pipeflow.sources._basic import from_iterable, from_sampler, indices
    from pipeflow.sources.mix import mix
    from pipeflow.sources.readers import ShardReadError, read_jsonl, read_parquet, read_tar
    from pipeflow.sources.shards import Shard, shards
    from pipeflow.stages.batch import batch, unbatch
    from pipeflow.stages.bucket import bucket
    from pipeflow.stages.cache import cache
    from pipeflow.stages.collate import collate, default_collate, default_convert
    from pipeflow.stages.device import pin_memory, to_device
    from pipeflow.stages.distributed import shard
    from pipeflow.stages.fetch import fetch
    from pipeflow.stages.ignore import ErrorBudgetExceeded, ignore_errors
    from pipeflow.stages.pack import pack
    from pipeflow.stages.pad import Padded
    from pipeflow.stages.progress import progress
    from pipeflow.stages.shuffle import shuffle
    from pipeflow.stages.transforms import filter, map, random_map
    from pipeflow.stats import StageStats, Stats
    from pipeflow.worker_info import WorkerInfo, get_worker_info

__version__ = "0.1.0"

__all__ = [
    "Context",
    "DataLoader",
    "ErrorBudgetExceeded",
    "Loader",
    "Padded",
    "PipeflowError",
    "Shard",
    "ShardReadError",
    "SharedList",
    "Source",
    "Stage",
    "StageStats",
    "StageStuckError",
    "Stateful",
    "StatefulDataLoader",
    "Stats",
    "Traits",
    "WorkerDiedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerTimeoutError",
    "batch",
    "bucket",
    "cache",
    "collate",
    "default_collate",
    "default_convert",
    "fetch",
    "filter",
    "from_iterable",
    "from_sampler",
    "get_worker_info",
    "ignore_errors",
    "indices",
    "map",
    "mix",
    "pack",
    "parallel_map",
    "parallel_source",
    "pin_memory",
    "progress",
    "random_map",
    "read_jsonl",
    "read_parquet",
    "read_tar",
    "set_warm_start",
    "shard",
    "shards",
    "shared_list",
    "shuffle",
    "stage",
    "to_device",
    "unbatch",
]


#: Where each public name is defined. A name's module is imported when the name is first
#: used, so a process that needs a few stages (a spawn worker) imports only their modules.
_WHERE = {
    "Context": "pipeflow.engine._context",
    "DataLoader": "pipeflow.facade.dataloader",
    "ErrorBudgetExceeded": "pipeflow.stages.ignore",
    "Loader": "pipeflow.engine.loader",
    "Padded": "pipeflow.stages.pad",
    "PipeflowError": "pipeflow.errors",
    "Shard": "pipeflow.sources.shards",
    "ShardReadError": "pipeflow.sources.readers",
    "SharedList": "pipeflow.shared",
    "Source": "pipeflow.engine._stage",
    "Stage": "pipeflow.engine._stage",
    "StageStats": "pipeflow.stats",
    "StageStuckError": "pipeflow.errors",
    "Stateful": "pipeflow.resume._objects",
    "StatefulDataLoader": "pipeflow.facade.stateful_dataloader",
    "Stats": "pipeflow.stats",
    "Traits": "pipeflow.engine._stage",
    "WorkerDiedError": "pipeflow.errors",
    "WorkerError": "pipeflow.errors",
    "WorkerInfo": "pipeflow.worker_info",
    "WorkerTimeoutError": "pipeflow.errors",
    "batch": "pipeflow.stages.batch",
    "bucket": "pipeflow.stages.bucket",
    "cache": "pipeflow.stages.cache",
    "collate": "pipeflow.stages.collate",
    "default_collate": "pipeflow.stages.collate",
    "default_convert": "pipeflow.stages.collate",
    "fetch": "pipeflow.stages.fetch",
    "filter": "pipeflow.stages.transforms",
    "from_iterable": "pipeflow.sources._basic",
    "from_sampler": "pipeflow.sources._basic",
    "get_worker_info": "pipeflow.worker_info",
    "ignore_errors": "pipeflow.stages.ignore",
    "indices": "pipeflow.sources._basic",
    "map": "pipeflow.stages.transforms",
    "mix": "pipeflow.sources.mix",
    "pack": "pipeflow.stages.pack",
    "parallel_map": "pipeflow.parallel._map",
    "parallel_source": "pipeflow.parallel._source",
    "pin_memory": "pipeflow.stages.device",
    "progress": "pipeflow.stages.progress",
    "random_map": "pipeflow.stages.transforms",
    "read_jsonl": "pipeflow.sources.readers",
    "read_parquet": "pipeflow.sources.readers",
    "read_tar": "pipeflow.sources.readers",
    "set_warm_start": "pipeflow.parallel.pools._warm",
    "shard": "pipeflow.stages.distributed",
    "shards": "pipeflow.sources.shards",
    "shared_list": "pipeflow.shared",
    "shuffle": "pipeflow.stages.shuffle",
    "stage": "pipeflow.engine._decorate",
    "to_device": "pipeflow.stages.device",
    "unbatch": "pipeflow.stages.batch",
}

#: Functions left as they are (not given keyword hints): called once per batch, and
#: ``pf.DataLoader`` looks at their identity.
_PLAIN = frozenset({"default_collate", "default_convert"})


def __getattr__(name: str) -> Any:
    """A public name, imported on first use (``DataLoader`` imports torch then, not before).

    A public function gets Python 3.13's "Did you mean" for a misspelt keyword argument (see
    :mod:`pipeflow._hints`).
    """
    module = _WHERE.get(name)
    if module is None:
        msg = f"module 'pipeflow' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    if isinstance(value, types.FunctionType) and name not in _PLAIN:
        from pipeflow._hints import mark_public

        value = mark_public(value, name)
    return globals().setdefault(name, value)  # two threads asking at once get one object


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


class _Package(types.ModuleType):
    """The ``pipeflow`` module: importing a submodule that shares a public name's spelling
    (``pipeflow.stages.batch``) leaves ``pf.batch`` the function, as it is when imported eagerly."""

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _WHERE and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package
