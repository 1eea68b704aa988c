"""A result's way back from a Ray actor: pickled by the actor, its large buffers out of band,
so that they travel in Ray's object store and are read there without a copy.

The actor pickles each result itself (:func:`pack`), as a process worker does (with the same
reductions: a CPU tensor travels as the bytes of its storage, a numpy-only collate's batch as
arrays that become tensors on arrival). Its out-of-band buffers are handed to Ray as numpy
arrays, which Ray stores in its shared-memory object store as they are; the main process
rebuilds the result over them (:func:`unpack`): a 19 MB batch is mapped, not copied.
Small results (buffers under :data:`SMALL`, which Ray sends inline in its reply anyway) are
copied, as that costs less than a buffer of their own.

An array read from the object store is read-only in numpy's eyes; the reply's object belongs
to the main process alone (made for it, read once, freed when its last view goes), so the
result is rebuilt over writable views of it: what arrives behaves as a process worker's result
does (arrays and tensors that may be written into), and torch, which has no read-only tensors,
gets no read-only array.

Pickling per result, in the actor, also keeps a result that can't be pickled to its own
item: the item fails (its note says the result could not be sent back), and the other items
of the call go on.
"""

from __future__ import annotations

import io
import pickle
from typing import Any, NamedTuple

from pipeflow.parallel.transport._shm import _dispatch_table

__all__ = ["SMALL", "Packed", "pack", "unpack"]

#: Out-of-band buffers that add up to less than this are copied into the reply (Ray sends a
#: reply under 100 KiB inline: its ``max_direct_call_object_size``).
SMALL = 100 * 1024


class Packed(NamedTuple):
    """A result as it travels: its pickle, and its buffers (numpy ``uint8`` arrays, which
    Ray stores out of band, or ``bytearray`` copies of small ones)."""

    data: bytes
    buffers: list[Any]


def pack(value: Any) -> Packed:
    """*value* pickled with its buffers out of band (raises what pickling raises).

    Examples:
        >>> import numpy as np
        >>> packed = pack({"x": np.arange(3)})
        >>> type(packed.buffers[0]).__name__, unpack(packed)
        ('bytearray', {'x': array([0, 1, 2])})
    """
    import numpy as np

    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = _dispatch_table()
    pickler.dump(value)
    raws = [b.raw() for b in buffers]
    if sum(r.nbytes for r in raws) < SMALL:
        return Packed(out.getvalue(), [bytearray(r) for r in raws])
    return Packed(out.getvalue(), [np.frombuffer(r, np.uint8) for r in raws])


def unpack(packed: Packed) -> Any:
    """The result :func:`pack` made, rebuilt over its buffers where they arrived."""
    return pickle.loads(packed.data, buffers=[_writable(b) for b in packed.buffers])


class _Writable:
    """A read-only array's memory, exposed writable (see the module's text); it keeps the
    array, and so Ray's buffer, alive while any view of it lives."""

    __slots__ = ("__array_interface__", "_array")

    def __init__(self, array: Any) -> None:
        interface = dict(array.__array_interface__)
        interface["data"] = (interface["data"][0], False)
        self.__array_interface__ = interface
        self._array = array


def _writable(buffer: Any) -> Any:
    if isinstance(buffer, bytearray) or buffer.flags.writeable:
        return buffer
    import numpy as np

    return np.asarray(_Writable(buffer))
