"""Parallel stages: ``parallel_map`` over threads, processes or Ray actors, and
``parallel_source``.

One batch's path, top-down: :mod:`._map` and :mod:`._source` (the stages), :mod:`._run` (a
pass: the in-flight bound and the reordering), :mod:`._kept` (which pool a pass runs on, and
the one kept between passes), then three rooms, each a package:

- :mod:`.pools`: who runs the work: the pool protocol, threads, processes, event loops, what
  a worker does with one task (the jobs), the workers' lives and shutdown, and starting
  worker processes well;
- :mod:`.transport`: a result's way back from a worker process: the typed records between
  them, shared memory, and the files in ``/dev/shm`` it lives in;
- :mod:`.ray`: Ray actors as a pool's workers.

``transport`` imports nothing of the others; ``pools`` imports ``transport``; ``ray`` imports
both; the modules here import all three. None of them imports the stages' modules
(``_map``, ``_source``) or ``_run``.
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
