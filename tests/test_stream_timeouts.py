"""No read can hang: a store that accepts the connection and never answers, or answers the
headers and stalls the body, fails the shard with a ShardReadError after ``retries + 1``
attempts of at most ``timeout`` seconds, through async file systems (HTTP), a synchronous
one (a file system defined here whose calls never return) and Parquet's reads; a glob's
listing too. And a shard that the store stops finding after it was found (deleted or
replaced mid-read, a restart) is a read that failed at its byte, not "does not exist".

Every server is on 127.0.0.1 and started here. Each read runs in a thread joined with a
timeout, so that a hang fails the test instead of the suite; the bounds are generous (a
loaded 2-core machine), never tight timings."""

from __future__ import annotations

import contextlib
import http.server
import json
import math
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

import pipeflow as pf
from pipeflow.resume.state import fingerprint
from tests._servers import _Files, http_server
from tests._shards import ident, sample_id, write_shards

fsspec = pytest.importorskip("fsspec")
pytest.importorskip("aiohttp")

pytestmark = pytest.mark.timeout(120)

TIMEOUT, RETRIES = 0.5, 1
#: What a failed shard may take at most: its attempts, the back-off, and room for a loaded
#: machine (fsspec's first HTTP session, imports, threads starting).
BOUND = 30.0


def _bounded(fn: Callable[[], Any], limit: float = 60.0) -> tuple[Any, BaseException | None, float]:
    """``fn()`` in a daemon thread, joined for at most *limit* seconds: its result or error,
    and how long it took. A hang fails the test."""
    out: list[Any] = [None, None]

    def run() -> None:
        try:
            out[0] = fn()
        except BaseException as e:
            out[1] = e

    t0 = time.monotonic()
    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(limit)
    took = time.monotonic() - t0
    if thread.is_alive():
        pytest.fail(f"the read still waits after {limit:g} s: it hangs")
    return out[0], out[1], took


def _first_error(loader: Any) -> Callable[[], list[Any]]:
    """Iterate *loader* until its first error (raised), keeping what came before."""

    def run() -> list[Any]:
        got = []
        for sample in loader:
            got.append(sample)
        return got

    return run


# -- servers that do not answer -----------------------------------------------------------------
@contextlib.contextmanager
def silent_server() -> Iterator[str]:
    """A TCP server on 127.0.0.1 that accepts connections and never answers: its base URL."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(0.1)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except (TimeoutError, OSError):
                continue
            held.append(conn)  # kept open, never read from nor written to

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}"
    finally:
        stop.set()
        thread.join(5)
        listener.close()
        for conn in held:
            conn.close()


class _Stalls(_Files):
    """Serves a folder as :class:`tests._servers._Files` does, but answers only the first
    ``answered`` GETs in full (or, with ``stall_from``, those of a range that starts before
    that byte); the others get their headers and half their body, and nothing more until
    ``release`` is set."""

    answered = 0
    gets: ClassVar[list[str]] = []  # the GETs (the same list as ``requests``)
    stall_from: ClassVar[int | None] = None
    release = threading.Event()

    def _body(self, body: bytes, first: int) -> None:
        stall_from = self.stall_from
        if (stall_from is None and len(self.gets) <= self.answered) or (
            stall_from is not None and first < stall_from
        ):
            self.wfile.write(body)
            return
        self.wfile.write(body[: len(body) // 2])
        self.wfile.flush()
        self.release.wait(60)  # the body's rest never comes (until the test ends)
        self.close_connection = True


@contextlib.contextmanager
def stalling_server(
    folder: str, answered: int = 0, stall_from: int | None = None
) -> Iterator[tuple[str, type[_Stalls]]]:
    """:class:`_Stalls` over *folder* on a free loopback port: ``(base URL, handler)``. It
    answers the first *answered* GETs, or, with *stall_from*, every GET of a range that
    starts before that byte (whatever retries came first), and stalls the others."""
    gets: list[str] = []
    fields = {"folder": folder, "answered": answered, "stall_from": stall_from}
    fresh = {"gets": gets, "requests": gets, "heads": [], "faults": {}}
    handler: type[_Stalls] = type(
        "Stalls", (_Stalls,), {**fields, **fresh, "release": threading.Event()}
    )
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", handler
    finally:
        handler.release.set()
        server.shutdown()
        server.server_close()
        thread.join(5)


def _assert_timed_out(error: BaseException | None, url: str, took: float) -> None:
    assert isinstance(error, pf.ShardReadError), repr(error)
    text = str(error)
    assert url in text, text
    assert f"timed out after {TIMEOUT:g} s" in text, text
    assert f"failed {RETRIES + 1} times" in text, text
    assert took < BOUND, f"the shard failed after {took:.1f} s"


# -- async file systems (HTTP) --------------------------------------------------------------------
@pytest.mark.parametrize("reader", ["tar", "jsonl", "parquet"])
def test_a_store_that_never_answers_fails_the_shard_within_the_attempts(reader: str) -> None:
    make: Any = {"tar": pf.read_tar, "jsonl": pf.read_jsonl, "parquet": pf.read_parquet}[reader]
    with silent_server() as base:
        url = f"{base}/shard-0000.{reader}"
        loader = pf.shards([url]) | make(timeout=TIMEOUT, retries=RETRIES)
        _, error, took = _bounded(_first_error(loader))
    _assert_timed_out(error, url, took)


def test_a_store_that_sends_the_headers_then_stalls_the_body_fails_the_shard(
    tmp_path: Any,
) -> None:
    write_shards(str(tmp_path), [6])  # 12 KiB: a first block, a size, more blocks
    with stalling_server(str(tmp_path)) as (base, handler):
        url = f"{base}/shard-0000.tar"
        reader = pf.read_tar(timeout=TIMEOUT, retries=RETRIES, block_size=4096)
        _, error, took = _bounded(_first_error(pf.shards([url]) | reader))
        assert len(handler.gets) >= RETRIES + 1  # the requests were made, and stalled
    _assert_timed_out(error, url, took)
    assert "at byte 0" in str(error)


def test_a_block_that_stalls_mid_shard_fails_at_its_byte_after_the_samples_before_it(
    tmp_path: Any,
) -> None:
    write_shards(str(tmp_path), [6])  # 12 KiB in 4 KiB blocks: the third block stalls
    with stalling_server(str(tmp_path), stall_from=8192) as (base, _):
        url = f"{base}/shard-0000.tar"
        reader = pf.read_tar(timeout=TIMEOUT, retries=RETRIES, block_size=4096, window=1)
        got: list[Any] = []

        def run() -> None:
            for s in pf.shards([url]) | reader:
                got.append(ident(s))

        _, error, took = _bounded(run)
    _assert_timed_out(error, url, took)
    assert "at byte 8192" in str(error)
    assert got == [sample_id(0, i) for i in range(len(got))] and got  # the samples before
    last = f"the last 's0000_{len(got) - 1:05d}'"
    assert f"{len(got)} of its samples were delivered before it, {last}" in str(error)


def test_a_parquet_row_group_read_that_stalls_fails_the_shard(tmp_path: Any) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [os.urandom(512).hex() for _ in range(400)]  # ~400 KB, past the footer's read
    pq.write_table(pa.table({"x": rows}), str(tmp_path / "p.parquet"), row_group_size=100)
    for prefetch in (0, 2):  # the row groups read in the parser; the file opened ahead
        with stalling_server(str(tmp_path), answered=1) as (base, handler):
            url = f"{base}/p.parquet"
            reader = pf.read_parquet(timeout=TIMEOUT, retries=RETRIES, prefetch=prefetch)
            _, error, took = _bounded(_first_error(pf.shards([url]) | reader))
            assert len(handler.gets) >= 2  # the footer, then a row group's bytes stalled
        _assert_timed_out(error, url, took)


# -- a synchronous file system --------------------------------------------------------------------
_Base: Any = fsspec.AbstractFileSystem


class HangingFileSystem(_Base):  # type: ignore[misc]
    """A synchronous file system whose every call waits on an event that the test sets at
    its end (a store that never answers, reached through a blocking client)."""

    protocol = "pipeflow-hang"
    release = threading.Event()
    calls: ClassVar[list[str]] = []

    def _hang(self, what: str) -> None:
        self.calls.append(what)
        self.release.wait(60)
        raise OSError("released at the test's end")

    def info(self, path: str, **kwargs: Any) -> dict[str, Any]:
        self._hang("info")
        return {}

    def cat_file(self, path: str, start: Any = None, end: Any = None, **kwargs: Any) -> bytes:
        self._hang("cat_file")
        return b""

    def glob(self, path: str, **kwargs: Any) -> list[str]:
        self._hang("glob")
        return []


@pytest.fixture
def hanging() -> Iterator[type[HangingFileSystem]]:
    fsspec.register_implementation(HangingFileSystem.protocol, HangingFileSystem, clobber=True)
    HangingFileSystem.release.clear()
    HangingFileSystem.calls.clear()
    try:
        yield HangingFileSystem
    finally:
        HangingFileSystem.release.set()  # the lingering calls end, and their threads


def test_a_synchronous_file_system_that_never_returns_fails_the_shard(hanging: Any) -> None:
    url = "pipeflow-hang://bucket/shard-0.tar"
    loader = pf.shards([url]) | pf.read_tar(timeout=TIMEOUT, retries=RETRIES)
    _, error, took = _bounded(_first_error(loader))
    _assert_timed_out(error, url, took)
    assert hanging.calls[:2] == ["cat_file", "info"]  # each attempt a call, left to linger


def test_a_glob_whose_listing_never_ends_fails_at_build(hanging: Any) -> None:
    pattern = "pipeflow-hang://bucket/*.tar"
    _, error, took = _bounded(lambda: pf.shards(pattern, timeout=TIMEOUT))
    assert isinstance(error, TimeoutError), repr(error)
    assert pattern in str(error) and f"{TIMEOUT:g} s" in str(error) and "timeout=" in str(error)
    assert took < BOUND


# -- the argument -------------------------------------------------------------------------------
_BUILDERS: dict[str, Callable[[Any], Any]] = {
    "read_tar": lambda t: pf.read_tar(timeout=t),
    "read_jsonl": lambda t: pf.read_jsonl(timeout=t),
    "read_parquet": lambda t: pf.read_parquet(timeout=t),
    "shards": lambda t: pf.shards(["a.tar"], timeout=t),
}


@pytest.mark.parametrize("stage", sorted(_BUILDERS))
@pytest.mark.parametrize(
    ("value", "error"),
    [
        (None, TypeError),
        ("5", TypeError),
        (True, TypeError),
        (0, ValueError),
        (-1.0, ValueError),
        (math.inf, ValueError),
        (math.nan, ValueError),
    ],
)
def test_the_timeout_is_checked_when_the_stage_is_built(stage: str, value: Any, error: Any) -> None:
    with pytest.raises(error) as info:
        _BUILDERS[stage](value)
    assert str(info.value).startswith(f"{stage}: timeout must be"), str(info.value)
    assert repr(value) in str(info.value)


def test_the_timeout_is_a_setting_of_the_run_not_of_the_state(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [4, 3, 5])

    def identity(stage: Any) -> list[str]:
        loader = pf.from_iterable([]) | stage
        return fingerprint(loader.source, loader.stages)

    assert identity(pf.read_tar(timeout=1)) == identity(pf.read_tar(timeout=600))
    assert identity(pf.read_parquet(timeout=1)) == identity(pf.read_parquet())
    assert "timeout=2.5" in repr(pf.read_jsonl(timeout=2.5))

    def make(timeout: float) -> Any:
        return pf.shards(paths, seed=3) | pf.read_tar(timeout=timeout)

    full = [ident(s) for s in make(5)]
    loader = make(5)
    it = iter(loader)
    head = [ident(next(it)) for _ in range(5)]
    state = json.loads(json.dumps(loader.state_dict()))
    resumed = make(50)
    resumed.load_state_dict(state)
    assert head + [ident(s) for s in resumed] == full


# -- a shard that the store stops finding ------------------------------------------------------
def test_a_shard_gone_mid_read_is_a_failed_read_not_a_missing_shard(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [6, 6])  # 12 KiB each, in 1 KiB blocks
    names = [os.path.basename(p) for p in paths]
    with http_server(str(tmp_path)) as (base, handler):
        urls = [f"{base}/{n}" for n in names]
        reader = pf.read_tar(block_size=1024, window=1, retries=2, timeout=10)
        got: list[str] = []

        def run() -> None:
            for s in pf.shards(urls, shuffle=False) | reader:
                got.append(ident(s))
                if ident(s) == sample_id(0, 0):  # the store loses the shard being read
                    os.rename(paths[0], paths[0] + ".gone")

        _, error, took = _bounded(run)
        gone = [p for p in handler.requests if p.endswith(names[0])]
    assert isinstance(error, pf.ShardReadError), repr(error)
    text = str(error)
    assert names[0] in text and "does not exist" not in text, text
    assert "reading at byte" in text and "failed 3 times" in text and "was found" in text, text
    assert got and got == [sample_id(0, i) for i in range(len(got))]
    assert len(gone) >= 3  # the block's request was retried
    assert took < BOUND


def test_a_shard_missing_from_the_start_still_does_not_exist(tmp_path: Any) -> None:
    with http_server(str(tmp_path)) as (base, handler):
        url = f"{base}/nothing.tar"
        loader = pf.shards([url]) | pf.read_tar(retries=3, timeout=10)
        _, error, _ = _bounded(_first_error(loader))
        assert len(handler.requests) + len(handler.heads) == 1  # not retried
    assert isinstance(error, pf.ShardReadError) and "does not exist" in str(error)
    assert url in str(error)


def test_parquet_over_http_reads_every_row_and_resumes_through_the_bounded_requests(
    tmp_path: Any,
) -> None:
    pytest.importorskip("pyarrow")
    paths = write_shards(str(tmp_path), [7, 5, 4], kind="parquet")
    names = [os.path.basename(p) for p in paths]
    want = [sample_id(k, i) for k, n in enumerate([7, 5, 4]) for i in range(n)]
    with http_server(str(tmp_path)) as (base, handler):
        urls = [f"{base}/{n}" for n in names]
        for prefetch in (0, 2):  # the file opened in the parser; opened ahead in a thread
            handler.faults[names[1]] = 1  # a reset mid-file: retried, nothing read twice
            reader = pf.read_parquet(prefetch=prefetch, retries=2, timeout=10)

            def make(reader: Any = reader) -> Any:
                return pf.shards(urls, shuffle=False) | reader

            assert [ident(s) for s in make()] == want
            loader = make()
            it = iter(loader)
            head = [ident(next(it)) for _ in range(9)]
            state = json.loads(json.dumps(loader.state_dict()))
            resumed = make()
            resumed.load_state_dict(state)
            assert head + [ident(s) for s in resumed] == want
