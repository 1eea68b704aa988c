"""``default_convert``: NumPy arrays and scalars in a sample become tensors, as torch does.

torch is imported on the first call, not when this module is imported.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping, MutableMapping, MutableSequence, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

__all__ = ["default_convert", "load"]

_Converter = Callable[[Any], Any]
# Filled by `load()` on the first call: exact type -> handler.
_CONVERT_BY_TYPE: dict[type, _Converter] = {}
# torch refuses arrays of strings and objects; it looks for these letters in `dtype.str`.
STR_OBJ_DTYPE = re.compile(r"[SaUO]")


def default_convert(data: Any) -> Any:
    """Turn the NumPy arrays and scalars in *data* into tensors, like torch's ``default_convert``.

    Mappings, namedtuples and sequences are converted element by element (a tuple becomes a
    list, as in torch); everything else, strings included, is returned unchanged.

    Args:
        data: one sample.

    Returns:
        *data* with NumPy arrays and scalars replaced by tensors (sharing memory, like
        ``torch.as_tensor``).

    Examples:
        >>> import numpy as np
        >>> default_convert(0)
        0
        >>> default_convert(np.array([0, 1]))
        tensor([0, 1])
        >>> default_convert({"x": np.float32(1.5), "name": "a"})
        {'x': tensor(1.5000), 'name': 'a'}
        >>> default_convert((np.array(1), [np.array(2)]))
        [tensor(1), [tensor(2)]]
    """
    if not _CONVERT_BY_TYPE:
        load()
    return _convert(data)


def _convert(data: Any) -> Any:
    handler = _CONVERT_BY_TYPE.get(type(data))
    if handler is None:
        handler = _convert_handler(data)
    return handler(data)


def _convert_handler(data: Any) -> _Converter:
    """Find the converter for *data* in torch's order."""
    data_type = type(data)
    if isinstance(data, torch.Tensor):
        return _unchanged
    if data_type.__module__ == "numpy" and data_type.__name__ not in ("str_", "string_"):
        return _convert_numpy
    if isinstance(data, Mapping):
        return _convert_mapping
    if isinstance(data, tuple):
        return _convert_namedtuple if hasattr(data, "_fields") else _convert_list
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return _convert_sequence
    return _unchanged


def _unchanged(data: Any) -> Any:
    return data


def _convert_numpy(data: Any) -> Any:
    if type(data).__name__ == "ndarray" and STR_OBJ_DTYPE.search(data.dtype.str) is not None:
        return data
    return torch.as_tensor(data)


def _convert_dict(data: Any) -> Any:
    return {key: _convert(data[key]) for key in data}


def _convert_mapping(data: Any) -> Any:
    try:
        if isinstance(data, MutableMapping):
            clone = copy.copy(data)
            clone.update(_convert_dict(data))
            return clone
        return type(data)(_convert_dict(data))
    except TypeError:
        return _convert_dict(data)


def _convert_namedtuple(data: Any) -> Any:
    return type(data)(*[_convert(item) for item in data])


def _convert_list(data: Any) -> Any:
    return [_convert(item) for item in data]


def _convert_sequence(data: Any) -> Any:
    try:
        if isinstance(data, MutableSequence):
            clone = copy.copy(data)
            for i, item in enumerate(data):
                clone[i] = _convert(item)
            return clone
        return type(data)([_convert(item) for item in data])
    except TypeError:
        return _convert_list(data)


def load() -> None:
    """Import torch and fill the dispatch table (idempotent)."""
    global torch
    import numpy as np
    import torch

    known = {torch.Tensor, np.ndarray, float, int, bool, str, bytes, *np.sctypeDict.values()}
    convert_by_type: dict[type, _Converter] = {
        cls: _convert_numpy
        for cls in known
        if cls.__module__ == "numpy" and cls.__name__ not in ("str_", "string_")
    }
    convert_by_type.update(
        {
            torch.Tensor: _unchanged,
            float: _unchanged,
            int: _unchanged,
            bool: _unchanged,
            str: _unchanged,
            bytes: _unchanged,
            type(None): _unchanged,
            dict: _convert_dict,
            list: _convert_list,
            tuple: _convert_list,
        }
    )
    _CONVERT_BY_TYPE.update(convert_by_type)
