"""A shard's bytes, from where a reader starts in it: a local file, or blocks fetched ahead.

A reader parses a shard as a stream (:class:`Stream`: ``read``, ``skip``, ``readline`` and
the position ``pos``), opened at a byte offset: a resumed pass opens the shard it stopped
in at the offset of its next sample, and reads nothing before it.

- A local path (or ``file://``) is a plain buffered file, seeked to the offset.
- Any other URL goes through fsspec. Its bytes come in blocks of ``block_size`` by range
  requests, up to ``window`` blocks ahead of the parser; and the reader opens the next
  ``prefetch`` shards while it parses this one (:class:`Storage.open`), so a store's latency
  is paid once per window, not once per read. A shard read from its start asks for its
  first block before its size: a shard shorter than a block takes one request. An async
  file system (s3fs, HTTP) runs the requests as coroutines on fsspec's event loop, many at
  once on one thread; others in a small thread pool.

A failed request is retried ``retries`` times (after 0.1 s, 0.2 s, ...); then, or at once for
a shard that does not exist, :class:`ShardReadError` names the shard and the byte offset. A
retried block is the same range again, so nothing is read twice into the samples.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

from pipeflow.errors import ShardReadError

__all__ = ["ShardReadError", "Storage", "Stream", "is_local", "local_path"]


def is_local(url: str) -> bool:
    """Whether *url* is a path on this machine (no scheme, or ``file://``)."""
    return "://" not in url or url.startswith("file://")


def local_path(url: str) -> str:
    """The path of a local *url*."""
    return url[len("file://") :] if url.startswith("file://") else url


class Stream:
    """A shard's bytes from an offset on: what a parser reads."""

    pos: int

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


class _Blocks(Stream):
    """A remote shard's bytes from *offset*: blocks requested ahead, read in order."""

    def __init__(self, storage: Storage, url: str, offset: int) -> None:
        self.storage, self.url, self.offset = storage, url, offset
        self.pos = offset
        self.head: Future[Any] = storage.head(url, offset)  # (size, first blocks)
        self.futures: list[Future[bytes]] | None = None
        self.size = 0
        self.data = b""  # the block being read, from self.at on
        self.at = 0
        self.next_block = 0  # the block that comes after self.data

    def _fill(self) -> bool:
        """Move to the next block; False at the end of the shard."""
        if self.futures is None:
            self.size, self.futures = self.head.result()
        i, block = self.next_block, self.storage.block_size
        if self.offset + i * block >= self.size:
            return False
        ahead = i + self.storage.window
        if ahead == len(self.futures) and self.offset + ahead * block < self.size:
            self.futures.append(
                self.storage.fetch(self.url, self.offset + ahead * block, self.size)
            )
        self.data, self.at = self.futures[i].result(), 0
        self.futures[i] = _DONE  # the block's bytes are held here only
        self.next_block += 1
        return True

    def read(self, n: int) -> bytes:
        parts = []
        while n > 0:
            if self.at == len(self.data) and not self._fill():
                break
            part = self.data[self.at : self.at + n]
            self.at += len(part)
            parts.append(part)
            n -= len(part)
            self.pos += len(part)
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def readline(self) -> bytes:
        parts = []
        while True:
            if self.at == len(self.data) and not self._fill():
                break
            end = self.data.find(b"\n", self.at)
            stop = len(self.data) if end < 0 else end + 1
            parts.append(self.data[self.at : stop])
            self.pos += stop - self.at
            self.at = stop
            if end >= 0:
                break
        return parts[0] if len(parts) == 1 else b"".join(parts)

    def close(self) -> None:
        for f in self.futures or ():
            f.cancel()
        self.head.cancel()
        self.data = b""


_DONE: Future[bytes] = Future()


def _done(data: bytes) -> Future[bytes]:
    """A block already read."""
    future: Future[bytes] = Future()
    future.set_result(data)
    return future


class Storage:
    """How a reader opens shards: local files, or fsspec's file systems with blocks fetched
    ahead (see the module's text). One per pass; :meth:`close` ends its threads."""

    def __init__(
        self,
        options: Mapping[str, Any],
        block_size: int,
        window: int,
        retries: int,
    ) -> None:
        self.options = dict(options)
        self.block_size, self.window, self.retries = block_size, window, retries
        self.systems: dict[str, Any] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.lock = threading.Lock()

    def open(self, url: str, offset: int) -> Stream:
        """The shard's bytes from *offset* (a remote shard starts fetching now)."""
        if is_local(url):
            return _LocalStream(url, offset)
        return _Blocks(self, url, offset)

    def system(self, url: str) -> tuple[Any, str]:
        """fsspec's file system for *url*, and the path in it."""
        import fsspec

        protocol = url.split("://", 1)[0]
        with self.lock:
            fs = self.systems.get(protocol)
            if fs is None:
                fs = self.systems[protocol] = fsspec.filesystem(protocol, **self.options)
        return fs, fs._strip_protocol(url) if protocol not in ("http", "https") else url

    # -- requests -------------------------------------------------------------------------------
    def head(self, url: str, offset: int) -> Future[Any]:
        """``(size, [first blocks])``: the shard's size, then its first ``window`` blocks from
        *offset*, all requested at once."""
        return self._run(self._head, url, offset)

    def fetch(self, url: str, start: int, size: int) -> Future[bytes]:
        """The block at *start* (at most ``block_size`` bytes, up to *size*)."""
        return self._run(self._fetch, url, start, min(start + self.block_size, size))

    def _run(self, fn: Any, *args: Any) -> Future[Any]:
        fs, _ = self.system(args[0])
        if getattr(fs, "async_impl", False):
            return asyncio.run_coroutine_threadsafe(fn(*args, use_async=True), fs.loop)
        if self.pool is None:
            self.pool = ThreadPoolExecutor(8, thread_name_prefix="pipeflow-shard-read")
        return self.pool.submit(lambda: asyncio.run(fn(*args, use_async=False)))

    async def _head(self, url: str, offset: int, *, use_async: bool) -> tuple[int, list[Any]]:
        fs, path = self.system(url)
        first = await self._first_block(url, offset, use_async) if offset == 0 else None
        if first is not None and len(first) < self.block_size:  # the whole shard: its size
            return len(first), [_done(first)]
        info = await self._retry(url, offset, fs._info if use_async else fs.info, use_async, path)
        size = int(info["size"])
        if offset > size:
            msg = f"shard {url!r} has {size} bytes, and the reader starts at byte {offset}"
            raise ShardReadError(msg)
        starts = range(offset, size, self.block_size)[: self.window]
        if first is not None and len(first) == self.block_size:
            return size, [_done(first), *(self.fetch(url, s, size) for s in starts[1:])]
        return size, [self.fetch(url, s, size) for s in starts]

    async def _first_block(self, url: str, offset: int, use_async: bool) -> bytes | None:
        """The shard's first block, asked for before its size is known: a shard shorter
        than a block (most of them) then takes one request, not a size request and a read
        after it. ``None`` when the request fails or gives nothing: the size is asked for,
        and the blocks read with the retries, as for a longer shard."""
        fs, path = self.system(url)
        call = fs._cat_file if use_async else fs.cat_file
        end = offset + self.block_size
        try:
            out = await call(path, start=offset, end=end) if use_async else call(path, offset, end)
        except FileNotFoundError as e:
            raise ShardReadError(f"shard {url!r} does not exist") from e
        except Exception:
            return None
        return bytes(out) if out else None

    async def _fetch(self, url: str, start: int, end: int, *, use_async: bool) -> bytes:
        fs, path = self.system(url)
        call = fs._cat_file if use_async else fs.cat_file
        data: bytes = await self._retry(url, start, call, use_async, path, start=start, end=end)
        return data

    async def _retry(
        self, url: str, at: int, call: Any, use_async: bool, *args: Any, **kwargs: Any
    ) -> Any:
        """``call(*args, **kwargs)``, retried; a short block counts as a failure."""
        last: BaseException | None = None
        for attempt in range(self.retries + 1):
            if attempt:
                await asyncio.sleep(0.1 * 2 ** (attempt - 1))
            try:
                out = await call(*args, **kwargs) if use_async else call(*args, **kwargs)
            except FileNotFoundError as e:
                raise ShardReadError(f"shard {url!r} does not exist") from e
            except Exception as e:
                last = e
                continue
            want = kwargs.get("end", 0) - kwargs.get("start", 0)
            if "end" in kwargs and len(out) != want:
                last = OSError(f"got {len(out)} of {want} bytes")
                continue
            return out
        msg = (
            f"shard {url!r}: reading at byte {at} failed {self.retries + 1} times "
            f"({type(last).__name__}: {last})"
        )
        raise ShardReadError(msg) from last

    def close(self) -> None:
        """Stop the threads of a synchronous file system's requests."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None
