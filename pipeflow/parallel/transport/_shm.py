"""The shared-memory transport: a result's way from a worker process to the main process.

The worker's side, :class:`Writer`, pickles a result with its large buffers (numpy arrays,
CPU tensors viewed as arrays) in a shared-memory segment (:mod:`._segments` makes the files);
the main process's side, :class:`Reader`, maps the segment, rebuilds the result as views of
it, and hands each kept segment back to its worker once nothing uses it.

Segments are *recycled*: the worker keeps each one (its file already unlinked by the main
process, which keeps its mapping) and, once the main process reports that nothing there uses
it any more, writes a later result into the same pages.
"""

from __future__ import annotations

import collections
import contextlib
import copyreg
import errno
import io
import math
import mmap
import os
import pickle
import sys
from typing import Any

from pipeflow.parallel.transport import _segments
from pipeflow.parallel.transport._segments import (
    ALIGN,
    INLINE_LIMIT,
    Segment,
    capacity,
    write_segment,
)
from pipeflow.stages import _alloc

__all__ = ["Reader", "Writer"]

_ZEROS = bytes(ALIGN)


def _rebuild_tensor(array: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    t = torch.from_numpy(array).view(getattr(torch, dtype.removeprefix("torch."))).reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_tensor(t: Any) -> Any:
    import torch

    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized or t.is_nested:
        # a nested tensor's layout reads as strided, but it has no flat buffer to reshape
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return _rebuild_tensor, (flat, str(t.dtype), tuple(t.shape), t.requires_grad)


def _dispatch_table() -> dict[Any, Any]:
    table = copyreg.dispatch_table.copy()
    torch = sys.modules.get("torch")
    if torch is not None:
        table[torch.Tensor] = _reduce_tensor
    return table


# -- the worker's side ------------------------------------------------------------------------
class Writer:
    """A worker's side: pickles results, writing large buffers into shared-memory segments.

    Segments are *recycled*: the worker keeps each one (its file already unlinked by the main
    process, which keeps its mapping) and, once the main process reports that nothing there
    uses it any more, writes the next result into the same pages. Writing into pages that
    exist is a plain copy; a fresh segment makes the kernel allocate and zero every page,
    which costs more than the copy itself. At most *keep* segments are kept, adding up to at
    most *keep_bytes*; beyond that a segment is used once and dropped, as when the consumer
    holds on to many batches. A kept pool's workers drop all of them when a pass ends
    (:meth:`trim`).
    """

    def __init__(self, prefix: str, keep: int = 16, keep_bytes: int | None = None) -> None:
        self.prefix = prefix
        self.keep = keep
        #: kept segments may add up to this many bytes (default: see ``_segments.keep_budget``)
        self.keep_bytes = _segments.keep_budget(1) if keep_bytes is None else keep_bytes
        self.count = 0
        self.fds: dict[int, int] = {}  # kept segments: id -> fd
        self.sizes: dict[int, int] = {}
        self.maps: dict[int, mmap.mmap] = {}  # the worker's own mapping, made on first reuse
        self.free: set[int] = set()
        self.retired: list[int] = []  # dropped, not told to the main process yet
        self.reserved: int | None = None  # the segment `empty` hands out memory from
        self.cursor = 0  # bytes of it handed out

    def activate(self) -> None:
        """Make :func:`pipeflow.stages._alloc.empty` hand out this writer's memory, in this
        thread."""
        _alloc.install(self.empty)

    def empty(self, shape: tuple[int, ...], dtype: Any) -> Any:
        """A new array for this task's result, in a free kept segment when one has room.

        A collate stacks into it, so the batch is made where it travels: no copy at
        :meth:`encode`, and pages that are already there. Otherwise ``numpy.empty``.
        """
        import numpy as np

        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if self.reserved is None and nbytes >= INLINE_LIMIT:
            self.reserved = self._reusable(nbytes)
            self.cursor = 0
        start = self.cursor + (-self.cursor % ALIGN)
        if self.reserved is None or start + nbytes > self.sizes[self.reserved]:
            return np.empty(shape, dtype)
        self.cursor = start + nbytes
        mm = self._mapping(self.reserved)
        return np.frombuffer(mm, np.uint8, nbytes, start).view(dtype).reshape(shape)

    def unreserve(self) -> None:
        """Give back the segment `empty` took, unless a result went out in it."""
        if self.reserved is not None:
            self.free.add(self.reserved)
            self.reserved = None

    def release(self, ids: list[int]) -> None:
        """The main process is done with these segments: they may be written again."""
        self.free.update(i for i in ids if i in self.fds)

    def encode(self, obj: Any) -> tuple[bytes, Segment | None, list[Any], list[int], bool]:
        """Pickle *obj*; its large buffers go by shared memory, small ones inline.

        Returns:
            ``(data, segment, layout, retired, piped)``: *layout* has one ``(offset, nbytes)``
            per buffer, or, with no segment, the buffers themselves; *retired* names kept
            segments the worker dropped (the main process drops its mapping of them);
            *piped*: large buffers that go through the pipe, because ``/dev/shm`` is full.
        """
        buffers: list[pickle.PickleBuffer] = []
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
        pickler.dispatch_table = _dispatch_table()
        pickler.dump(obj)
        data = out.getvalue()
        if not buffers:
            return data, None, [], self._told(), False
        raws = [b.raw() for b in buffers]
        if sum(r.nbytes for r in raws) < INLINE_LIMIT:
            inline = [bytearray(r) for r in raws]  # writable on arrival
            return data, None, inline, self._told(), False
        if self.reserved is not None:
            placed = self._place(raws)
            if placed is not None:
                used, self.reserved = self.reserved, None
                return data, Segment(None, used, self.sizes[used]), placed, self._told(), False
            self.unreserve()
        try:
            segment, layout = self._in_segment(raws)
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            # /dev/shm is full: this result goes through the pipe, and the free kept
            # segments go back (once the main process reads that, the next ones may fit)
            while self.free:
                self._drop_free()
            return data, None, [bytearray(r) for r in raws], self._told(), True
        return data, segment, layout, self._told(), False

    def _in_segment(self, raws: list[memoryview]) -> tuple[Segment, list[tuple[int, int]]]:
        """Write *raws* into a free kept segment that fits, else a new one; its layout."""
        iov: list[Any] = []
        layout: list[tuple[int, int]] = []
        offset = 0
        for r in raws:
            pad = -offset % ALIGN
            if pad:
                iov.append(_ZEROS[:pad])
                offset += pad
            iov.append(r)
            layout.append((offset, r.nbytes))
            offset += r.nbytes
        reuse = self._reusable(offset)
        if reuse is not None:
            self._copy_into(reuse, iov)
            return Segment(None, reuse, self.sizes[reuse]), layout
        return self._new_segment(iov, offset, capacity(offset)), layout

    def _new_segment(self, iov: list[Any], total: int, size: int) -> Segment:
        """A new segment of *size* bytes holding *iov*: kept while the worker's budget (by
        count and by bytes) has room, else used once."""
        name = f"{self.prefix}{self.count}"
        room = len(self.fds) < self.keep and sum(self.sizes.values()) + size <= self.keep_bytes
        seg_id = self.count if room else -1
        self.count += 1
        fd = write_segment(name, iov, total, size)
        if seg_id < 0:
            os.close(fd)
        else:
            self.fds[seg_id], self.sizes[seg_id] = fd, size
        return Segment(name, seg_id, size)

    def trim(self) -> None:
        """The pass ended: drop every kept segment (the main process dropped its mappings),
        so that nothing of this worker stays in ``/dev/shm`` between passes."""
        for seg_id in list(self.fds):
            self._drop(seg_id)
        self.free.clear()
        self.retired.clear()
        self.reserved = None

    def _told(self) -> list[int]:
        """The dropped segments, to tell the main process with this result."""
        out, self.retired = self.retired, []
        return out

    def _reusable(self, total: int) -> int | None:
        """The smallest free kept segment that fits *total* bytes (taken off the free set).

        When none fits, free ones are dropped (the smallest first) to make room for a new
        kept one: one when no more may be kept by count, as many as it takes by bytes.
        """
        fits = [i for i in self.free if self.sizes[i] >= total]
        if fits:
            best = min(fits, key=self.sizes.__getitem__)
            self.free.discard(best)
            return best
        need = capacity(total)
        if self.free and len(self.fds) >= self.keep:
            self._drop_free()
        if need <= self.keep_bytes:
            while self.free and sum(self.sizes.values()) + need > self.keep_bytes:
                self._drop_free()
        return None

    def _drop_free(self) -> None:
        """Drop the smallest free kept segment (the main process is told with the next
        result)."""
        drop = min(self.free, key=self.sizes.__getitem__)
        self.free.discard(drop)
        self._drop(drop)
        self.retired.append(drop)

    def _place(self, raws: list[memoryview]) -> list[tuple[int, int]] | None:
        """The layout of *raws* in the reserved segment: buffers `empty` made there stay put,
        the others are copied after them. None when they don't all fit."""
        import numpy as np

        seg_id = self.reserved
        assert seg_id is not None
        mm = self._mapping(seg_id)
        base = np.frombuffer(mm, np.uint8)
        lo = base.ctypes.data
        layout: list[tuple[int, int]] = []
        copies: list[tuple[int, memoryview]] = []
        end = self.cursor
        for r in raws:
            addr = np.frombuffer(r, np.uint8).ctypes.data if r.nbytes else 0
            if lo <= addr and addr + r.nbytes <= lo + self.cursor:
                layout.append((addr - lo, r.nbytes))
                continue
            start = end + (-end % ALIGN)
            end = start + r.nbytes
            if end > self.sizes[seg_id]:
                return None
            layout.append((start, r.nbytes))
            copies.append((start, r))
        for start, r in copies:
            mm[start : start + r.nbytes] = r
        return layout

    def _mapping(self, seg_id: int) -> mmap.mmap:
        """The worker's mapping of a kept segment, populated at once: one call instead of a
        fault per page."""
        mm = self.maps.get(seg_id)
        if mm is None:
            flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
            mm = self.maps[seg_id] = mmap.mmap(self.fds[seg_id], self.sizes[seg_id], flags=flags)
        return mm

    def _copy_into(self, seg_id: int, iov: list[Any]) -> None:
        mm = self._mapping(seg_id)
        pos = 0
        for chunk in iov:
            view = memoryview(chunk).cast("B")
            mm[pos : pos + view.nbytes] = view
            pos += view.nbytes

    def _drop(self, seg_id: int) -> None:
        mm = self.maps.pop(seg_id, None)
        if mm is not None:
            with contextlib.suppress(BufferError):  # an array of the user's still uses it
                mm.close()
        os.close(self.fds.pop(seg_id))
        del self.sizes[seg_id]

    def close(self) -> None:
        _alloc.uninstall(self.empty)
        for seg_id in list(self.fds):
            self._drop(seg_id)
        self.free.clear()


# -- the main process's side ------------------------------------------------------------------
class _Lease:
    """The base of every array rebuilt from one result's segment: when the last of them is
    gone, the segment goes back to its worker."""

    __slots__ = ("__array_interface__", "_done", "_key", "_map")

    def __init__(self, base: Any, key: tuple[int, int], done: Any) -> None:
        self.__array_interface__ = base.__array_interface__
        self._map = base  # keeps the mapping alive while any view of it lives
        self._key = key
        self._done = done

    def __del__(self) -> None:
        self._done(self._key)


class Reader:
    """The main process's side: maps segments, rebuilds results as views of them, and hands
    each kept segment back to its worker once nothing uses it (see :class:`Writer`)."""

    def __init__(self) -> None:
        self.maps: dict[tuple[int, int], Any] = {}  # (worker, seg_id) -> uint8 array over it
        self.freed: collections.deque[tuple[int, int]] = collections.deque()  # any thread
        self.pending: dict[int, list[int]] = {}  # freed, not told to their worker yet
        self.gone: set[int] = set()  # workers (their keys) that died: nothing goes back
        self.closed = False

    def decode(self, wid: int, data: bytes, segment: Segment | None, layout: list[Any]) -> Any:
        """Rebuild what :meth:`Writer.encode` made in worker *wid*."""
        if segment is None:
            return pickle.loads(data, buffers=layout)
        base = self._map(wid, segment)
        if segment.seg_id >= 0:
            import numpy as np

            base = np.asarray(_Lease(base, (wid, segment.seg_id), self.freed.append))
        return pickle.loads(data, buffers=[base[o : o + n] for o, n in layout])

    def _map(self, wid: int, segment: Segment) -> Any:
        name, seg_id, capacity = segment
        if name is None:
            return self.maps[wid, seg_id]
        base = _segments.map_shared(name, capacity)
        if seg_id >= 0:
            self.maps[wid, seg_id] = base
        return base

    def discard(self, wid: int, segment: Segment | None) -> None:
        """A result that will not be decoded: its segment goes back (or away) unread.

        Safe at any time: after :meth:`close` (a generator finalised at interpreter exit,
        after the pool was closed), after :meth:`trim` or :meth:`forget`, a segment the
        worker will not use again is only unlinked.
        """
        if segment is None:
            return
        name, seg_id, _ = segment
        if seg_id < 0 or self.closed or wid in self.gone:
            _segments.discard(name)
            return
        if name is None and (wid, seg_id) not in self.maps:
            return  # mapped before a trim: the worker dropped it too
        with contextlib.suppress(OSError):
            self._map(wid, segment)
        self.freed.append((wid, seg_id))

    def retire(self, wid: int, ids: list[int]) -> None:
        """The worker dropped these kept segments."""
        for seg_id in ids:
            self.maps.pop((wid, seg_id), None)

    def take_freed(self, wid: int) -> list[int] | None:
        """The segments of worker *wid* no longer used here, to tell it (None: none)."""
        while self.freed:  # leases die in any thread: sort what they left by worker
            w, seg_id = self.freed.popleft()
            if w not in self.gone:
                self.pending.setdefault(w, []).append(seg_id)
        return self.pending.pop(wid, None)

    def trim(self) -> None:
        """The pass ended and every worker drops its kept segments: drop the mappings too
        (a result still in use keeps its own), so that ``/dev/shm`` holds nothing of the
        pool's between passes but what the consumer still holds."""
        self.maps.clear()
        self.pending.clear()

    def forget(self, wid: int) -> None:
        """Worker *wid* (a key never used again) died: drop its mappings; segments its
        results still use are not handed to anyone when they are freed."""
        self.gone.add(wid)
        self.pending.pop(wid, None)
        for key in [k for k in self.maps if k[0] == wid]:
            del self.maps[key]

    def close(self) -> None:
        self.closed = True
        self.maps.clear()
        self.freed.clear()
        self.pending.clear()
