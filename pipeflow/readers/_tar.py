"""Tar shards in the WebDataset layout: files grouped into samples by their key.

A sample is the run of consecutive files whose names share a key: the name up to the first
dot of its last part (``images/00042.seg.png`` has key ``images/00042`` and extension
``seg.png``). It becomes a dict keyed by extension, plus ``"__key__"`` and ``"__url__"`` as
WebDataset gives them, and ``"__index__"``, its number in the shard. Files without an
extension, directories and links are passed over (as WebDataset does); GNU long names and
pax ``path`` records are read.

The parser reads headers and data straight from the shard's byte stream, so it knows where
each sample starts: the offset of its first file's header, which a resumed pass seeks to.
A file cut short, or a shard that ends without tar's end-of-archive blocks, is a
:class:`~pipeflow.ShardReadError` naming the offset.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

from pipeflow._failure import Failure
from pipeflow.readers._bytes import ShardReadError, Stream
from pipeflow.readers._decode import decode_sample
from pipeflow.readers._reader import Opened
from pipeflow.shards import Shard

__all__ = ["parse_tar", "split_name"]

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_SPLIT = re.compile(r"^((?:.*/|)[^./]+)\.([^/]*)$")
_FILES = (b"0", b"\0", b"7")


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member's name, as WebDataset splits it (``None``: no
    extension).

    Examples:
        >>> split_name("images/00042.seg.png")
        ('images/00042', 'seg.png')
        >>> split_name("README") is None
        True
    """
    m = _SPLIT.match(name)
    return None if m is None else (m.group(1), m.group(2))


def _octal(field: bytes) -> int:
    if field[:1] and field[0] & 0x80:  # base-256, for sizes of 8 GiB and more
        return int.from_bytes(field[1:], "big")
    text = field.rstrip(b"\0 ").strip()
    return int(text, 8) if text else 0


def _name(header: bytes) -> str:
    name = header[:100].split(b"\0", 1)[0]
    if header[257:262] == b"ustar":
        prefix = header[345:500].split(b"\0", 1)[0]
        if prefix:
            name = prefix + b"/" + name
    return name.decode("utf-8", "surrogateescape")


def _pax_path(data: bytes) -> str | None:
    for line in data.split(b"\n"):
        _, _, record = line.partition(b" ")
        key, _, value = record.partition(b"=")
        if key == b"path":
            return value.decode("utf-8", "surrogateescape")
    return None


class _Members:
    """A tar stream's regular files: ``(header offset, name, size)``; the caller reads or
    skips each file's data with :meth:`data` / :meth:`skip`."""

    def __init__(self, stream: Stream, url: str) -> None:
        self.stream, self.url = stream, url
        self.size = self.padded = 0  # of the current member
        self.end = -1  # the offset of the end-of-archive blocks, once seen

    def _fail(self, what: str, at: int) -> ShardReadError:
        return ShardReadError(f"shard {self.url!r} is truncated or malformed: {what} at byte {at}")

    def __iter__(self) -> Iterator[tuple[int, str, int]]:
        stream, name = self.stream, None
        while True:
            at = stream.pos
            header = stream.read(_BLOCK)
            if header == _ZERO:
                self.end = at
                return
            if len(header) < _BLOCK:
                raise self._fail("the shard ends without tar's end-of-archive blocks", at)
            size, kind = _octal(header[124:136]), header[156:157]
            padded = -(-size // _BLOCK) * _BLOCK
            if kind in (b"L", b"x"):
                data = stream.read(padded)
                if len(data) < padded:
                    raise self._fail(f"a header record of {size} bytes is cut short", at)
                name = data[:size].rstrip(b"\0").decode() if kind == b"L" else _pax_path(data)
                continue
            if kind not in _FILES:
                if stream.skip(padded) < padded:
                    raise self._fail(f"a record of {size} bytes is cut short", at)
                name = None
                continue
            self.size, self.padded = size, padded
            yield at, name or _name(header), size
            name = None

    def data(self, at: int) -> bytes:
        data = self.stream.read(self.size)
        if len(data) < self.size or self.stream.skip(self.padded - self.size) < (
            self.padded - self.size
        ):
            raise self._fail(f"a file of {self.size} bytes is cut short", at)
        return data

    def skip(self, at: int) -> None:
        if self.stream.skip(self.padded) < self.padded:
            raise self._fail(f"a file of {self.size} bytes is cut short", at)


def parse_tar(
    shard: Shard, opened: Opened, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    """The shard's samples from its sample ``shard.start + start``, with where each next
    one starts (see :mod:`._reader`)."""
    stream = opened.stream(shard.url)
    try:
        yield from _samples(stream, shard, start, offset, config)
    finally:
        stream.close()


def _samples(
    stream: Stream, shard: Shard, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    want = shard.start + start
    idx = want if offset is not None else 0  # at an offset, the stream is at sample `want`
    members = _Members(stream, shard.url)
    key: str | None = None
    fields: dict[str, bytes] = {}
    for at, name, _ in members:
        split = split_name(name)
        if split is None or split[0] != key:
            if key is not None:
                if idx >= want:
                    yield _sample(fields, key, idx, shard.url, config), at
                idx += 1
                if shard.stop is not None and idx >= shard.stop:
                    _check_more(shard, at)
                    return
            key, fields = (None, {}) if split is None else (split[0], {})
            if split is None:
                members.skip(at)
                continue
        assert split is not None
        if idx >= want:
            fields[split[1]] = members.data(at)
        else:
            members.skip(at)
    if key is not None:
        if idx >= want:
            yield _sample(fields, key, idx, shard.url, config), members.end
        idx += 1
    _check_count(shard, idx)


def _sample(fields: dict[str, bytes], key: str, idx: int, url: str, config: dict[str, Any]) -> Any:
    sample: dict[str, Any] = {"__key__": key, "__url__": url, "__index__": idx, **fields}
    table = config["decoders"]
    if table is None:
        return sample
    try:
        return decode_sample(sample, table)
    except Exception as e:
        return Failure(e, [(url, idx)])


def _check_more(shard: Shard, at: int) -> None:
    """A piece that ends where the shard should end: the shard has one more sample."""
    if shard.stop == shard.size:
        msg = (
            f"shard {shard.url!r} has more samples than the {shard.size} sizes= gives it "
            f"(one more starts at byte {at}): fix sizes, or they would be left out"
        )
        raise ShardReadError(msg)


def _check_count(shard: Shard, count: int) -> None:
    if shard.stop is not None and count < shard.stop:
        msg = (
            f"shard {shard.url!r} has {count} samples, and sizes= gives it {shard.size}: "
            f"samples {count} to {shard.stop - 1} of the epoch's share are missing"
        )
        raise ShardReadError(msg)
