"""``default_collate``: a drop-in, faster ``torch.utils.data.default_collate``.

Same structure, Python types, tensor dtypes and values (``default_convert``, in
:mod:`pipeflow.stages._convert`, likewise), and the same exception types for what torch rejects;
different in speed, in two messages, and in one case that torch refuses:

- Dispatch looks up the exact type of the first element in a table before falling back to
  torch's ``isinstance`` order, so subclasses resolve exactly as they do in torch.
- A batch of NumPy arrays of one shape and dtype is joined in NumPy and becomes a tensor with
  one ``torch.from_numpy`` (torch makes a tensor of every array, then stacks them). Batches of
  Python ``int``/``float`` or of one NumPy scalar type go through ``np.array`` likewise. Every
  fast path checks that it gives torch's dtype; anything else takes torch's own route.
- Items of different shapes raise torch's ``RuntimeError``, with a message that names the
  positions and shapes of the items that differ; sequences of different lengths raise torch's
  ``RuntimeError`` and message, followed by the positions and lengths.
- Arrays with negative strides (``a[::-1]``) are collated; torch raises ``ValueError`` for
  them when they take its route, because it cannot view them without a copy.

torch is imported on the first call, not when this module is imported.
"""

from __future__ import annotations

import copy
import math
import os
from collections.abc import (
    Callable,
    Mapping,
    MutableMapping,
    MutableSequence,
    Sequence,
)
from typing import TYPE_CHECKING, Any, cast

import numpy as np

from pipeflow.stages import _alloc, _convert

if TYPE_CHECKING:
    import torch

__all__ = ["NP_SCALARS_FAST", "default_collate"]

_Collator = Callable[[Sequence[Any]], Any]

# Filled by `_load()` on the first call, so that importing this module does not import torch.
# Exact type -> handler; the hot path is one dict lookup on `type(elem)`.
_COLLATE_BY_TYPE: dict[type, _Collator] = {}
# torch's `default_collate_fn_map`, in its insertion order, for subclasses of those types.
_COLLATE_BY_ISINSTANCE: list[tuple[type | tuple[type, ...], _Collator]] = []
_SPARSE_LAYOUTS: frozenset[Any] = frozenset()

_STR_OBJ_DTYPE = _convert.STR_OBJ_DTYPE
_COLLATE_TYPE_ERROR = (
    "default_collate: batch must contain tensors, numpy arrays, numbers, dicts or lists; found {}"
)
_UNEQUAL_LENGTHS = "each element in list of batch should be of equal size"

_NDARRAY_ONLY = frozenset({np.ndarray})
_FLOAT_ONLY = frozenset({float})
_INT_TYPES = frozenset({int, bool})
# What `np.array(list of Python ints/bools)` may give where torch.tensor gives the same dtype.
_INT_RESULT_DTYPES = frozenset({np.dtype(np.int64), np.dtype(np.bool_)})
# NumPy scalar types for which `np.array(batch)` has the dtype that `torch.as_tensor(batch)` has.
# (torch rejects `uint64` scalars and `longdouble`, and torch < 2.3 lacks `uint16`/`uint32`:
# those take torch's route, to its result or its error.)
NP_SCALARS_FAST = frozenset(
    {
        np.bool_,
        np.int8,
        np.int16,
        np.int32,
        np.int64,
        np.uint8,
        np.float16,
        np.float32,
        np.float64,
        np.complex64,
        np.complex128,
    }
)


_TORCH_WORKER: list[int | bool] = [-1, False]  # [pid, in a torch worker?], cached per process


def _in_worker() -> bool:
    """Whether this runs in a torch DataLoader worker (then batches go to torch's shared memory).

    pipeflow's own process workers answer torch's ``get_worker_info()`` too, but they send
    results through their own shared memory, so collation there allocates plain memory. The
    answer is cached per process (a worker learns what it is before its first batch).

    Examples:
        >>> _in_worker()
        False
    """
    pid = os.getpid()
    if _TORCH_WORKER[0] != pid:
        from torch.utils.data import get_worker_info as torch_worker_info

        from pipeflow.worker_info import _process_info

        ours = _process_info is not None
        _TORCH_WORKER[:] = [pid, torch_worker_info() is not None and not ours]
    return bool(_TORCH_WORKER[1])


def default_collate(batch: Sequence[Any]) -> Any:
    """Stack a list of samples into a batch, like ``torch.utils.data.default_collate``.

    Tensors, NumPy arrays and numbers become one tensor with a new first dimension; strings and
    bytes stay a sequence; mappings, namedtuples and sequences are collated field by field
    (a tuple becomes a list, as in torch).

    Args:
        batch: the samples; every sample must have the structure of the first.

    Returns:
        The batch, with the structure of a sample.

    Raises:
        RuntimeError: if tensors or arrays in the batch have different shapes (the message names
            the items and their shapes), or sequences have different lengths.
        TypeError: if a type cannot be collated (torch's message).

    Examples:
        >>> import numpy as np
        >>> from collections import namedtuple
        >>> default_collate([0, 1, 2, 3])
        tensor([0, 1, 2, 3])
        >>> default_collate([0.5, 1.0])
        tensor([0.5000, 1.0000], dtype=torch.float64)
        >>> default_collate(["a", "b"])
        ['a', 'b']
        >>> default_collate([{"x": np.array([1, 2]), "y": 0}, {"x": np.array([3, 4]), "y": 1}])
        {'x': tensor([[1, 2],
                [3, 4]]), 'y': tensor([0, 1])}
        >>> Point = namedtuple("Point", ["x", "y"])
        >>> default_collate([Point(0, 0), Point(1, 1)])
        Point(x=tensor([0, 1]), y=tensor([0, 1]))
        >>> default_collate([(0, "a"), (1, "b")])
        [tensor([0, 1]), ('a', 'b')]
        >>> default_collate([np.zeros(3), np.zeros(3), np.zeros(4)])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        RuntimeError: default_collate: cannot stack items ... item 2 has shape (4,) ...
    """
    if not _COLLATE_BY_TYPE:
        _load()
    return _collate(batch)


# --- default_collate -------------------------------------------------------------------------


def _collate(batch: Sequence[Any]) -> Any:
    elem = batch[0]
    handler = _COLLATE_BY_TYPE.get(type(elem))
    if handler is None:
        handler = _collate_handler(elem)
    return handler(batch)


def _collate_handler(elem: Any) -> _Collator:
    """Find the handler for *elem* in torch's order: registered types, then containers."""
    for types, handler in _COLLATE_BY_ISINSTANCE:
        if isinstance(elem, types):
            return handler
    if isinstance(elem, Mapping):
        return _collate_mapping
    if isinstance(elem, tuple) and hasattr(elem, "_fields"):
        return _collate_namedtuple
    if isinstance(elem, Sequence):
        return _collate_sequence
    raise TypeError(_COLLATE_TYPE_ERROR.format(type(elem)))


def _collate_tensors(batch: Sequence[Any]) -> Any:
    elem = batch[0]
    if elem.is_nested:
        msg = (
            "Batches of nested tensors are not currently supported by the default collate_fn; "
            "please provide a custom collate_fn to handle them appropriately."
        )
        raise RuntimeError(msg)
    if elem.layout in _SPARSE_LAYOUTS:
        msg = (
            "Batches of sparse tensors are not currently supported by the default collate_fn; "
            "please provide a custom collate_fn to handle them appropriately."
        )
        raise RuntimeError(msg)
    try:
        out = None
        if _in_worker():
            # Stack straight into shared memory, which the worker sends to the main process.
            numel = sum(x.numel() for x in batch)
            storage = elem._typed_storage()._new_shared(numel, device=elem.device)
            out = elem.new(storage).resize_(len(batch), *elem.size())
        return torch.stack(cast("list[torch.Tensor]", batch), 0, out=out)
    except RuntimeError as error:
        _raise_if_shapes_differ(batch, error)
        raise


def _raise_if_shapes_differ(batch: Sequence[Any], error: BaseException) -> None:
    shapes = [tuple(getattr(item, "shape", ())) for item in batch]
    differ = [i for i, shape in enumerate(shapes) if shape != shapes[0]]
    if differ:
        first = differ[0]
        msg = (
            f"default_collate: cannot stack items of different shapes: item 0 has shape "
            f"{shapes[0]}, item {first} has shape {shapes[first]} ({len(differ)} of "
            f"{len(batch)} items differ from item 0); pad them with pf.collate(pad=...), "
            "crop them to one shape, or pass a collate_fn that handles items of different sizes"
        )
        raise RuntimeError(msg) from error


def _collate_arrays(batch: Sequence[Any]) -> Any:
    elem = batch[0]
    if _STR_OBJ_DTYPE.search(elem.dtype.str) is not None:
        raise TypeError(_COLLATE_TYPE_ERROR.format(elem.dtype))
    stacked = _stack_arrays(batch, elem)
    if stacked is not None:
        return stacked
    # torch's route, which raises torch's errors: a tensor per array, then stack them.
    return _collate_tensors([torch.as_tensor(item) for item in batch])


def _stack_arrays(batch: Sequence[Any], elem: Any) -> Any:
    """Join plain arrays of one shape and dtype in NumPy; None if they are not such a batch."""
    if set(map(type, batch)) != _NDARRAY_ONLY:
        return None
    if elem.ndim and len(set(map(len, batch))) != 1:
        return None
    # `from_numpy` refuses dtypes torch lacks (TypeError) and other byte orders (ValueError);
    # `casting="no"` makes NumPy refuse items of other dtypes (TypeError); concatenation checks
    # the other dimensions (ValueError). Then torch's route gives torch's result or error.
    shape = (len(batch), *elem.shape)
    try:
        if _in_worker():
            proto: Any = torch.from_numpy(np.empty(0, dtype=elem.dtype))
            storage = proto._typed_storage()._new_shared(math.prod(shape), device=proto.device)
            out = proto.new(storage).resize_(shape)
        else:  # in a pipeflow process worker, memory the batch will travel in
            out = torch.from_numpy(_alloc.empty(shape, elem.dtype))
        _join_arrays(batch, out.numpy())
    except (TypeError, ValueError):
        return None
    return out


def _join_arrays(batch: Sequence[Any], out: Any) -> None:
    """Copy the arrays into the C-contiguous array *out*, one after the other."""
    if out.ndim == 1:  # 0-d items
        np.stack(batch, out=out, casting="no")
    else:  # concatenate along the first axis: faster than np.stack, which adds an axis to each
        rows = out.reshape(out.shape[0] * out.shape[1], *out.shape[2:])  # a view of `out`
        np.concatenate(batch, out=rows, casting="no")


def _collate_numpy_scalars(batch: Sequence[Any]) -> Any:
    types = set(map(type, batch))
    if len(types) == 1 and types.pop() in NP_SCALARS_FAST:
        return torch.from_numpy(np.array(batch))
    return torch.as_tensor(batch)


def _collate_floats(batch: Sequence[Any]) -> Any:
    if set(map(type, batch)) == _FLOAT_ONLY:
        return torch.from_numpy(np.array(batch, dtype=np.float64))
    return torch.tensor(batch, dtype=torch.float64)


def _collate_ints(batch: Sequence[Any]) -> Any:
    # torch.tensor gives int64, or bool when every item is a bool.
    if set(map(type, batch)) <= _INT_TYPES:
        try:
            array = np.array(batch)
        except (OverflowError, TypeError, ValueError):
            pass
        else:
            if array.dtype in _INT_RESULT_DTYPES:
                return torch.from_numpy(array)
    return torch.tensor(batch)


def _collate_strings(batch: Sequence[Any]) -> Any:
    return batch


def _collate_dict(batch: Sequence[Any]) -> Any:
    return {key: _collate([sample[key] for sample in batch]) for key in batch[0]}


def _collate_mapping(batch: Sequence[Any]) -> Any:
    elem = batch[0]
    if isinstance(elem, MutableMapping):
        # A copy keeps whatever else the mapping holds (a defaultdict's factory, attributes).
        try:
            clone = copy.copy(elem)
        except TypeError:
            return _collate_dict(batch)
        values = _collate_dict(batch)
        try:
            clone.update(values)
        except TypeError:
            return values
        return clone
    values = _collate_dict(batch)
    try:
        return type(elem)(values)
    except TypeError:
        return values


def _collate_namedtuple(batch: Sequence[Any]) -> Any:
    return type(batch[0])(*[_collate(samples) for samples in zip(*batch)])


def _transpose(batch: Sequence[Any]) -> list[Any]:
    """Collate position by position: a list with one batch per position of a sample."""
    _check_lengths(batch)
    return [_collate(samples) for samples in zip(*batch)]  # tuples, as torch passes them


def _check_lengths(batch: Sequence[Any]) -> None:
    if len(set(map(len, batch))) == 1:
        return
    size = len(batch[0])
    first = next(i for i, sample in enumerate(batch) if len(sample) != size)
    msg = (
        f"{_UNEQUAL_LENGTHS} (item 0 has length {size}, item {first} has length "
        f"{len(batch[first])})"
    )
    raise RuntimeError(msg)


def _collate_sequence(batch: Sequence[Any]) -> Any:
    elem = batch[0]
    if isinstance(elem, tuple):
        return _transpose(batch)  # a list, as in torch
    if not isinstance(elem, MutableSequence):
        values = _transpose(batch)
        try:
            return type(elem)(values)
        except TypeError:  # a type that cannot be built from a list, such as `range`
            return values
    # A copy keeps whatever else the sequence holds; torch copies after checking the lengths.
    _check_lengths(batch)
    try:
        clone = copy.copy(elem)
    except TypeError:
        return [_collate(samples) for samples in zip(*batch)]
    values = [_collate(samples) for samples in zip(*batch)]
    try:
        for i, value in enumerate(values):
            clone[i] = value
    except TypeError:
        return values
    return clone


# --- set-up ----------------------------------------------------------------------------------


def _load() -> None:
    """Import torch and fill the dispatch tables (idempotent)."""
    global torch, _SPARSE_LAYOUTS
    import torch

    _convert.load()
    _SPARSE_LAYOUTS = frozenset(
        {torch.sparse_coo, torch.sparse_csr, torch.sparse_bsr, torch.sparse_csc, torch.sparse_bsc}
    )
    by_isinstance: list[tuple[type | tuple[type, ...], _Collator]] = [
        (torch.Tensor, _collate_tensors),
        (np.ndarray, _collate_arrays),
        ((np.bool_, np.number, np.object_), _collate_numpy_scalars),
        (float, _collate_floats),
        (int, _collate_ints),
        (str, _collate_strings),
        (bytes, _collate_strings),
    ]
    _COLLATE_BY_ISINSTANCE[:] = by_isinstance

    # Exact types resolve as torch's `isinstance` order resolves them (bool -> int handler,
    # np.float64 -> NumPy scalar handler although it subclasses float).
    known = {torch.Tensor, np.ndarray, float, int, bool, str, bytes, *np.sctypeDict.values()}
    collate_by_type: dict[type, _Collator] = {}
    for cls in known:
        for types, handler in by_isinstance:
            if issubclass(cls, types):
                collate_by_type[cls] = handler
                break
    collate_by_type.update({dict: _collate_dict, list: _transpose, tuple: _transpose})

    # Fill the tables last: a non-empty table tells the public functions torch is loaded.
    _COLLATE_BY_TYPE.update(collate_by_type)
