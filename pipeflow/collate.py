"""The collate stage: every batch of samples becomes tensors.

The collate functions themselves, drop-in and faster versions of torch's, live in
:mod:`pipeflow._collate_torch` (``default_collate``) and :mod:`pipeflow._convert`
(``default_convert``); both are exported here and from ``pipeflow``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeflow import _checks
from pipeflow._collate_torch import default_collate
from pipeflow._convert import default_convert
from pipeflow._stage import Stage

__all__ = ["collate", "default_collate", "default_convert"]


class _DefaultCollate(Stage[Any, Any]):
    """``collate()`` with :func:`default_collate`: it has a numpy-only form for workers."""

    __slots__ = ()

    def without_torch(self) -> Stage[Any, Any]:
        """In a worker that has not imported torch: stack in numpy, make tensors on arrival."""
        from pipeflow._pending import collate_pending

        return Stage(_collate_with, "collate", {"fn": collate_pending}, length="same", skip="same")


def collate(fn: Callable[[Any], Any] | None = None) -> Stage[Any, Any]:
    """Turn every batch of samples into tensors with *fn* (default: :func:`default_collate`).

    Args:
        fn: the collate function; any callable taking one batch (a list of samples).

    Raises:
        TypeError: if *fn* is neither callable nor ``None``.

    Examples:
        >>> import pipeflow as pf
        >>> data = [(1.0, 0), (2.0, 1), (3.0, 0)]
        >>> x, y = next(iter(pf.indices(3) | pf.batch(2) | pf.fetch(data) | pf.collate()))
        >>> x, y
        (tensor([1., 2.], dtype=torch.float64), tensor([0, 1]))
        >>> pf.collate()
        collate()
    """
    if fn is None:
        return _DefaultCollate(_collate_default, "collate", length="same", skip="same")
    _checks.function("collate", "fn", fn, optional=True)
    return Stage(_collate_with, "collate", {"fn": fn}, length="same", skip="same")


def _collate_default(batches: Iterable[Any]) -> Iterator[Any]:
    return map(default_collate, batches)


def _collate_with(batches: Iterable[Any], fn: Callable[[Any], Any]) -> Iterator[Any]:
    return map(fn, batches)
