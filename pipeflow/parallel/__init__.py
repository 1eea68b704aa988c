"""Parallel stages: ``parallel_map`` over threads or processes, and ``parallel_source``.

One batch's path, top-down: :mod:`._map` and :mod:`._source` (the stages), :mod:`._run` (a
pass: the in-flight bound and the reordering), :mod:`._processes`, :mod:`._threads` and
:mod:`._aio` (the pools, behind :mod:`._protocol`; :mod:`._kept` builds or keeps one),
:mod:`._worker` (the jobs and a process worker's loop), :mod:`._shm` (a result's way back
through shared memory; :mod:`._segments` makes the files) and :mod:`._wire` (the records
between them). Coroutine functions: :mod:`._aio` (event loops in threads) and
:mod:`._aio_worker` (what a loop runs, in a thread or in a worker process).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pipeflow.parallel._map import parallel_map
    from pipeflow.parallel._source import parallel_source

__all__ = ["parallel_map", "parallel_source"]


_WHERE = {"parallel_map": "pipeflow.parallel._map", "parallel_source": "pipeflow.parallel._source"}


def __getattr__(name: str) -> Any:
    """The two stages, imported on first use: a worker process imports only its own loop."""
    module = _WHERE.get(name)
    if module is None:
        msg = f"module 'pipeflow.parallel' has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
