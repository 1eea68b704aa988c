"""Parallel stages: ``parallel_map`` over threads or processes, and ``parallel_source``.

The layout, top-down: :mod:`._map` (the stage's generator, in-flight bound, reordering),
:mod:`._protocol` (what a pool offers), :mod:`._threads` and :mod:`._processes` (the pools),
:mod:`._worker` (what a worker runs; :mod:`._jobs`: a ``parallel_source`` worker's replica),
:mod:`._wire` (the records between
them), :mod:`._writer`, :mod:`._reader` and :mod:`._segments` (results through shared memory).
Coroutine functions: :mod:`._aio` (event loops in threads, a pool) and :mod:`._aio_worker`
(what a loop runs, in a thread or in a worker process).
"""

from pipeflow.parallel._map import parallel_map
from pipeflow.parallel._source import parallel_source

__all__ = ["parallel_map", "parallel_source"]
