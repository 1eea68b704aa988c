"""Digests that bind a state's parts to their stage, their pipeline and their moment.

A record says where a stage stood (the shard and byte a reader stopped at, the inputs a
filter's outputs took): only the stage that wrote it can tell whether it is honest, and
often not even that stage (an ``offset`` one sample later is as well-formed as the true one,
and silently drops a sample). So :func:`pipeflow.state.take` writes, beside the records, a
digest of each, keyed by the pipeline's identity, the epoch and the position it was taken at;
the validator (:mod:`pipeflow.resume._check`) checks every field it can read with words of
its own first, then the digests: a record changed after ``state_dict()`` gave it, or moved
from another state (another pipeline, epoch or position), is refused by name, before
anything is applied.

What a state holds by itself and no record depends on stays free: a pipeline that keeps no
records resumes at any ``position`` a user writes in (a jump deep into an epoch).

The digest reads values as a state's round trip through JSON, pickle or ``torch.save``
leaves them (tuples as lists, keys as strings, numpy scalars as numbers), so an honest
state always matches; the content of an object it cannot read (a user's class) is not
bound, only its type.

Examples:
    >>> a = digest({"inputs": 3}, ["indices(10)", "filter(f)"], 0, 2)
    >>> a == digest({"inputs": 3}, ("indices(10)", "filter(f)"), 0, 2)
    True
    >>> a == digest({"inputs": 4}, ["indices(10)", "filter(f)"], 0, 2)
    False
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Mapping, Sequence, Set
from typing import Any

__all__ = ["digest"]

_SIZE = 10  # bytes: 20 hex digits


def digest(*parts: Any) -> str:
    """A short hex digest of *parts*, the same for any honest round trip of them."""
    h = hashlib.blake2b(digest_size=_SIZE)
    for part in parts:
        _feed(h, part)
    return h.hexdigest()


def _feed(h: Any, value: Any) -> None:
    """Feed *value*'s canonical form to the hash *h* (tagged, length-prefixed)."""
    if value is None or isinstance(value, bool):
        h.update(b"N" if value is None else b"T" if value else b"F")
    elif isinstance(value, int):
        h.update(b"i%d;" % value)
    elif isinstance(value, float):
        h.update(b"f" + struct.pack("<d", value))
    elif isinstance(value, str):
        _block(h, b"s", value.encode("utf-8", "surrogatepass"))
    elif isinstance(value, (bytes, bytearray, memoryview)):
        _block(h, b"b", bytes(value))
    elif isinstance(value, Mapping):
        items = sorted((str(k), v) for k, v in value.items())
        h.update(b"{%d;" % len(items))
        for key, item in items:
            _block(h, b"k", key.encode("utf-8", "surrogatepass"))
            _feed(h, item)
    elif isinstance(value, Set):
        parts = sorted(digest(x) for x in value)
        h.update(b"<%d;" % len(parts))
        for part in parts:
            h.update(part.encode("ascii"))
    elif isinstance(value, Sequence):
        if all(type(x) is int for x in value):  # the common case, in one join (same bytes)
            h.update(b"[%d;" % len(value) + b"".join([b"i%d;" % x for x in value]))
            return
        h.update(b"[%d;" % len(value))
        for item in value:
            _feed(h, item)
    else:
        _feed_array(h, value)


def _feed_array(h: Any, value: Any) -> None:
    """A numpy array or scalar, a torch tensor: by dtype, shape and bytes; anything else by
    its type's name (its content is not read)."""
    module = type(value).__module__.partition(".")[0]
    if module == "numpy":
        import numpy as np

        if isinstance(value, np.generic):
            _feed(h, value.item())
            return
        if isinstance(value, np.ndarray) and value.dtype != object:
            _block(h, b"a" + value.dtype.str.encode() + repr(value.shape).encode(), value.tobytes())
            return
        if isinstance(value, np.ndarray):
            _feed(h, value.tolist())
            return
    if module == "torch" and hasattr(value, "detach"):
        import torch  # already imported: *value* is one of its tensors

        flat = value.detach().cpu().contiguous().reshape(-1)
        shape = str(value.dtype).encode() + repr(tuple(value.shape)).encode()
        _block(h, b"t" + shape, flat.view(torch.uint8).numpy().tobytes())
        return
    cls = type(value)
    _block(h, b"o", f"{cls.__module__}.{cls.__qualname__}".encode())


def _block(h: Any, tag: bytes, data: bytes) -> None:
    h.update(tag + b"%d:" % len(data))
    h.update(data)
