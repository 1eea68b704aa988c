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
import io
import mmap
import os
import pickle
import sys
import tempfile
from typing import Any

__all__ = ["SHM_DIR", "decode", "discard", "encode", "segment_prefix", "sweep"]

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
def encode(obj: Any, name: str) -> tuple[bytes, str | None, list[Any]]:
    """Pickle *obj*; put its large buffers in the segment *name* (created here) if worth it.

    Returns:
        ``(data, segment, layout)``: with a segment, *layout* lists ``(offset, nbytes)`` of
        each buffer in it; without, *layout* holds the buffers' bytes.
    """
    buffers: list[pickle.PickleBuffer] = []
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=5, buffer_callback=buffers.append)
    pickler.dispatch_table = _dispatch_table()
    pickler.dump(obj)
    data = out.getvalue()
    if not buffers:
        return data, None, []
    raws = [b.raw() for b in buffers]
    total = sum(r.nbytes for r in raws)
    if total < INLINE_LIMIT:
        return data, None, [bytearray(r) for r in raws]  # writable arrays on arrival
    iov: list[Any] = []
    layout: list[tuple[int, int]] = []
    offset = 0
    for r in raws:
        pad = -offset % _ALIGN
        if pad:
            iov.append(_ZEROS[:pad])
            offset += pad
        iov.append(r)
        layout.append((offset, r.nbytes))
        offset += r.nbytes
    path = os.path.join(SHM_DIR, name)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.ftruncate(fd, offset)
        _write_all(fd, iov, offset)
    except BaseException:
        os.close(fd)
        os.unlink(path)
        raise
    os.close(fd)
    return data, name, layout


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


def decode(data: bytes, segment: str | None, layout: list[Any]) -> Any:
    """Rebuild what :func:`encode` made; unlinks the segment as soon as it is mapped."""
    if segment is None:
        return pickle.loads(data, buffers=layout)
    path = os.path.join(SHM_DIR, segment)
    fd = os.open(path, os.O_RDWR)
    try:
        size = os.fstat(fd).st_size
        flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
        mm = mmap.mmap(fd, size, flags=flags)
    finally:
        os.close(fd)
        os.unlink(path)
    view = memoryview(mm)
    return pickle.loads(data, buffers=[view[o : o + n] for o, n in layout])


def discard(segment: str | None) -> None:
    """Unlink a segment whose result will not be decoded."""
    if segment is not None:
        with contextlib.suppress(OSError):
            os.unlink(os.path.join(SHM_DIR, segment))
