"""Argument checks, in one place: every factory validates its configuration with these.

Each raises ``TypeError`` for a value of the wrong kind and ``ValueError`` for one out of
range, with a message of the form ``"<stage>: <parameter> must be <rule> (got <value>)"``.
Integers are anything with ``__index__`` (a numpy integer too) except ``bool``, and come back
as plain ``int``.

Examples:
    >>> integer("batch", "size", 0, low=1)
    Traceback (most recent call last):
    ...
    ValueError: batch: size must be at least 1 (got 0)
    >>> boolean("batch", "drop_last", "yes")
    Traceback (most recent call last):
    ...
    TypeError: batch: drop_last must be a bool (got 'yes')
"""

from __future__ import annotations

import numbers
import threading
from collections.abc import Sequence
from typing import Any

from pipeflow._coroutines import refuse

__all__ = ["boolean", "function", "integer", "one_of", "optional_integer", "seconds"]


def integer(
    stage: str, name: str, value: Any, *, low: int | None = None, high: int | None = None
) -> int:
    """*value* as an ``int``, at least *low* and at most *high*."""
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        msg = f"{stage}: {name} must be an integer (got {value!r})"
        raise TypeError(msg)
    try:  # a float or many-element tensor, an array: they have __index__, and refuse it
        number = int(value.__index__())
    except Exception as e:
        msg = f"{stage}: {name} must be an integer (got {_shown(value)}: {e})"
        raise TypeError(msg) from None
    if low is not None and number < low:
        msg = f"{stage}: {name} must be at least {low} (got {number})"
        raise ValueError(msg)
    if high is not None and number > high:
        msg = f"{stage}: {name} must be at most {high} (got {number})"
        raise ValueError(msg)
    return number


def optional_integer(
    stage: str, name: str, value: Any, *, low: int | None = None, high: int | None = None
) -> int | None:
    """``None``, or *value* as an ``int`` of at least *low* and at most *high*."""
    if value is None:
        return None
    if isinstance(value, bool) or not hasattr(type(value), "__index__"):
        msg = f"{stage}: {name} must be an integer or None (got {value!r})"
        raise TypeError(msg)
    return integer(stage, name, value, low=low, high=high)


def boolean(stage: str, name: str, value: Any) -> bool:
    """*value*, which must be a ``bool``."""
    if not isinstance(value, bool):
        msg = f"{stage}: {name} must be a bool (got {value!r})"
        raise TypeError(msg)
    return value


def seconds(stage: str, name: str, value: Any) -> float | None:
    """``None``, or a finite number of seconds above 0 that a wait can take (at most
    ``threading.TIMEOUT_MAX``)."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        msg = f"{stage}: {name} must be a number of seconds or None (got {value!r})"
        raise TypeError(msg)
    if not float(value) > 0:
        msg = f"{stage}: {name} must be more than 0 seconds (got {value!r})"
        raise ValueError(msg)
    if not float(value) <= threading.TIMEOUT_MAX:  # inf, or past what a wait can take
        msg = (
            f"{stage}: {name} must be at most {threading.TIMEOUT_MAX:.0f} seconds (got "
            f"{value!r}); pass None to wait forever"
        )
        raise ValueError(msg)
    return float(value)


def _shown(value: Any) -> str:
    """*value*'s repr, cut short (a tensor's or an array's can be long)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:77]}..."


def function(stage: str, name: str, value: Any, *, optional: bool = False) -> Any:
    """*value*, which must be callable (or ``None`` when *optional*), and not a coroutine
    function (see :mod:`pipeflow._coroutines`)."""
    if value is None and optional:
        return None
    if not callable(value):
        what = "callable or None" if optional else "callable"
        msg = f"{stage}: {name} must be {what} (got {type(value).__name__})"
        raise TypeError(msg)
    refuse(stage, name, value)  # nothing that takes a function here awaits one
    return value


def one_of(stage: str, name: str, value: Any, options: Sequence[Any]) -> Any:
    """*value*, which must be one of *options* (of their type: an array is not compared
    element-wise)."""
    if not any(isinstance(value, type(o)) and value == o for o in options):
        listed = " or ".join(repr(o) for o in options)
        msg = f"{stage}: {name} must be {listed} (got {value!r})"
        raise ValueError(msg)
    return value
