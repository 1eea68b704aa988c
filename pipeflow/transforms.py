"""Per-item transforms: ``map`` and ``filter``."""

from __future__ import annotations

import builtins
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from pipeflow._stage import Stage

__all__ = ["filter", "map"]

T = TypeVar("T")
U = TypeVar("U")


def _check_callable(stage: str, name: str, fn: Any) -> None:
    if not callable(fn):
        msg = f"{stage}: {name} must be callable (got {type(fn).__name__})"
        raise TypeError(msg)


def map(fn: Callable[[T], U]) -> Stage[T, U]:
    """Apply *fn* to every item.

    For process workers, make *fn* a module-level function or a frozen dataclass so it pickles.

    Raises:
        TypeError: if *fn* is not callable.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.indices(3) | pf.map(str))
        ['0', '1', '2']
    """
    _check_callable("map", "fn", fn)
    return Stage(_map, "map", {"fn": fn}, length="same")


def _map(items: Iterable[T], fn: Callable[[T], U]) -> Iterator[U]:
    return builtins.map(fn, items)


def filter(predicate: Callable[[T], Any]) -> Stage[T, T]:
    """Keep the items for which *predicate* is true.

    The loader loses its ``len()`` after a filter: how many items pass is only known by
    running it.

    Raises:
        TypeError: if *predicate* is not callable.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.indices(6) | pf.filter(lambda i: i % 2 == 0))
        [0, 2, 4]
    """
    _check_callable("filter", "predicate", predicate)
    return Stage(_filter, "filter", {"predicate": predicate})


def _filter(items: Iterable[T], predicate: Callable[[T], Any]) -> Iterator[T]:
    return builtins.filter(predicate, items)
