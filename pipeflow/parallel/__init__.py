"""Parallel stages: ``parallel_map`` over threads or processes, and ``parallel_source``.

One batch's path, top-down: :mod:`._map` and :mod:`._source` (the stages), :mod:`._run` (a
pass: the in-flight bound and the reordering), :mod:`._processes`, :mod:`._threads` and
:mod:`._aio` (the pools, behind :mod:`._protocol`; :mod:`._kept` builds or keeps one),
:mod:`._worker` (the jobs and a process worker's loop), :mod:`._shm` (a result's way back
through shared memory; :mod:`._segments` makes the files) and :mod:`._wire` (the records
between them). Coroutine functions: :mod:`._aio` (event loops in threads) and
:mod:`._aio_worker` (what a loop runs, in a thread or in a worker process).
"""

from pipeflow.parallel._map import parallel_map
from pipeflow.parallel._source import parallel_source

__all__ = ["parallel_map", "parallel_source"]
