"""Tar shards in the WebDataset layout: files grouped into samples by their key.

A sample is the run of consecutive files whose names share a key: the name up to the first
dot of its last part (``images/00042.seg.png`` has key ``images/00042`` and extension
``seg.png``). It becomes a dict keyed by extension, plus ``"__key__"`` and ``"__url__"`` as
WebDataset gives them, and ``"__index__"``, its number in the shard.

The grouping is WebDataset's (``tar_file_iterator`` and ``group_by_keys`` in its
``tariterators``): the same split of a name (:func:`split_name`), the extension lowercased
(``A.JPG`` is field ``jpg``), and these passed over without ending the sample in progress:
files without an extension, meta files (``__name__``, anything under ``__name__/``),
directories, links, devices. Names come from pax ``path`` records and GNU long names, as
:mod:`tarfile` reads them (UTF-8; bytes that are not are kept as surrogates, so a name always
decodes); a pax ``size`` replaces the header's. Pax global headers and GNU long link names
are passed over; a sparse file is a :class:`~pipeflow.ShardReadError`. pipeflow differs from
WebDataset in one place: a sample with two files of one extension is a ``ValueError`` in the
sample's place (WebDataset raises, and its stream ends there).

The parser reads headers and data straight from the shard's byte stream, so it knows where
each sample starts: the offset of the first header record of its first file (a pax or GNU
long-name record, when one comes before the file's own header), which a resumed pass seeks
to.

**Damage.** Each header's checksum is verified, as :mod:`tarfile` does. A header that fails
it, a number that is not one, a malformed pax record, a shard cut anywhere (in a header, a
file, a pax or long-name record) or ending without tar's end-of-archive block (a writer killed
before ``close()``) is one :class:`~pipeflow.ShardReadError` naming the shard, the byte, and
the samples delivered before it. Every complete sample before the damage comes first. So does
the sample in progress, unless the damaged file is known to belong to it (its name was read
and has the sample's key): a shard cut between two files of one sample looks like one cut
between samples, and like WebDataset the reader then delivers what it has.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterator
from typing import Any

from pipeflow.engine._failure import Failure
from pipeflow.sources.readers._bytes import ShardReadError, Stream
from pipeflow.sources.readers._decode import decode_sample
from pipeflow.sources.readers._reader import Opened
from pipeflow.sources.shards import Shard

__all__ = ["parse_tar", "split_name"]

_BLOCK = 512
_ZERO = bytes(_BLOCK)
_SPLIT = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")  # WebDataset's base_plus_ext
_META = re.compile(r"__[^/]*__($|/)")  # WebDataset's skip_meta
_DECIMAL = re.compile(r"[0-9]+")
_PAX = re.compile(rb"(\d+) ([^=\n]+)=")
_ODD = bytes(b & 1 for b in range(256))  # a byte's lowest bit
_LOW = bytes(range(128))  # deleted from a header, they leave the bytes with the high bit set
_FILES = (b"0", b"\0", b"7")  # regular files: a sample's
_NO_DATA = (b"1", b"2", b"3", b"4", b"5", b"6")  # links, devices, directories, FIFOs
_EXTENDED = (b"x", b"X", b"g", b"L", b"K")  # records about the next header


def split_name(name: str) -> tuple[str, str] | None:
    """``(key, extension)`` of a member's name, the extension lowercased, as WebDataset
    splits it (``None``: a file WebDataset passes over, with no extension or a meta file).

    Examples:
        >>> split_name("images/00042.seg.PNG")
        ('images/00042', 'seg.png')
        >>> split_name("README") is None, split_name("__meta__/a.json") is None
        (True, True)
    """
    if name.startswith("__") and (
        ("/" not in name and name.endswith("__")) or _META.match(name) is not None
    ):
        return None
    m = _SPLIT.match(name)
    return None if m is None else (m.group(1), m.group(2).lower())


class _Damage(Exception):
    """The shard is damaged at byte *at*: *what*. *first*: where the damaged member's first
    record starts; *name*: its name, when it could be read."""

    def __init__(self, what: str, at: int, first: int, name: str | None) -> None:
        super().__init__(what)
        self.what, self.at, self.first, self.name = what, at, first, name


def _number(field: bytes) -> int | None:
    """A header's number field, as :mod:`tarfile` reads it (octal, or base-256 for 8 GiB
    and more); ``None`` when it is not one (or negative)."""
    if field[:1] == b"\x80":
        return int.from_bytes(field[1:], "big")
    try:
        n = int(field.split(b"\0", 1)[0].strip() or b"0", 8)
    except ValueError:
        return None
    return n if n >= 0 else None


def _checksum_ok(header: bytes) -> bool:
    """Whether the header's checksum (bytes 148:156) is its bytes' sum, the field counted as
    spaces: unsigned, or signed as some old tars wrote it (as :mod:`tarfile` checks)."""
    stored = _number(header[148:156])
    unsigned = _byte_sum(header) - sum(header[148:156]) + 8 * 32
    if stored == unsigned:
        return True
    high = len(header[:148].translate(None, _LOW)) + len(header[156:].translate(None, _LOW))
    return stored == unsigned - 256 * high


def _byte_sum(block: bytes) -> int:
    """The sum of a block's bytes (512 at most), at C speed: adler32 gives it modulo 65521,
    and its parity tells which of the two numbers below 131042 with that rest it is."""
    rest = ((zlib.adler32(block) & 0xFFFF) - 1) % 65521
    odd = block.translate(_ODD).count(1) & 1
    return rest if rest & 1 == odd else rest + 65521


def _text(data: bytes) -> str:
    """A name's bytes up to the first NUL, as :mod:`tarfile` decodes them."""
    return data.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")


def _name(header: bytes) -> str:
    """The name in a header: its name field, after the ustar prefix when there is one."""
    name, prefix = _text(header[:100]), _text(header[345:500])
    if prefix and header[156:157] not in (b"L", b"K", b"S"):
        name = prefix + "/" + name
    return name


def _seen_name(header: bytes) -> str | None:
    """The name in a header that may be cut short or damaged, when its name field is whole;
    ``None`` for a record about the next header (its name is not the file's)."""
    if (len(header) < 100 and b"\0" not in header) or header[156:157] in _EXTENDED:
        return None
    return _name(header)


def _pax(data: bytes) -> dict[str, str] | None:
    """A pax record's ``keyword=value`` pairs (``None``: malformed)."""
    out: dict[str, str] = {}
    pos, size = 0, len(data)
    while pos < size:
        m = _PAX.match(data, pos)
        if m is None:
            return out if not data[pos:].strip(b"\0") else None
        end = pos + int(m.group(1))
        if end <= m.end() or end > size or data[end - 1] != 0x0A:
            return None
        key = m.group(2).decode("utf-8", "surrogateescape")
        out[key] = data[m.end() : end - 1].decode("utf-8", "surrogateescape")
        pos = end
    return out


class _Members:
    """A tar stream's regular files, as ``(offset of its first record, name)``; the caller
    reads or skips each file's data with :meth:`data` / :meth:`skip`. Damage raises
    :class:`_Damage`."""

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.first = self.header = 0  # where the member's first record and header start
        self.name: str | None = None  # the member's, once read
        self.size = self.padded = 0  # of its data
        self.end = -1  # the offset of the end-of-archive block, once seen

    def __iter__(self) -> Iterator[tuple[int, str]]:
        while (kind := self._member()) is not None:
            if kind in _FILES:
                yield self.first, self.name or ""
            elif kind not in _NO_DATA:  # a type tar does not know: its data passed over
                self.skip()

    def _member(self) -> bytes | None:
        """Read the next member's records up to its data; its kind (``None``: the end)."""
        stream = self.stream
        self.first, self.name = stream.pos, None
        size: int | None = None
        while True:
            at = stream.pos
            header = self._header(at)
            if header is None:
                return None
            kind, own = header[156:157], _number(header[124:136])
            if own is None:
                raise self._damage("the header's size is not a number", at, header)
            if kind not in _EXTENDED:
                break
            data = self._record(own, at)
            if kind == b"L" and self.name is None:
                self.name = _text(data)
            elif kind in (b"x", b"X"):
                pax = _pax(data)
                if pax is None:
                    raise self._damage("a pax record is malformed", at)
                if any(k.startswith("GNU.sparse.") for k in pax):
                    raise self._damage("a sparse file, which pipeflow does not read", at)
                if self.name is None and "path" in pax:
                    self.name = pax["path"].rstrip("/")
                if size is None and "size" in pax:
                    if not _DECIMAL.fullmatch(pax["size"]):
                        raise self._damage("a pax record's size is not a number", at)
                    size = int(pax["size"])
        if kind == b"S":
            raise self._damage("a GNU sparse file, which pipeflow does not read", at, header)
        if self.name is None:
            self.name = _name(header)
        if kind == b"\0" and self.name.endswith("/"):  # an old tar's directory
            kind = b"5"
        self.header, self.size = at, own if size is None else size
        self.padded = -(-self.size // _BLOCK) * _BLOCK
        return kind

    def _header(self, at: int) -> bytes | None:
        """The header block at *at*, checked (``None``: the end-of-archive block)."""
        header = self.stream.read(_BLOCK)
        if header == _ZERO and at == self.first:
            self.end = at
            return None
        if not header and at == self.first:
            raise self._damage("the shard ends without tar's end-of-archive block", at)
        if len(header) < _BLOCK:
            raise self._damage(f"a header is cut short ({len(header)} of 512 bytes)", at, header)
        if not _checksum_ok(header):
            raise self._damage("a header's checksum is wrong (bytes 148-155)", at, header)
        return header

    def _record(self, size: int, at: int) -> bytes:
        """The data of a pax or GNU record (its header at *at*)."""
        padded = -(-size // _BLOCK) * _BLOCK
        data = self.stream.read(padded)
        if len(data) < padded:
            raise self._damage(f"a pax or long-name record of {size} bytes is cut short", at)
        return data[:size]

    def data(self) -> bytes:
        """The member's data."""
        size, rest = self.size, self.padded - self.size
        data = self.stream.read(size)
        if len(data) < size or self.stream.skip(rest) < rest:
            raise self._cut()
        return data

    def skip(self) -> None:
        """Pass over the member's data."""
        if self.stream.skip(self.padded) < self.padded:
            raise self._cut()

    def _cut(self) -> _Damage:
        at = self.header + _BLOCK
        what = f"the data of {self.name!r} ({self.size} bytes from byte {at}) is cut short"
        return _Damage(f"{what} at byte {self.stream.pos}", self.header, self.first, self.name)

    def _damage(self, what: str, at: int, header: bytes | None = None) -> _Damage:
        name = self.name if self.name is not None or header is None else _seen_name(header)
        return _Damage(what, at, self.first, name)


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


class _Sample:
    """The sample being gathered: its key, its fields, an extension seen twice."""

    __slots__ = ("fields", "key", "twice")

    def __init__(self, key: str | None = None) -> None:
        self.key, self.twice = key, ""
        self.fields: dict[str, bytes] = {}


def _samples(
    stream: Stream, shard: Shard, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    want = shard.start + start
    idx = want if offset is not None else 0  # at an offset, the stream is at sample `want`
    members, now, last = _Members(stream), _Sample(), None  # last: the key last delivered
    try:
        for at, name in members:
            split = split_name(name)
            if split is None:
                members.skip()
                continue
            if split[0] != now.key:
                if now.key is not None:
                    if idx >= want:
                        yield _sample(now, idx, shard.url, config), at
                        last = now.key
                    idx += 1
                    if shard.stop is not None and idx >= shard.stop:
                        _check_more(shard, at)
                        return
                now = _Sample(split[0])
            if idx < want:
                members.skip()
            elif split[1] in now.fields:
                now.twice = now.twice or split[1]
                members.skip()
            else:
                now.fields[split[1]] = members.data()
        if now.key is not None:
            if idx >= want:
                yield _sample(now, idx, shard.url, config), members.end
            idx += 1
    except _Damage as d:
        split = split_name(d.name) if d.name is not None else None
        if now.key is not None and idx >= want and (split is None or split[0] != now.key):
            yield _sample(now, idx, shard.url, config), d.first
            idx, last = idx + 1, now.key
        raise ShardReadError(_damaged(shard, d, idx - shard.start, last)) from None
    except ShardReadError:
        raise
    except Exception as e:  # a read that failed (an OSError), or a header no rule foresaw
        msg = f"shard {shard.url!r} can't be read at byte {stream.pos}: {type(e).__name__}: {e}"
        raise ShardReadError(msg) from e
    _check_count(shard, idx)


def _damaged(shard: Shard, d: _Damage, delivered: int, last: str | None) -> str:
    """The message of a damaged shard: where, what, and what was delivered before."""
    were = f"{delivered} of its samples {'was' if delivered == 1 else 'were'} delivered before it"
    if delivered <= 0:
        before = "no sample of it was delivered before it"
    elif last is None:
        before = f"{were}, before this pass resumed"
    else:
        before = f"{were}, the last {last!r}"
    return f"shard {shard.url!r} is truncated or malformed at byte {d.at}: {d.what}; {before}"


def _sample(now: _Sample, idx: int, url: str, config: dict[str, Any]) -> Any:
    if now.twice:
        msg = (
            f"a sample's files must have distinct extensions (got two {now.twice!r} files "
            f"in sample {now.key!r}, sample {idx} of shard {url!r})"
        )
        return Failure(ValueError(msg), [(url, idx)])
    sample: dict[str, Any] = {"__key__": now.key, "__url__": url, "__index__": idx, **now.fields}
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
