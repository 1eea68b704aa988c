"""Where a collate makes its batch: recycled memory, or the memory the batch will travel in.

A process worker's task thread installs its shared-memory writer here
(:func:`install`); a collate that asks :func:`empty` for its output array there gets pages of
a segment that goes to the main process as it is, with no copy. Everywhere else (the main
process, thread workers), a batch of at least :data:`RECYCLE_MIN` bytes gets a buffer that an
earlier batch gave back (:class:`Recycler`), and a smaller one ``numpy.empty``. This module
is on the ground floor: collate needs it, and it needs nothing of the parallel package.

Why recycle: a fresh buffer of a large batch is pages the kernel must find and zero as the
collate first writes them, and glibc gives a large free buffer back to the kernel (a thread's
arena deletes a heap that a freed batch left empty; a buffer over the mmap threshold is
unmapped). Batches of 32 samples of 602 KB (19 MB) collated in 2 worker threads spent from 2
to 56 ms a batch in the collate, by whether its pages were fresh; a buffer that is written
again costs the copy alone. A buffer goes back when the last array or tensor that views it
is gone, never sooner.
"""

from __future__ import annotations

import math
import os
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["RECYCLE_MIN", "Recycler", "empty", "install", "uninstall"]

#: Batches of at least this many bytes get recycled buffers (smaller ones: ``numpy.empty``,
#: whose memory glibc keeps in its heap).
RECYCLE_MIN = 1 << 20

Allocator = Callable[[tuple[int, ...], Any], Any]

_ACTIVE: list[Any] = [None, None, None]  # [pid, thread id, allocator]


def empty(shape: tuple[int, ...], dtype: Any) -> Any:
    """An uninitialised C-contiguous array, as ``numpy.empty`` gives: in the thread that
    installed an allocator, that allocator's; else, for :data:`RECYCLE_MIN` bytes or more,
    a recycled buffer (:data:`RECYCLED`); else ``numpy.empty``'s."""
    pid, thread, allocate = _ACTIVE
    if allocate is not None and pid == os.getpid() and thread == threading.get_ident():
        return allocate(shape, dtype)
    return RECYCLED.empty(shape, dtype)


class _Lease:
    """The base of an array :meth:`Recycler.empty` hands out: when the last array or tensor
    that views it is gone, its buffer goes back to the recycler."""

    __slots__ = ("__array_interface__", "_back", "_buffer")

    def __init__(self, buffer: Any, nbytes: int, back: Callable[[Any], None]) -> None:
        self.__array_interface__ = buffer[:nbytes].__array_interface__
        self._buffer = buffer
        self._back = back

    def __del__(self) -> None:
        # no contextlib here: at interpreter exit a module's globals may be gone already
        try:  # noqa: SIM105
            self._back(self._buffer)
        except Exception:
            pass


class Recycler:
    """Large buffers that batches gave back, for the next batches of about the same size.

    At most *keep* buffers adding up to at most *keep_bytes* wait for reuse; a buffer given
    back beyond that is freed. A buffer serves a request of its size or up to a quarter
    smaller (sizes are rounded up, within ~6 %, so that batches of nearby sizes share).
    Thread-safe: a batch may be collated in one thread and dropped in another.

    Examples:
        >>> r = Recycler()
        >>> a = r.empty((4, 1 << 18), "float32")  # 4 MiB
        >>> a.shape, a.dtype, a.flags.c_contiguous, r.waiting()
        ((4, 262144), dtype('float32'), True, 0)
        >>> address = a.ctypes.data
        >>> del a  # the last view gone: the buffer waits for the next batch
        >>> r.waiting()
        1
        >>> b = r.empty((4, 1 << 18), "float32")
        >>> b.ctypes.data == address, r.waiting()
        (True, 0)
    """

    def __init__(
        self, keep: int = 4, keep_bytes: int = 256 << 20, least: int = RECYCLE_MIN
    ) -> None:
        self.keep = keep
        self.keep_bytes = keep_bytes
        self.least = least
        self._free: list[Any] = []  # uint8 buffers, the most recently given back last
        self._lock = threading.Lock()

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """An uninitialised C-contiguous array of *shape* and *dtype*: in a buffer given back
        by an earlier batch if one fits, else in a new one (``numpy.empty`` below *least*
        bytes)."""
        import numpy as np

        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes < self.least or dtype.hasobject:
            return np.empty(shape, dtype)
        buffer = self._take(nbytes)
        if buffer is None:
            buffer = np.empty(_rounded(nbytes), np.uint8)
        lease = _Lease(buffer, nbytes, self._give_back)
        return np.asarray(lease).view(dtype).reshape(shape)

    def waiting(self) -> int:
        """How many buffers wait for reuse."""
        return len(self._free)

    def trim(self) -> None:
        """Free every buffer that waits for reuse."""
        with self._lock:
            self._free.clear()

    def _take(self, nbytes: int) -> Any:
        with self._lock:
            for i in range(len(self._free) - 1, -1, -1):
                if nbytes <= self._free[i].nbytes <= nbytes + nbytes // 4:
                    return self._free.pop(i)
        return None

    def _give_back(self, buffer: Any) -> None:
        with self._lock:
            free = self._free
            free.append(buffer)
            total = sum(b.nbytes for b in free)
            while free and (len(free) > self.keep or total > self.keep_bytes):
                total -= free.pop(0).nbytes  # the oldest first


def _rounded(nbytes: int) -> int:
    """*nbytes* rounded up to a multiple of 1/16 of its power of two (at most ~6 % more).

    Examples:
        >>> _rounded(19267584), _rounded(1 << 20)
        (19922944, 1048576)
    """
    step = 1 << max(12, nbytes.bit_length() - 5)
    return -(-nbytes // step) * step


#: The process's recycler, for every collate outside a process worker's task thread.
RECYCLED = Recycler()


def _after_fork() -> None:
    """A forked child starts with a recycler of its own: the parent's lock may have been
    held by a thread the child does not have, and its waiting buffers are the parent's."""
    RECYCLED._lock = threading.Lock()
    RECYCLED._free = []


os.register_at_fork(after_in_child=_after_fork)


def install(allocate: Allocator) -> None:
    """Make :func:`empty` use *allocate* in this thread of this process."""
    _ACTIVE[:] = [os.getpid(), threading.get_ident(), allocate]


def uninstall(allocate: Allocator) -> None:
    """Undo :func:`install`, if *allocate* is still the one installed."""
    if _ACTIVE[2] == allocate:
        _ACTIVE[:] = [None, None, None]
