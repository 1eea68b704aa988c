"""Coroutine functions where nothing can await them: found, and refused when a stage is built.

Only :func:`pipeflow.parallel_map` runs ``async def`` functions (on event loops, see
:mod:`pipeflow.parallel.pools._aio`). Any other stage would call one and pass the coroutine object
on, un-awaited, so the factories refuse it up front with :func:`refuse`.
"""

from __future__ import annotations

import inspect
from typing import Any

__all__ = ["is_coroutine_function", "refuse"]


def is_coroutine_function(fn: Any) -> bool:
    """Whether calling *fn* makes a coroutine: an ``async def`` function (also wrapped in
    ``functools.partial``), or an object whose ``__call__`` is one.

    Examples:
        >>> async def load(i):
        ...     return i
        ...
        >>> is_coroutine_function(load), is_coroutine_function(abs)
        (True, False)
    """
    if inspect.iscoroutinefunction(fn):
        return True
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - the method, not callable()
    return not inspect.isfunction(fn) and inspect.iscoroutinefunction(call)


def refuse(stage: str, name: str, fn: Any) -> None:
    """Raise ``TypeError`` when *fn* (parameter *name* of *stage*) is a coroutine function.

    Examples:
        >>> async def load(i):
        ...     return i
        ...
        >>> refuse("map", "fn", load)
        Traceback (most recent call last):
        ...
        TypeError: map: fn must be a plain function, not a coroutine function (got load): ...
    """
    if is_coroutine_function(fn) or inspect.isasyncgenfunction(fn):
        what = getattr(fn, "__qualname__", None) or type(fn).__qualname__
        msg = (
            f"{stage}: {name} must be a plain function, not a coroutine function (got {what}): "
            "nothing here would await it. pf.parallel_map(fn, workers=...) awaits a per-item "
            "async function on event loops (max_in_flight bounds how many run at once)"
        )
        raise TypeError(msg)
