"""Shared-memory segments: the files in ``/dev/shm`` that results travel in.

A worker pickles a result with its numpy arrays (and CPU tensors, viewed as arrays) *out of
band*. When those buffers are large, it writes them into a segment and sends only the small
pickle and the segment's name (:class:`~pipeflow.parallel.transport._shm.Writer`); the main
process maps the file, unlinks it at once (so it can't leak), and rebuilds the arrays as
views of the mapping (:class:`~pipeflow.parallel.transport._shm.Reader`): no copy through
the pipe, and no copy on arrival. Small results travel inline. Segments are recycled (see
:class:`~pipeflow.parallel.transport._shm.Writer`). This module names, creates, sizes and
removes the files.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import functools
import mmap
import os
import tempfile
import weakref
from collections.abc import Iterator
from typing import Any, NamedTuple

__all__ = [
    "ALIGN",
    "INLINE_LIMIT",
    "KEEP_SHARE",
    "SHM_DIR",
    "Segment",
    "capacity",
    "discard",
    "keep_budget",
    "map_shared",
    "not_inherited",
    "segment_prefix",
    "sweep",
    "write_segment",
]

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
#: Results whose out-of-band buffers add up to less than this travel inline through the pipe.
INLINE_LIMIT = 64 * 1024
ALIGN = 64
#: What a pool's workers keep for reuse adds up to at most this share of ``/dev/shm``.
KEEP_SHARE = 0.25


class Segment(NamedTuple):
    """Where a result's buffers lie, as a reply describes it.

    Attributes:
        name: the file's name when the segment is new (the main process maps it, then
            unlinks it); ``None`` for a kept segment the main process has mapped already.
        seg_id: the worker's number for a segment it keeps; ``-1`` for one used once.
        capacity: the segment's size in bytes.
    """

    name: str | None
    seg_id: int
    capacity: int


def segment_prefix(parent_pid: int, pool_id: int, worker_id: int | str | None = None) -> str:
    """The file-name prefix of the segments of one pool (and one worker of it: its id, or
    ``"1r1"`` for the worker that took dead worker 1's place)."""
    prefix = f"pipeflow-{parent_pid}-{pool_id}-"
    return prefix if worker_id is None else f"{prefix}{worker_id}-"


def sweep(prefix: str) -> int:
    """Unlink every segment whose name starts with *prefix*; return how many."""
    n = 0
    try:
        names = os.listdir(SHM_DIR)
    except OSError:
        return 0
    for name in names:
        if name.startswith(prefix):
            try:
                os.unlink(os.path.join(SHM_DIR, name))
                n += 1
            except OSError:
                pass
    return n


def keep_budget(workers: int) -> int:
    """How many bytes of segments each of a pool's *workers* may keep for reuse: their
    share of :data:`KEEP_SHARE` of ``/dev/shm``.

    Kept segments make a result's pages cost nothing to make (writing pages that exist is a
    plain copy); the budget keeps them from crowding out the results in flight on a small
    ``/dev/shm`` (a container's 64 MB - 2 GB). A result too large for it travels in a
    segment used once, as torch's batches do. A kept pool gives everything back at the end
    of each pass.

    Examples:
        >>> import os
        >>> st = os.statvfs(SHM_DIR)
        >>> keep_budget(2) == int(st.f_blocks * st.f_frsize * KEEP_SHARE) // 2
        True
    """
    try:
        st = os.statvfs(SHM_DIR)
    except OSError:
        return 0
    return int(st.f_blocks * st.f_frsize * KEEP_SHARE) // max(1, workers)


def capacity(total: int) -> int:
    """Round a segment up (to within ~6 %) so that results of nearby sizes can share it."""
    step = max(mmap.PAGESIZE, 1 << max(0, total.bit_length() - 5))
    return -(-total // step) * step


def write_segment(name: str, iov: list[Any], total: int, capacity: int) -> int:
    """Create segment *name* of *capacity* bytes holding *iov*; return its open fd.

    One ``pwritev`` into a new file measured faster than writing through a mapping of it,
    whose pages would fault in one by one.
    """
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        _allocate(fd, capacity)
        _write_all(fd, iov, total)
    except BaseException as e:
        os.close(fd)
        os.unlink(path)
        if isinstance(e, OSError) and e.errno == errno.ENOSPC:
            msg = (
                f"{SHM_DIR} is full: a {total:,}-byte result did not fit; enlarge it (for "
                "Docker: docker run --shm-size=8g) or lower max_in_flight"
            )
            raise OSError(errno.ENOSPC, msg) from e
        raise
    return fd


def _allocate(fd: int, size: int) -> None:
    """Size the file and reserve its pages: a full ``/dev/shm`` fails here, with ENOSPC,
    never later with SIGBUS on a write through a mapping. Where the platform can't reserve
    (no ``posix_fallocate``, as on macOS), only the size is set."""
    allocate = getattr(os, "posix_fallocate", None)
    if allocate is not None:
        try:
            allocate(fd, 0, size)
            return
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise
    os.ftruncate(fd, size)


def _write_all(fd: int, iov: list[Any], total: int) -> None:
    written = os.pwritev(fd, iov, 0) if len(iov) <= 1024 else 0
    if written == total:
        return
    # A short write (or too many buffers for one call): finish buffer by buffer.
    pos = 0
    for chunk in iov:
        view = memoryview(chunk).cast("B")
        end = pos + view.nbytes
        if end <= written:
            pos = end
            continue
        start = max(0, written - pos)
        while start < view.nbytes:
            start += os.pwrite(fd, view[start:], pos + start)
        pos = end
        written = pos


# -- the main process's mappings ---------------------------------------------------------------
#: Every live mapping :func:`map_shared` made: address -> size.
_MAPPED: dict[int, int] = {}
_PROT = mmap.PROT_READ | mmap.PROT_WRITE


@functools.cache
def _libc() -> Any:
    """The C library's ``mmap``, ``munmap`` and ``madvise``, or ``None`` where they can't be
    had (then :func:`map_shared` uses Python's ``mmap``)."""
    if not hasattr(mmap, "MADV_DONTFORK"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.mmap.restype = ctypes.c_void_p
        libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, *[ctypes.c_int] * 3, ctypes.c_long]
        libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
        libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    except (OSError, AttributeError):
        return None
    return libc


def map_shared(name: str, size: int) -> Any:
    """Segment *name* mapped (its first *size* bytes) as a numpy ``uint8`` array, and the
    file unlinked: the mapping alone keeps its pages, until the last view of it goes.

    The mapping keeps no file descriptor (Python's ``mmap`` keeps a copy of one, which every
    later fork inherits: its pages would then live as long as that process), and
    :func:`not_inherited` can keep it out of a worker being forked.
    """
    import numpy as np

    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR)
    try:
        libc = _libc()
        if libc is None:
            return np.frombuffer(mmap.mmap(fd, size), dtype=np.uint8)
        addr = libc.mmap(None, size, _PROT, mmap.MAP_SHARED, fd, 0)
        if addr is None or addr == ctypes.c_void_p(-1).value:
            err = ctypes.get_errno()
            raise OSError(err, os.strerror(err), path)
    finally:
        os.close(fd)
        os.unlink(path)
    memory = (ctypes.c_char * size).from_address(addr)
    _MAPPED[addr] = size
    weakref.finalize(memory, _unmap, libc, addr, size)
    return np.frombuffer(memoryview(memory), dtype=np.uint8)


def _unmap(libc: Any, addr: int, size: int) -> None:
    _MAPPED.pop(addr, None)
    libc.munmap(addr, size)


@contextlib.contextmanager
def not_inherited(method: str) -> Iterator[None]:
    """While a ``fork`` worker starts: the results' mappings are not copied into it.

    Workers start one by one as results arrive (and a dead one's replacement mid-epoch): a
    worker forked while the consumer held a result would otherwise keep that result's pages
    in ``/dev/shm`` for its whole life (a persistent pool's: for good). Other forks (yours,
    another library's) inherit them as usual.
    """
    libc = _libc() if method == "fork" else None
    if libc is None:
        yield
        return
    spans = list(_MAPPED.items())
    for addr, size in spans:
        libc.madvise(addr, size, mmap.MADV_DONTFORK)
    try:
        yield
    finally:
        for addr, size in spans:  # one unmapped meanwhile: madvise fails, harmlessly
            libc.madvise(addr, size, mmap.MADV_DOFORK)


def discard(segment: str | None) -> None:
    """Unlink a segment file whose result will not be decoded."""
    if segment is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, segment))
