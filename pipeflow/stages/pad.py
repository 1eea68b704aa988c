"""Padding collate: ragged samples become one padded tensor per field (``collate(pad=...)``).

What is padded is decided by the samples' structure, never by one batch's shapes, so every
batch of a loader has the same structure:

- *pad* mirrors a sample: a number applies to everything below it; a dict gives values by
  field name, a tuple or list by position; ``None`` (or a field left out of a dict) collates
  that part as :func:`~pipeflow.default_collate` does.
- Where a pad value applies, every array of one or more dimensions — a NumPy array, a tensor,
  or a list of numbers (token ids) — is a leaf to pad: the batch is its items stacked, each
  dimension as long as its longest item (the first one rounded up to *pad_to_multiple_of*),
  the rest filled with the pad value. Numbers and strings are collated as by
  ``default_collate``; dicts come back as dicts, tuples as lists, namedtuples as themselves.
- With *lengths* or *mask*, a padded leaf comes back as :class:`Padded`: its ``values``, its
  ``lengths`` (``int64``: each item's length for 1-D items, shape ``(batch,)``; each item's
  shape for others, ``(batch, ndim)``) and its ``mask`` (``bool``, ``True`` on each item's own
  entries: ``~mask`` is torch's ``key_padding_mask``), the ones not asked for ``None``.

The arrays are made where ``default_collate`` makes them: in a pipeflow process worker, in the
shared memory the batch travels in (and as numpy arrays that become tensors on arrival, in a
worker that has not imported torch); in a torch ``DataLoader`` worker, in torch's shared
memory.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from pipeflow import _checks
from pipeflow.engine._stage import Stage, Traits
from pipeflow.stages import _alloc
from pipeflow.stages._collate_torch import _in_worker, default_collate
from pipeflow.stages._pending import Pending, collate_pending

__all__ = ["Padded", "padded_collate"]

_NUMBERS = (int, float, np.number, np.bool_)


class Padded(NamedTuple):
    """A padded field of a batch, when ``collate(pad=..., lengths=True)`` or ``mask=True``.

    Attributes:
        values: the items, padded and stacked.
        lengths: each item's length (1-D items) or shape (others), or ``None``.
        mask: ``True`` on the items' own entries, ``False`` on padding, or ``None``.
    """

    values: Any
    lengths: Any
    mask: Any


def check_pad(pad: Any, name: str = "pad") -> Any:
    """*pad*, checked: a number, ``None``, or a dict (by field) or tuple (by position) of them."""
    if pad is None or (isinstance(pad, _NUMBERS) and not isinstance(pad, complex)):
        return pad
    if isinstance(pad, dict):
        return {k: check_pad(v, f"{name}[{k!r}]") for k, v in pad.items()}
    if isinstance(pad, (tuple, list)):
        return tuple(check_pad(v, f"{name}[{i}]") for i, v in enumerate(pad))
    msg = f"collate: {name} must be a number, or a dict or tuple of them (got {pad!r})"
    raise TypeError(msg)


def padded_collate(
    pad: Any, pad_to_multiple_of: int | None, lengths: bool, mask: bool
) -> Stage[Any, Any]:
    """The stage ``collate(pad=...)`` builds (its arguments checked here)."""
    pad = check_pad(pad)
    multiple = _checks.optional_integer("collate", "pad_to_multiple_of", pad_to_multiple_of, low=1)
    _checks.boolean("collate", "lengths", lengths)
    _checks.boolean("collate", "mask", mask)
    config = {"pad": pad, "pad_to_multiple_of": multiple, "lengths": lengths, "mask": mask}
    return Stage(_collate_padded, "collate", config, length="same", skip="same", traits=_PADDED)


def _numpy_padded(**config: Any) -> Stage[Any, Any]:
    """In a worker that has not imported torch: numpy arrays, tensors on arrival."""
    return Stage(_collate_pending, "collate", config, length="same", skip="same")


_PADDED = Traits(numpy=_numpy_padded)


@dataclass(frozen=True)
class _Options:
    multiple: int | None
    lengths: bool
    mask: bool
    #: ``make(shape, dtype) -> (array to fill, what the batch holds)``
    make: Callable[[tuple[int, ...], Any], tuple[Any, Any]]
    plain: Callable[[Any], Any]  # the collate of what is not padded


def _collate_padded(
    batches: Iterable[Any], pad: Any, pad_to_multiple_of: int | None, lengths: bool, mask: bool
) -> Iterator[Any]:
    opts = _Options(pad_to_multiple_of, lengths, mask, _make_tensor, default_collate)
    for batch in batches:
        yield _walk(batch, pad, opts, "")


def _collate_pending(
    batches: Iterable[Any], pad: Any, pad_to_multiple_of: int | None, lengths: bool, mask: bool
) -> Iterator[Any]:
    opts = _Options(pad_to_multiple_of, lengths, mask, _make_pending, collate_pending)
    for batch in batches:
        yield _walk(batch, pad, opts, "")


def _make_tensor(shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
    import torch

    if _in_worker():  # a torch DataLoader worker: torch's shared memory
        proto = torch.from_numpy(np.empty(0, dtype=dtype))
        typed = proto._typed_storage()  # type: ignore[no-untyped-call]
        storage = typed._new_shared(math.prod(shape), device=proto.device)
        out = proto.new(storage).resize_(shape)
        return out.numpy(), out
    array = _alloc.empty(shape, dtype)  # in a pipeflow process worker: the batch's segment
    return array, torch.from_numpy(array)


def _make_pending(shape: tuple[int, ...], dtype: Any) -> tuple[Any, Any]:
    array = _alloc.empty(shape, dtype)
    return array, Pending(array)


# -- the structure --------------------------------------------------------------------------
def _walk(batch: Any, spec: Any, opts: _Options, where: str) -> Any:
    """Collate *batch* (a list of samples, or of one field of them) with the pad *spec*."""
    if spec is None:
        return opts.plain(batch)
    elem = batch[0]
    per_field = isinstance(spec, (dict, tuple))
    if _is_leaf(elem):
        if per_field:
            raise _mismatch(where, spec, "arrays")
        return _pad_leaf(batch, spec, opts, where)
    if isinstance(elem, Mapping):
        return _walk_mapping(batch, spec, opts, where)
    if isinstance(elem, (tuple, list)):
        return _walk_sequence(batch, spec, opts, where)
    if per_field:
        raise _mismatch(where, spec, type(elem).__name__)
    return opts.plain(batch)


def _walk_mapping(batch: Any, spec: Any, opts: _Options, where: str) -> dict[Any, Any]:
    keys = list(batch[0])
    if isinstance(spec, tuple):
        raise _mismatch(where, spec, "dicts")
    if isinstance(spec, dict) and not set(spec) <= set(keys):
        missing = sorted(map(repr, set(spec) - set(keys)))
        msg = (
            f"collate: pad names the field {', '.join(missing)} that the samples{where} do not "
            f"have (they have {', '.join(map(repr, keys))})"
        )
        raise ValueError(msg)

    def field(k: Any) -> Any:
        return spec.get(k) if isinstance(spec, dict) else spec

    return {k: _walk([s[k] for s in batch], field(k), opts, f"{where}[{k!r}]") for k in keys}


def _walk_sequence(batch: Any, spec: Any, opts: _Options, where: str) -> Any:
    elem = batch[0]
    size = len(elem)
    if isinstance(spec, dict) or (isinstance(spec, tuple) and len(spec) != size):
        raise _mismatch(where, spec, f"sequences of {size}")
    if any(len(s) != size for s in batch):
        first = next(i for i, s in enumerate(batch) if len(s) != size)
        msg = (
            f"collate: the samples{where} must have one length (item 0 has length {size}, "
            f"item {first} has length {len(batch[first])})"
        )
        raise RuntimeError(msg)
    cols = [
        _walk(list(col), spec[i] if isinstance(spec, tuple) else spec, opts, f"{where}[{i}]")
        for i, col in enumerate(zip(*batch))
    ]
    return type(elem)(*cols) if hasattr(elem, "_fields") else cols


def _mismatch(where: str, spec: Any, got: str) -> ValueError:
    what = "by field" if isinstance(spec, dict) else "by position"
    msg = f"collate: pad{where} gives values {what}, but the samples{where} are {got}"
    return ValueError(msg)


def _is_leaf(x: Any) -> bool:
    """Whether *x* is an array to pad: an array or tensor of 1+ dimensions, or a list of
    numbers (an empty one too)."""
    if isinstance(x, np.ndarray):
        return x.ndim >= 1
    if isinstance(x, list):
        return not x or isinstance(x[0], _NUMBERS)
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor) and x.dim() >= 1


# -- one leaf ---------------------------------------------------------------------------------
class _TorchOnly(Exception):
    """A tensor numpy can't view (another device, a dtype numpy lacks, autograd)."""


def _as_array(x: Any) -> np.ndarray[Any, Any]:
    if isinstance(x, np.ndarray):
        return x
    if isinstance(x, list):
        return np.asarray(x)
    try:
        return x.numpy()  # type: ignore[no-any-return]
    except (TypeError, RuntimeError) as e:
        raise _TorchOnly from e


def _pad_leaf(batch: Any, value: Any, opts: _Options, where: str) -> Any:
    try:
        arrays = [_as_array(x) for x in batch]
    except _TorchOnly:
        return _pad_tensors(batch, value, opts, where)
    shape = _padded_shape([a.shape for a in arrays], opts.multiple, where)
    dtype = np.result_type(*arrays)
    _check_fits(value, dtype, where)
    array, values = opts.make((len(arrays), *shape), dtype)
    for row, a in zip(array, arrays):
        _put(row, a, value)
    if not (opts.lengths or opts.mask):
        return values
    return Padded(values, _lengths(arrays, opts), _mask(arrays, shape, opts))


def _put(row: np.ndarray[Any, Any], a: np.ndarray[Any, Any], value: Any) -> None:
    """Copy *a* into the start of *row*; fill the rest with *value*."""
    if row.ndim == 1:
        row[: len(a)] = a
        row[len(a) :] = value
        return
    row.fill(value)
    row[tuple(slice(0, n) for n in a.shape)] = a


def _padded_shape(
    shapes: list[tuple[int, ...]], multiple: int | None, where: str
) -> tuple[int, ...]:
    """Each dimension as long as its longest item's; the first rounded up to *multiple*."""
    ndim = len(shapes[0])
    if any(len(s) != ndim for s in shapes):
        first = next(i for i, s in enumerate(shapes) if len(s) != ndim)
        msg = (
            f"collate: cannot pad the items{where}: item 0 has shape {shapes[0]}, item {first} "
            f"has shape {shapes[first]} (padding keeps the number of dimensions)"
        )
        raise RuntimeError(msg)
    out = [max(dims) for dims in zip(*shapes)]
    if multiple is not None:
        out[0] = -(-out[0] // multiple) * multiple
    return tuple(out)


def _check_fits(value: Any, dtype: Any, where: str) -> None:
    with np.errstate(all="ignore"):
        try:
            fits = bool(np.array(value).astype(dtype) == value)
        except (TypeError, ValueError, OverflowError):
            fits = False
    if not fits:
        msg = f"collate: the pad value {value!r} must fit the items{where}, of dtype {dtype}"
        raise ValueError(msg)


def _lengths(arrays: list[np.ndarray[Any, Any]], opts: _Options) -> Any:
    if not opts.lengths:
        return None
    one_d = arrays[0].ndim == 1
    array, out = opts.make((len(arrays),) if one_d else (len(arrays), arrays[0].ndim), np.int64)
    array[...] = [len(a) for a in arrays] if one_d else [a.shape for a in arrays]
    return out


def _mask(arrays: list[np.ndarray[Any, Any]], shape: tuple[int, ...], opts: _Options) -> Any:
    if not opts.mask:
        return None
    array, out = opts.make((len(arrays), *shape), np.bool_)
    for row, a in zip(array, arrays):
        if a.ndim == 1:
            row[: len(a)] = True
            row[len(a) :] = False
        else:
            row.fill(False)
            row[tuple(slice(0, n) for n in a.shape)] = True
    return out


def _pad_tensors(batch: Any, value: Any, opts: _Options, where: str) -> Any:
    """Tensors numpy can't view (another device, bfloat16): padded by torch, in plain memory."""
    import torch

    shape = _padded_shape([tuple(t.shape) for t in batch], opts.multiple, where)
    first = batch[0]
    values = torch.full((len(batch), *shape), value, dtype=first.dtype, device=first.device)
    mask = torch.zeros((len(batch), *shape), dtype=torch.bool, device=first.device)
    for i, t in enumerate(batch):
        inside: Any = (i, *(slice(0, n) for n in t.shape))
        values[inside] = t
        mask[inside] = True
    if not (opts.lengths or opts.mask):
        return values
    sizes = [t.shape[0] for t in batch] if first.dim() == 1 else [list(t.shape) for t in batch]
    lengths = torch.tensor(sizes, dtype=torch.int64) if opts.lengths else None
    return Padded(values, lengths, mask if opts.mask else None)
