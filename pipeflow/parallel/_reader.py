"""The main process's side of the transport: map segments, rebuild results as views of them,
and hand each kept segment back to its worker once nothing uses it."""

from __future__ import annotations

import collections
import contextlib
import mmap
import os
import pickle
from typing import Any

from pipeflow.parallel import _segments
from pipeflow.parallel._segments import Segment

__all__ = ["Reader"]


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

    def decode(self, wid: int, data: bytes, segment: Segment | None, layout: list[Any]) -> Any:
        """Rebuild what :meth:`Writer.encode` made in worker *wid*."""
        if segment is None:
            return pickle.loads(data, buffers=layout)
        base = self._map(wid, segment)
        if segment[1] >= 0:
            import numpy as np

            base = np.asarray(_Lease(base, (wid, segment[1]), self.freed.append))
        return pickle.loads(data, buffers=[base[o : o + n] for o, n in layout])

    def _map(self, wid: int, segment: Segment) -> Any:
        name, seg_id, capacity = segment
        if name is None:
            return self.maps[wid, seg_id]
        path = os.path.join(_segments.SHM_DIR, name)
        fd = os.open(path, os.O_RDWR)
        try:
            mm = mmap.mmap(fd, capacity)
        finally:
            os.close(fd)
            os.unlink(path)
        import numpy as np

        base = np.frombuffer(mm, dtype=np.uint8)
        if seg_id >= 0:
            self.maps[wid, seg_id] = base
        return base

    def discard(self, wid: int, segment: Segment | None) -> None:
        """A result that will not be decoded: its segment goes back (or away) unread."""
        if segment is None:
            return
        name, seg_id, _ = segment
        if seg_id < 0:
            _segments.discard(name)
            return
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
            self.pending.setdefault(w, []).append(seg_id)
        return self.pending.pop(wid, None)

    def close(self) -> None:
        self.maps.clear()
        self.freed.clear()
        self.pending.clear()
