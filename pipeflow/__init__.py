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

import inspect
from typing import TYPE_CHECKING, Any

from pipeflow._context import Context
from pipeflow._decorate import stage
from pipeflow._hints import mark_public
from pipeflow._objects import Stateful
from pipeflow._stage import Source, Stage
from pipeflow.batch import batch, unbatch
from pipeflow.bucket import bucket
from pipeflow.collate import collate, default_collate, default_convert
from pipeflow.device import pin_memory, to_device
from pipeflow.distributed import shard
from pipeflow.errors import (
    PipeflowError,
    StageStuckError,
    WorkerDiedError,
    WorkerError,
    WorkerTimeoutError,
)
from pipeflow.fetch import fetch
from pipeflow.ignore import ErrorBudgetExceeded, ignore_errors
from pipeflow.loader import Loader
from pipeflow.mix import mix
from pipeflow.pack import pack
from pipeflow.pad import Padded
from pipeflow.parallel import parallel_map, parallel_source
from pipeflow.parallel._warm import set_warm_start
from pipeflow.progress import progress
from pipeflow.readers import ShardReadError, read_jsonl, read_parquet, read_tar
from pipeflow.shards import Shard, shards
from pipeflow.shared import SharedList, shared_list
from pipeflow.shuffle import shuffle
from pipeflow.sources import from_iterable, from_sampler, indices
from pipeflow.stats import StageStats, Stats
from pipeflow.transforms import filter, map, random_map
from pipeflow.worker_info import WorkerInfo, get_worker_info

if TYPE_CHECKING:
    from pipeflow.dataloader import DataLoader
    from pipeflow.stateful_dataloader import StatefulDataLoader

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
    "WorkerDiedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerTimeoutError",
    "batch",
    "bucket",
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


def _check_keywords() -> None:
    """Give the public functions Python 3.13's "Did you mean" for a misspelt keyword argument
    (see :mod:`pipeflow._hints`). The collate functions, called once per batch, and whose
    identity ``pf.DataLoader`` looks at, are left as they are."""
    namespace = globals()
    for name in __all__:
        value = namespace.get(name)
        if inspect.isfunction(value) and name not in ("default_collate", "default_convert"):
            namespace[name] = mark_public(value, name)


_check_keywords()


def __getattr__(name: str) -> Any:
    # DataLoader subclasses torch's, so defining it imports torch: do that on first use only.
    if name == "DataLoader":
        from pipeflow.dataloader import DataLoader

        globals()["DataLoader"] = DataLoader
        return DataLoader
    if name == "StatefulDataLoader":
        from pipeflow.stateful_dataloader import StatefulDataLoader

        globals()["StatefulDataLoader"] = StatefulDataLoader
        return StatefulDataLoader
    msg = f"module 'pipeflow' has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
