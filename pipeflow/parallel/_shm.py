"""Moving results between processes: pickle protocol 5 with the large buffers in shared memory.

A worker pickles a result with its numpy arrays (and CPU tensors, viewed as arrays) *out of
band*. When those buffers are large, it writes them with one ``pwritev`` into a new file in
``/dev/shm`` and sends only the small pickle and the file's name; the main process maps the
file, unlinks it at once (so it can't leak), and rebuilds the arrays as views of the mapping:
no copy through the pipe, and no copy on arrival. Small results travel inline.
"""

from __future__ import annotations

import contextlib
import copyreg
import errno
import io
import mmap
import os
import pickle
import sys
import tempfile
from typing import Any

__all__ = [
    "SHM_DIR",
    "decode",
    "discard",
    "discard_all",
    "encode",
    "segment_prefix",
    "sweep",
]

SHM_DIR = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
#: Results whose out-of-band buffers add up to less than this travel inline through the pipe.
INLINE_LIMIT = 64 * 1024
_ALIGN = 64
_ZEROS = bytes(_ALIGN)


def segment_prefix(parent_pid: int, pool_id: int, worker_id: int | None = None) -> str:
    """The file-name prefix of the segments of one pool (and one worker of it)."""
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


# -- tensors as arrays ---------------------------------------------------------------------------
def _rebuild_tensor(array: Any, dtype: str, shape: tuple[int, ...], requires_grad: bool) -> Any:
    import torch

    t = torch.from_numpy(array).view(getattr(torch, dtype.removeprefix("torch."))).reshape(shape)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _reduce_tensor(t: Any) -> Any:
    import torch

    if t.device.type != "cpu" or t.layout != torch.strided or t.is_quantized:
        return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
    flat = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    return _rebuild_tensor, (flat, str(t.dtype), tuple(t.shape), t.requires_grad)


def _dispatch_table() -> dict[Any, Any]:
    table = copyreg.dispatch_table.copy()
    torch = sys.modules.get("torch")
    if torch is not None:
        table[torch.Tensor] = _reduce_tensor
    return table


# -- encode (worker) / decode (main) ---------------------------------------------------------------
def encode(obj: Any, name: str) -> tuple[bytes, list[str], list[Any]]:
    """Pickle *obj*; its large buffers go by shared memory, small ones inline.

    When the out-of-band buffers add up to :data:`INLINE_LIMIT` or more, they are written
    with one ``pwritev`` into a new segment *name*. (That measured faster than making the
    batch straight in a mapped ``/dev/shm`` file, whose pages fault in one by one.)

    Returns:
        ``(data, segments, layout)``: *layout* has one ``(segment index, offset, nbytes)`` per
        buffer, or, with no segments, the buffers themselves.
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = _dispatch_table()
    pickler.dump(obj)
    data = out.getvalue()
    if not buffers:
        return data, [], []
    raws = [b.raw() for b in buffers]
    if sum(r.nbytes for r in raws) < INLINE_LIMIT:
        return data, [], [bytearray(r) for r in raws]  # writable arrays on arrival
    iov: list[Any] = []
    layout: list[tuple[int, int, int]] = []
    offset = 0
    for r in raws:
        pad = -offset % _ALIGN
        if pad:
            iov.append(_ZEROS[:pad])
            offset += pad
        iov.append(r)
        layout.append((0, offset, r.nbytes))
        offset += r.nbytes
    _write_segment(name, iov, offset)
    return data, [name], layout


def _write_segment(name: str, iov: list[Any], total: int) -> None:
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, total)
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
    os.close(fd)


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


def decode(data: bytes, segments: list[str], layout: list[Any]) -> Any:
    """Rebuild what :func:`encode` made; each segment is unlinked as soon as it is mapped."""
    if not segments:
        return pickle.loads(data, buffers=layout)
    views = []
    try:
        for seg in segments:
            path = os.path.join(SHM_DIR, seg)
            fd = os.open(path, os.O_RDWR)
            try:
                mm = mmap.mmap(fd, os.fstat(fd).st_size)
            finally:
                os.close(fd)
                os.unlink(path)
            views.append(memoryview(mm))
    except BaseException:
        discard_all(segments)
        raise
    return pickle.loads(data, buffers=[views[s][o : o + n] for s, o, n in layout])


def discard(segment: str | None) -> None:
    """Unlink a segment whose result will not be decoded."""
    if segment is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, segment))


def discard_all(segments: list[str]) -> None:
    """Unlink every segment of a result that will not be decoded."""
    for seg in segments:
        discard(seg)
