"""Where a collate makes its batch: plain memory, or the memory the batch will travel in.

A process worker's task thread installs its shared-memory writer here
(:func:`install`); a collate that asks :func:`empty` for its output array there gets pages of
a segment that goes to the main process as it is, with no copy. Everywhere else, ``empty``
is ``numpy.empty``. This module is on the ground floor: collate needs it, and it needs nothing
of the parallel package.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["empty", "install", "uninstall"]

Allocator = Callable[[tuple[int, ...], Any], Any]

_ACTIVE: list[Any] = [None, None, None]  # [pid, thread id, allocator]


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """``numpy.empty``, or, in the thread that installed an allocator, that allocator's."""
    pid, thread, allocate = _ACTIVE
    if allocate is not None and pid == os.getpid() and thread == threading.get_ident():
        return allocate(shape, dtype)
    import numpy as np

    return np.empty(shape, dtype)


def install(allocate: Allocator) -> None:
    """Make :func:`empty` use *allocate* in this thread of this process."""
    _ACTIVE[:] = [os.getpid(), threading.get_ident(), allocate]


def uninstall(allocate: Allocator) -> None:
    """Undo :func:`install`, if *allocate* is still the one installed."""
    if _ACTIVE[2] == allocate:
        _ACTIVE[:] = [None, None, None]
