"""Writing tar shards for the tar tests, and reading them back as references.

Writers: :mod:`tarfile` in each of its formats, webdataset's ``TarWriter``, GNU tar. References:
webdataset's own reader (its ``tariterators``), and :func:`layout`, where each member's records
lie in the file (so a test knows which samples a damage at a byte leaves complete).
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from typing import Any, NamedTuple

import pipeflow as pf

#: tarfile's formats by name.
FORMATS = {"ustar": tarfile.USTAR_FORMAT, "pax": tarfile.PAX_FORMAT, "gnu": tarfile.GNU_FORMAT}
#: GNU tar, or ``None`` where it is not installed.
TAR = shutil.which("tar")

#: A shard's members as written: ``(name, data)``; ``data`` ``None`` makes a directory.
Members = Sequence[tuple[str, bytes | None]]


def write_tarfile(path: str, members: Members, fmt: str) -> None:
    """*members* in order, by :mod:`tarfile` in the format *fmt* (``ustar``, ``pax``, ``gnu``)."""
    with tarfile.open(path, "w", format=FORMATS[fmt]) as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.mtime = 1_700_000_000
            if data is None:
                info.type, info.mode = tarfile.DIRTYPE, 0o755
                tar.addfile(info)
            else:
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_webdataset(path: str, samples: Sequence[tuple[str, dict[str, bytes]]]) -> None:
    """``(key, {extension: data})`` samples, by webdataset's ``TarWriter`` (pax headers)."""
    import webdataset as wds  # type: ignore[import-untyped]

    with wds.TarWriter(path, encoder=False) as writer:
        for key, fields in samples:
            writer.write({"__key__": key, **fields})


def write_gnu_tar(path: str, members: Members, fmt: str, folder: str) -> None:
    """*members* as files under *folder*, archived by GNU tar ``--format=fmt`` (``gnu``,
    ``posix``, ``ustar``) in their order; a directory goes in as its own entry."""
    for name, data in members:
        full = os.path.join(folder, name)
        if data is None:
            os.makedirs(full, exist_ok=True)
            continue
        os.makedirs(os.path.dirname(full) or folder, exist_ok=True)
        with open(full, "wb") as f:
            f.write(data)
    names = [name for name, _ in members]
    command = [TAR or "tar", f"--format={fmt}", "--no-recursion", "-cf", path, "-C", folder]
    subprocess.run([*command, "--", *names], check=True, capture_output=True)


def webdataset_samples(path: str) -> list[dict[str, Any]]:
    """The shard's samples as webdataset's reader gives them (raises where it raises)."""
    from webdataset import tariterators as ti
    from webdataset.handlers import reraise_exception  # type: ignore[import-untyped]

    opened = ti.url_opener([{"url": path}], handler=reraise_exception)
    files = ti.tar_file_expander(opened, handler=reraise_exception)
    out = []
    for sample in ti.group_by_keys(files, handler=reraise_exception):
        sample.pop("__local_path__", None)
        out.append(sample)
    return out


def pipeflow_items(paths: Sequence[str], **read: Any) -> list[Any]:
    """What ``pf.shards(paths, shuffle=False) | pf.read_tar(decode=False)`` yields: samples
    and, in a failed item's place, its exception."""
    return drain(iter(pf.shards(list(paths), shuffle=False) | pf.read_tar(decode=False, **read)))


def drain(it: Any, count: int | None = None) -> list[Any]:
    """The next *count* items of *it* (all of them: ``None``), a failed one as its exception."""
    out: list[Any] = []
    while count is None or len(out) < count:
        try:
            out.append(next(it))
        except StopIteration:
            break
        except Exception as e:
            out.append(e)
    return out


class Span(NamedTuple):
    """Where a member lies in a tar file: its first record (a pax or GNU long-name record,
    or its header), its header blocks (the records' and its own), and the end of its data
    (padded to a block)."""

    name: str
    first: int
    headers: tuple[int, ...]
    end: int


def layout(path: str) -> tuple[list[Span], int]:
    """The members of a well-formed tar file in order, and the offset of its end-of-archive
    block; names as :mod:`tarfile` reads them, places by walking the blocks."""
    with open(path, "rb") as f:
        data = f.read()
    with tarfile.open(path) as tar:
        names = {m.offset_data: m.name for m in tar.getmembers()}
    spans, pos = [], 0
    while data[pos : pos + 512] != bytes(512):
        first, headers = pos, []
        while True:
            block = data[pos : pos + 512]
            kind, size = block[156:157], tarfile.nti(block[124:136])  # type: ignore[attr-defined]
            headers.append(pos)
            pos += 512
            extended = kind in (b"x", b"g", b"L", b"K")
            if extended or kind in tarfile.REGULAR_TYPES or kind not in tarfile.SUPPORTED_TYPES:
                pos += -(-size // 512) * 512
            if not extended:
                break
        spans.append(Span(names[headers[-1] + 512], first, tuple(headers), pos))
    return spans, pos
