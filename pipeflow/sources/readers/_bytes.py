"""A shard's bytes, from where a reader starts in it: a local file, or blocks fetched ahead.

A reader parses a shard as a stream (:class:`Stream`: ``read``, ``skip``, ``readline`` and
the position ``pos``), opened at a byte offset: a resumed pass opens the shard it stopped
in at the offset of its next sample, and reads nothing before it.

- A local path (or ``file://``) is a plain buffered file, seeked to the offset.
- Any other URL's bytes come in blocks of ``block_size`` by range requests, up to ``window``
  blocks ahead of the parser (:mod:`pipeflow.sources.readers._storage`).

A stream opened at byte 0 also tells the shard's version (:func:`fingerprint_of`), which a
state keeps for the shard it stopped in (:mod:`pipeflow.sources.readers._versions`).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any

from pipeflow.errors import ShardReadError

__all__ = ["HEAD", "ShardReadError", "Stream", "fingerprint_of", "is_local", "local_path"]


def is_local(url: str) -> bool:
    """Whether *url* is a path on this machine (no scheme, or ``file://``)."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """The path of a local *url*."""
    return url[len("file://") :] if url.startswith("file://") else url


#: How much of a shard's head its fingerprint digests.
HEAD = 64 << 10


def fingerprint_of(size: int, head: bytes) -> dict[str, Any]:
    """What tells one version of a shard from another: its size in bytes and a digest of its
    first bytes, as many as were at hand when it was read (its first block, at most
    :data:`HEAD`; ``"span"`` says how many, and a state's check at load reads as many).
    JSON-ready: a state keeps it for the shard it stopped in.

    Examples:
        >>> fingerprint_of(5, b"hello")
        {'bytes': 5, 'head': 'a7b6eda801e5347d', 'span': 5}
    """
    head = head[:HEAD]
    digest = hashlib.blake2b(head, digest_size=8).hexdigest()
    return {"bytes": size, "head": digest, "span": len(head)}


class Stream:
    """A shard's bytes from an offset on: what a parser reads. ``fingerprint`` is the
    shard's :func:`fingerprint_of` once known, for a stream opened at byte 0 (a local file's
    at once; a remote one's once its first bytes are in): :meth:`version` tells it."""

    pos: int
    fingerprint: dict[str, Any] | None = None

    def version(self) -> dict[str, Any] | None:
        """The shard's fingerprint, or ``None`` while it is not known."""
        return self.fingerprint

    def read(self, n: int) -> bytes:
        """Up to *n* bytes (fewer only at the end of the shard)."""
        raise NotImplementedError

    def skip(self, n: int) -> int:
        """Pass over up to *n* bytes; how many were passed."""
        return len(self.read(n))

    def readline(self) -> bytes:
        """The bytes up to and with the next ``\\n`` (or to the end)."""
        raise NotImplementedError

    def close(self) -> None:
        """Release the file or the blocks."""


class _LocalStream(Stream):
    def __init__(self, url: str, offset: int) -> None:
        try:
            self.file = open(local_path(url), "rb", buffering=1 << 20)  # noqa: SIM115
        except FileNotFoundError as e:
            raise ShardReadError(f"shard {url!r} does not exist") from e
        self.size = self.file.seek(0, 2)
        if offset == 0:
            self.fingerprint = fingerprint_of(self.size, os.pread(self.file.fileno(), HEAD, 0))
        self.file.seek(offset)
        self.pos = offset

    def read(self, n: int) -> bytes:
        data = self.file.read(n)
        self.pos += len(data)
        return data

    def skip(self, n: int) -> int:
        n = max(min(n, self.size - self.pos), 0)
        self.file.seek(n, 1)
        self.pos += n
        return n

    def readline(self) -> bytes:
        line = self.file.readline()
        self.pos += len(line)
        return line

    def close(self) -> None:
        self.file.close()
