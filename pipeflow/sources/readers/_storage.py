"""How a reader reaches a remote store: requests that are bounded, retried, and never wait
without end.

Any URL that is not a local path goes through fsspec. Its bytes come in blocks of
``block_size`` by range requests, up to ``window`` blocks ahead of the parser; and the reader
opens the next ``prefetch`` shards while it parses this one (:meth:`Storage.open`), so a
store's latency is paid once per window, not once per read. A shard read from its start asks
for its first block before its size: a shard shorter than a block takes one request. An
async file system (s3fs, HTTP) runs the requests as coroutines on fsspec's event loop, many
at once on one thread; others in a small thread pool.

No request waits without end: each attempt is bounded by ``timeout`` seconds (an async
file system's coroutine under :func:`asyncio.wait_for`; a synchronous one's call in a daemon
thread of its own, which may linger, but nothing waits on it). A failed or timed-out request
is retried ``retries`` times (after 0.1 s, 0.2 s, ...); then :class:`ShardReadError` names the
shard, the byte offset and the attempts. A retried block is the same range again, so nothing
is read twice into the samples. Some failures are not retried: a shard that does not exist
(found missing before any of it was read), and a store that refuses the credentials (the
error has a note on how to pass them). A "not found" after the shard was found (its size
known, a block read) is the store failing, a restart or the shard replaced while read: it
is retried like any failure, then reported as a read that failed at its byte.

Whoever waits on a request (the parser, on a block) waits through :meth:`Storage.wait`: at
most :attr:`Storage.deadline` once no attempt of any request ends, should the machinery
under the attempts stall. A Parquet file is read through a file object whose reads are the
same requests (:meth:`Storage.system`).
"""

from __future__ import annotations

import asyncio
import io
import threading
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any, TypeVar

from pipeflow.errors import ShardReadError, _add_note
from pipeflow.sources.readers._bytes import Stream, _LocalStream, fingerprint_of, is_local
from pipeflow.sources.readers._remote import (
    TIMEOUT,
    credentials_note,
    missing_package,
    no_credentials,
    refused,
)

__all__ = ["Storage", "call_within"]

T = TypeVar("T")


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
            self.size, self.futures = self.storage.wait(self.head, self.url, self.offset)
            if self.offset == 0:  # the shard's version: its size, and its first block's head
                first = self.storage.wait(self.futures[0], self.url, 0) if self.futures else b""
                self.fingerprint = fingerprint_of(self.size, first)
        i, block = self.next_block, self.storage.block_size
        if self.offset + i * block >= self.size:
            return False
        ahead = i + self.storage.window
        if ahead == len(self.futures) and self.offset + ahead * block < self.size:
            self.futures.append(
                self.storage.fetch(self.url, self.offset + ahead * block, self.size)
            )
        data = self.storage.wait(self.futures[i], self.url, self.offset + i * block)
        self.data, self.at = data, 0
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
    ahead (see the module's text). One per pass; :meth:`close` ends its threads.

    *timeout* bounds each request. :attr:`deadline` is the longest a request takes:
    ``retries + 1`` attempts of at most *timeout* and the back-off between them."""

    def __init__(
        self,
        options: Mapping[str, Any],
        block_size: int,
        window: int,
        retries: int,
        timeout: float = TIMEOUT,
    ) -> None:
        self.options = dict(options)
        self.block_size, self.window, self.retries = block_size, window, retries
        self.timeout = float(timeout)
        backoff = sum(_backoff(k) for k in range(1, retries + 1))
        self.deadline = self.timeout * (retries + 1) + backoff
        self.progress = 0  # attempts ended, of every request: what wait() watches
        self.systems: dict[str, Any] = {}
        self.pool: ThreadPoolExecutor | None = None
        self.lock = threading.Lock()

    @classmethod
    def of(cls, config: Mapping[str, Any]) -> Storage:
        """The storage a reader's configuration asks for."""
        return cls(
            config["storage_options"],
            config.get("block_size", 8 << 20),
            config.get("window", 2),
            config["retries"],
            config["timeout"],
        )

    def open(self, url: str, offset: int) -> Stream:
        """The shard's bytes from *offset* (a remote shard starts fetching now)."""
        if is_local(url):
            return _LocalStream(url, offset)
        return _Blocks(self, url, offset)

    def system(self, url: str) -> tuple[Any, str]:
        """fsspec's file system for *url*, and the path in it; its ``open(path, "rb")``
        gives a file whose reads are this storage's requests (bounded, retried), for a
        library that reads a file object (pyarrow)."""
        fs, path = self._system(url)
        return _Files(self, fs, url.split("://", 1)[0]), path

    def _system(self, url: str) -> tuple[Any, str]:
        import fsspec

        protocol = url.split("://", 1)[0]
        with self.lock:
            fs = self.systems.get(protocol)
            if fs is None:
                try:
                    fs = fsspec.filesystem(protocol, **self.options)
                except ImportError as e:
                    raise ImportError(missing_package(url, "shard", e)) from e
                self.systems[protocol] = fs
        return fs, fs._strip_protocol(url) if protocol not in ("http", "https") else url

    # -- requests -------------------------------------------------------------------------------
    def head(self, url: str, offset: int) -> Future[Any]:
        """``(size, [first blocks])``: the shard's size, then its first ``window`` blocks from
        *offset*, all requested at once."""
        return self._run(self._head, url, offset)

    def fetch(self, url: str, start: int, size: int) -> Future[bytes]:
        """The block at *start* (at most ``block_size`` bytes, up to *size*)."""
        return self._run(self._fetch, url, start, min(start + self.block_size, size))

    def size(self, url: str) -> int:
        """The shard's size in bytes, asked now."""
        size: int = self._blocking(self._size, url, at=0)
        return size

    def version(self, url: str, span: int) -> dict[str, Any]:
        """The shard's :func:`~pipeflow.sources.readers._bytes.fingerprint_of` as it is now,
        over its first *span* bytes: two small requests (a state's check at load reads no
        more)."""
        size = self.size(url)
        head = self.read_range(url, 0, min(size, span)) if size and span else b""
        return fingerprint_of(size, head)

    def read_range(self, url: str, start: int, end: int) -> bytes:
        """The shard's bytes from *start* to *end*, read now (the shard was found)."""
        data: bytes = self._blocking(self._fetch, url, start, end, at=start)
        return data

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """``fn(*args)`` in the storage's threads (a Parquet file opened ahead)."""
        return self._pool().submit(fn, *args)

    def wait(self, future: Future[T], url: str, at: int | None) -> T:
        """*future*'s result. Its attempts are bounded, so it ends within :attr:`deadline`;
        should the machinery under them stall (no attempt of any request ending for that
        long), a :class:`ShardReadError` rather than a wait without end."""
        while True:
            seen = self.progress
            try:
                return future.result(timeout=self.deadline)
            except FutureTimeout:
                if future.done():
                    return future.result()
                if self.progress == seen:
                    future.cancel()
                    doing = "opening it" if at is None else f"reading at byte {at}"
                    msg = (
                        f"shard {url!r}: {doing} got no answer in "
                        f"{self.deadline:g} s ({self.retries + 1} attempts of at most "
                        f"timeout={self.timeout:g} s, and the back-off between them)"
                    )
                    raise ShardReadError(msg) from None

    def _pool(self) -> ThreadPoolExecutor:
        with self.lock:
            if self.pool is None:
                self.pool = ThreadPoolExecutor(8, thread_name_prefix="pipeflow-shard-read")
            return self.pool

    def _run(self, fn: Any, *args: Any) -> Future[Any]:
        fs, _ = self._system(args[0])
        if getattr(fs, "async_impl", False):
            return asyncio.run_coroutine_threadsafe(fn(*args, use_async=True), fs.loop)
        return self._pool().submit(lambda: asyncio.run(fn(*args, use_async=False)))

    def _blocking(self, fn: Any, url: str, *args: Any, at: int) -> Any:
        """``fn(url, *args)``'s result, in this thread where it can: a synchronous file
        system's request runs here (its attempts in threads of their own), not in the
        pool, which may be busy with the very work that waits on it."""
        fs, _ = self._system(url)
        if not getattr(fs, "async_impl", False):
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # no event loop in this thread (a notebook's has one)
                return asyncio.run(fn(url, *args, use_async=False))
        return self.wait(self._run(fn, url, *args), url, at)

    async def _attempt(self, call: Any, use_async: bool, *args: Any, **kwargs: Any) -> Any:
        """One request, at most ``timeout`` seconds: a coroutine under ``wait_for``; a
        synchronous call in a daemon thread of its own, which may linger past the
        timeout, but nothing waits on it, nor does the interpreter at exit."""
        try:
            if use_async:
                return await asyncio.wait_for(call(*args, **kwargs), self.timeout)
            work = asyncio.wrap_future(_daemon(call, *args, **kwargs))
            return await asyncio.wait_for(work, self.timeout)
        except asyncio.TimeoutError as e:
            raise _TimedOut(self.timeout) from e
        finally:
            self.progress += 1

    async def _head(self, url: str, offset: int, *, use_async: bool) -> tuple[int, list[Any]]:
        fs, path = self._system(url)
        first, failed = (
            await self._first_block(url, offset, use_async) if offset == 0 else (None, None)
        )
        if first is not None and len(first) < self.block_size:  # the whole shard: its size
            return len(first), [_done(first)]
        call = fs._info if use_async else fs.info
        found = first is not None  # a block read: a "not found" now is the store failing
        info = await self._retry(url, offset, call, use_async, (path,), found=found, failed=failed)
        size = int(info["size"])
        if offset > size:
            msg = f"shard {url!r} has {size} bytes, and the reader starts at byte {offset}"
            raise ShardReadError(msg)
        starts = range(offset, size, self.block_size)[: self.window]
        if first is not None and len(first) == self.block_size:
            return size, [_done(first), *(self.fetch(url, s, size) for s in starts[1:])]
        return size, [self.fetch(url, s, size) for s in starts]

    async def _first_block(
        self, url: str, offset: int, use_async: bool
    ) -> tuple[bytes | None, BaseException | None]:
        """The shard's first block, asked for before its size is known: a shard shorter
        than a block (most of them) then takes one request, not a size request and a read
        after it. ``None`` when the request gives nothing or fails (an empty shard may
        refuse the range): the size is asked for, and the blocks read, as for a longer
        shard. A request that timed out comes back with its timeout, which counts as the
        first of the size request's attempts: a store that does not answer costs
        ``retries + 1`` of them, as any request."""
        fs, path = self._system(url)
        call = fs._cat_file if use_async else fs.cat_file
        try:
            out = await self._attempt(
                call, use_async, path, start=offset, end=offset + self.block_size
            )
        except FileNotFoundError as e:
            raise ShardReadError(f"shard {url!r} does not exist") from e
        except Exception as e:
            if refused(e):
                raise _refused(url, offset, e) from e
            return None, e if isinstance(e, _TimedOut) else None
        return (bytes(out) if out else None), None

    async def _fetch(self, url: str, start: int, end: int, *, use_async: bool) -> bytes:
        fs, path = self._system(url)
        call = fs._cat_file if use_async else fs.cat_file
        span = {"start": start, "end": end}
        data: bytes = await self._retry(url, start, call, use_async, (path,), span, found=True)
        return data

    async def _size(self, url: str, *, use_async: bool) -> int:
        fs, path = self._system(url)
        info = await self._retry(url, 0, fs._info if use_async else fs.info, use_async, (path,))
        return int(info["size"])

    async def _retry(
        self,
        url: str,
        at: int,
        call: Any,
        use_async: bool,
        args: tuple[Any, ...],
        kwargs: dict[str, Any] | None = None,
        *,
        found: bool = False,
        failed: BaseException | None = None,
    ) -> Any:
        """``call(*args, **kwargs)`` in at most ``retries + 1`` bounded attempts, *failed*
        the first when given; a short block counts as a failure. A shard not found fails at
        once, unless *found* (it was there, so "not found" is the store failing: a restart,
        the shard replaced), and so does a store that refuses the credentials."""
        kwargs = kwargs or {}
        failures: list[BaseException] = [] if failed is None else [failed]
        while len(failures) <= self.retries:
            if failures:
                await asyncio.sleep(_backoff(len(failures)))
            try:
                out = await self._attempt(call, use_async, *args, **kwargs)
            except FileNotFoundError as e:
                if not found:
                    raise ShardReadError(f"shard {url!r} does not exist") from e
                failures.append(e)
                continue
            except Exception as e:
                if refused(e):
                    raise _refused(url, at, e) from e
                failures.append(e)
                continue
            want = kwargs.get("end", 0) - kwargs.get("start", 0)
            if "end" in kwargs and len(out) != want:
                failures.append(OSError(f"got {len(out)} of {want} bytes"))
                continue
            return out
        raise ShardReadError(_failed(url, at, failures, self.timeout)) from failures[-1]

    def close(self) -> None:
        """Stop the threads of a synchronous file system's requests."""
        if self.pool is not None:
            self.pool.shutdown(wait=False, cancel_futures=True)
            self.pool = None


def _backoff(failures: int) -> float:
    """Seconds before the attempt after *failures* failed ones: 0.1, 0.2, 0.4, ..."""
    return 0.1 * 2.0 ** (failures - 1)


class _TimedOut(TimeoutError):
    """An attempt that got no answer in ``timeout`` seconds."""

    def __init__(self, seconds: float) -> None:
        super().__init__(f"no answer in {seconds:g} s")
        self.seconds = seconds


def _failed(url: str, at: int, failures: list[BaseException], timeout: float) -> str:
    """What a read that failed every attempt says: the shard, the byte, the attempts."""
    n, last = len(failures), failures[-1]
    timed_out = sum(isinstance(f, _TimedOut) for f in failures)
    head = f"shard {url!r}: reading at byte {at} failed {n} time{'s' if n > 1 else ''}"
    if timed_out == n:
        return (
            f"{head}: {'each attempt' if n > 1 else 'it'} timed out after {timeout:g} s "
            f"(timeout={timeout:g}: a slow store needs more)"
        )
    why = f"{type(last).__name__}: {last}"
    if timed_out:
        why += f"; {timed_out} of the {n} attempts timed out after {timeout:g} s"
    msg = f"{head} ({why})"
    if any(isinstance(f, FileNotFoundError) for f in failures):
        msg += (
            ": the shard was found, then a read of it was answered 'not found' (the store "
            "restarted, or the shard was deleted or replaced while it was read)"
        )
    return msg


def _refused(url: str, at: int, error: BaseException) -> ShardReadError:
    what = "no credentials to read it" if no_credentials(error) else "the store refused to read it"
    err = ShardReadError(f"shard {url!r}: {what} at byte {at} ({type(error).__name__}: {error})")
    _add_note(err, credentials_note(f"shard {url!r}", url, error))
    return err


def _daemon(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Future[T]:
    """``fn(*args, **kwargs)`` in a daemon thread of its own: a call that never returns
    keeps neither its waiter (who waits with a timeout) nor the interpreter's exit."""
    future: Future[T] = Future()

    def run() -> None:
        if not future.set_running_or_notify_cancel():
            return
        try:
            result = fn(*args, **kwargs)
        except BaseException as e:
            future.set_exception(e)
        else:
            future.set_result(result)

    threading.Thread(target=run, name="pipeflow-shard-request", daemon=True).start()
    return future


def call_within(fs: Any, method: str, timeout: float, *args: Any) -> Any:
    """``fs.<method>(*args)``, waited on at most *timeout* seconds (``TimeoutError``): an
    async file system's coroutine on its loop (cancelled at the timeout), a synchronous
    one's call in a daemon thread."""
    if getattr(fs, "async_impl", False):
        future = asyncio.run_coroutine_threadsafe(getattr(fs, "_" + method)(*args), fs.loop)
    else:
        future = _daemon(getattr(fs, method), *args)
    try:
        return future.result(timeout=timeout)
    except FutureTimeout:
        if future.done():
            return future.result()
        future.cancel()
        raise TimeoutError(f"no answer in {timeout:g} s") from None


class _Files:
    """A file system as :meth:`Storage.system` gives it: fsspec's, but ``open(path, "rb")``
    is a :class:`_RangeFile` of the storage; the rest is fsspec's."""

    def __init__(self, storage: Storage, fs: Any, protocol: str) -> None:
        self.storage, self.fs, self.protocol = storage, fs, protocol

    def open(self, path: str, mode: str = "rb", **kwargs: Any) -> Any:
        if mode != "rb" or kwargs:
            return self.fs.open(path, mode, **kwargs)
        url = path if "://" in path else f"{self.protocol}://{path}"
        return _RangeFile(self.storage, url)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.fs, name)


#: Bytes a :class:`_RangeFile` asks for at least, kept for the reads after (a Parquet
#: row group's column chunks follow each other).
READ_AHEAD = 8 << 20


class _RangeFile(io.RawIOBase):
    """A remote shard as a file object, for a library that reads one (pyarrow): each read
    that the bytes kept do not hold is a range request of the storage (bounded by its
    timeout, retried), of at least :data:`READ_AHEAD` bytes, kept for the reads after."""

    def __init__(self, storage: Storage, url: str) -> None:
        super().__init__()
        self.storage, self.url = storage, url
        self.size = storage.size(url)
        self.pos = 0
        self.start, self.data = 0, b""  # the bytes kept, from self.start on

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = 0, /) -> int:
        base = (0, self.pos, self.size)[whence]
        self.pos = max(base + offset, 0)
        return self.pos

    def read(self, size: int | None = -1, /) -> bytes:
        end = self.size if size is None or size < 0 else min(self.pos + size, self.size)
        if self.pos >= end:
            return b""
        if not self.start <= self.pos <= end <= self.start + len(self.data):
            stop = min(max(end, self.pos + READ_AHEAD), self.size)
            self.start, self.data = self.pos, self.storage.read_range(self.url, self.pos, stop)
        out = self.data[self.pos - self.start : end - self.start]
        self.pos = end
        return out

    def readall(self) -> bytes:
        return self.read(-1)

    def readinto(self, buffer: Any, /) -> int:
        data = self.read(len(memoryview(buffer).cast("B")))
        memoryview(buffer).cast("B")[: len(data)] = data
        return len(data)
