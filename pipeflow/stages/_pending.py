"""Collation in a worker that has not imported torch: numpy now, tensors on arrival.

A process worker whose job ends with the default ``collate()`` and whose user code never
imported torch runs this numpy-only version of :func:`~pipeflow.default_collate`: every leaf
that would become a tensor is stacked as a numpy array and wrapped in :class:`Pending`, which
unpickles in the main process as ``torch.from_numpy(array)`` — a view of the shared-memory
buffer it arrived in. The batch is identical to ``default_collate``'s, and a spawned worker
starts without paying for ``import torch``. Anything this module does not handle exactly as
``default_collate`` does falls back to ``default_collate`` itself.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from pipeflow.stages import _alloc
from pipeflow.stages._collate_torch import NP_SCALARS_FAST, default_collate

__all__ = ["Pending", "collate_pending"]

# numpy dtypes that torch.from_numpy takes on every supported torch (>= 2.1): the dtypes of
# the scalar types default_collate's fast path takes.
_DTYPES = frozenset(np.dtype(t) for t in NP_SCALARS_FAST)
_INTS = frozenset({int, bool})
_INT_RESULTS = frozenset({np.dtype(np.int64), np.dtype(np.bool_)})


class _NeedTorch(Exception):
    """This batch needs torch's own route."""


def _from_numpy(array: Any) -> Any:
    import torch

    return torch.from_numpy(array)


class Pending:
    """A numpy array that becomes a tensor when it is unpickled in the main process."""

    __slots__ = ("array",)

    def __init__(self, array: np.ndarray[Any, Any]) -> None:
        self.array = array

    def __reduce__(self) -> tuple[Any, ...]:
        return (_from_numpy, (self.array,))


def _leaf_arrays(batch: tuple[Any, ...] | list[Any]) -> Pending:
    first = batch[0]
    dtype, shape = first.dtype, first.shape
    if dtype not in _DTYPES or not dtype.isnative:
        raise _NeedTorch
    for a in batch:
        if type(a) is not np.ndarray or a.dtype != dtype or a.shape != shape:
            raise _NeedTorch
    out = _alloc.empty((len(batch), *shape), dtype)  # C-contiguous, as torch.stack makes
    np.stack(batch, out=out)
    return Pending(out)


def _collate(batch: tuple[Any, ...] | list[Any]) -> Any:
    elem = batch[0]
    kind = type(elem)
    if kind is np.ndarray:
        return _leaf_arrays(batch)
    if kind in _INTS:
        if not set(map(type, batch)) <= _INTS:
            raise _NeedTorch
        try:
            array = np.array(batch)
        except (OverflowError, TypeError, ValueError):
            raise _NeedTorch from None
        if array.dtype not in _INT_RESULTS:
            raise _NeedTorch
        return Pending(array)
    if kind is float:
        if set(map(type, batch)) != {float}:
            raise _NeedTorch
        return Pending(np.array(batch, dtype=np.float64))
    if kind in NP_SCALARS_FAST:
        if set(map(type, batch)) != {kind}:
            raise _NeedTorch
        return Pending(np.array(batch))
    if kind is str or kind is bytes:
        return batch
    if kind is dict:
        return {key: _collate([d[key] for d in batch]) for key in elem}
    if kind is list or kind is tuple or (isinstance(elem, tuple) and hasattr(elem, "_fields")):
        size = len(elem)
        if any(len(e) != size for e in batch):
            raise _NeedTorch
        columns = [_collate(samples) for samples in zip(*batch)]
        if kind is list or kind is tuple:
            return columns
        return kind(*columns)
    raise _NeedTorch


def collate_pending(batch: list[Any]) -> Any:
    """``default_collate(batch)`` with numpy arrays in :class:`Pending` in place of tensors."""
    if not batch:
        return default_collate(batch)
    try:
        return _collate(batch)
    except _NeedTorch:
        return default_collate(batch)
