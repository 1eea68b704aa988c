"""Where collation allocates its batches.

Plain memory by default. A pipeflow process worker points this at its shared-memory arena, so
a batch is written once, straight into ``/dev/shm``, and travels to the main process by name
(see :mod:`pipeflow.parallel._shm`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["empty", "in_arena", "use"]

_allocate: Callable[[tuple[int, ...], Any], Any] | None = None


def use(allocate: Callable[[tuple[int, ...], Any], Any] | None) -> None:
    """Make :func:`empty` call *allocate* (``None``: back to ``numpy.empty``)."""
    global _allocate
    _allocate = allocate


def in_arena() -> bool:
    """Whether batches are allocated somewhere special (a worker's arena)."""
    return _allocate is not None


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised, C-contiguous numpy array for a batch.

    Examples:
        >>> empty((2, 3), "float32").shape
        (2, 3)
    """
    if _allocate is not None:
        return _allocate(shape, dtype)
    import numpy as np

    return np.empty(shape, dtype)
