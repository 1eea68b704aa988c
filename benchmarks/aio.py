"""Coroutine functions in ``parallel_map`` against torch's DataLoader workers, on I/O.

Run: ``python -m benchmarks.aio [--quick] [--uvloop]`` (``--uvloop``: every event loop, the HTTP
server's too, is uvloop's). Two workloads, each side by side with torch in
one run (interleaved repetitions, medians):

1. **Simulated I/O**: 4,000 samples of 5 ms latency each, batch 16. torch: a DataLoader with
   16 workers whose ``__getitem__`` sleeps 5 ms. pipeflow: ``parallel_map`` over an
   ``async def`` that awaits ``asyncio.sleep(0.005)``, 512 in flight, on one event loop; then on
   two loops (threads) and on two worker processes (one loop each). By Little's law 512 in
   flight at 5 ms allow 102,400 samples/s, and torch's 16 workers (one sample at a time each)
   3,200/s.
2. **HTTP on loopback**: a server this benchmark starts in a child process, on 127.0.0.1 only,
   serves generated JPEGs (about 12 kB) after 5 ms of added latency. torch's 16 workers read
   each URL with ``urllib`` (blocking, a connection per request); pipeflow reads them with
   ``aiohttp`` (``pip install pipeflow[aio]``), 256 in flight on one loop. Every request has a
   10 s timeout and each run reads a bounded number of URLs. Skipped without aiohttp.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import io
import multiprocessing
import os
import sys
import time
import urllib.request
import weakref
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch.utils.data as tud

import pipeflow as pf
from benchmarks import datasets as data
from benchmarks._harness import Row, compare, median, table

LATENCY = 0.005
IN_FLIGHT = 512


# -- 1. simulated I/O -------------------------------------------------------------------------
@dataclass(frozen=True)
class AsyncRemote:
    """What :class:`benchmarks.datasets.Remote` returns, after awaiting the same latency."""

    latency: float = LATENCY

    async def __call__(self, i: int) -> tuple[np.ndarray, int]:
        await asyncio.sleep(self.latency)
        return np.full(16, i, dtype=np.float32), i


@dataclass(frozen=True)
class AsyncRemoteBatch:
    """A batch of indices at once: one coroutine gathers its samples' requests."""

    latency: float = LATENCY

    async def __call__(self, batch: list[int]) -> list[tuple[np.ndarray, int]]:
        one = AsyncRemote(self.latency)
        return list(await asyncio.gather(*(one(i) for i in batch)))


@dataclass(frozen=True)
class AsyncioAlone:
    """The same coroutines on one event loop with no pipeflow around them: a task per sample,
    *in_flight* at once, results batched and collated as the loaders' are. What one loop
    costs by itself on this machine: the ceiling for ``parallel_map`` on one loop."""

    n: int
    in_flight: int = IN_FLIGHT

    def __iter__(self) -> Iterator[Any]:
        done = asyncio.run(self._all())
        for i in range(0, self.n, 16):
            yield pf.default_collate(done[i : i + 16])

    async def _all(self) -> list[Any]:
        one, out = AsyncRemote(), [None] * self.n
        todo = iter(range(self.n))
        loop = asyncio.get_running_loop()
        finished = loop.create_future()
        left = [self.n]

        def start() -> None:
            i = next(todo, None)
            if i is not None:
                loop.create_task(one(i)).add_done_callback(lambda t, i=i: landed(i, t))

        def landed(i: int, task: asyncio.Task[Any]) -> None:
            out[i] = task.result()
            left[0] -= 1
            if left[0] == 0:
                finished.set_result(None)
            start()

        for _ in range(min(self.in_flight, self.n)):
            start()
        await finished
        return out


def simulated(quick: bool) -> list[Row]:
    n = 4000
    reps = 3 if quick else 7
    ideal = IN_FLIGHT / LATENCY

    def per_sample(workers: int, backend: str = "thread") -> pf.Loader:
        stage = pf.parallel_map(
            AsyncRemote(),
            workers=workers,
            backend=backend,
            max_in_flight=IN_FLIGHT,
            persistent=True,
        )
        return pf.indices(n) | stage | pf.batch(16) | pf.collate()

    def per_batch(workers: int, backend: str) -> pf.Loader:
        stage = pf.parallel_map(
            AsyncRemoteBatch(),
            workers=workers,
            backend=backend,
            max_in_flight=IN_FLIGHT // 16,
            persistent=True,
        )
        return pf.indices(n) | pf.batch(16) | stage | pf.collate()

    rates = compare(
        {
            "one loop": lambda: per_sample(1),
            "two loops (threads)": lambda: per_sample(2),
            "two processes": lambda: per_sample(2, "process"),
            "two processes, a coroutine per batch": lambda: per_batch(2, "process"),
            "asyncio alone, no pipeflow (one loop's ceiling)": lambda: AsyncioAlone(n),
            "torch": lambda: tud.DataLoader(
                data.Remote(n), batch_size=16, num_workers=16, persistent_workers=True
            ),
        },
        reps,
    )
    torch_rate = median(rates["torch"])
    notes = {
        "two loops (threads)": "two loops share one GIL with the consumer",
        "two processes": "each sample crosses a pipe both ways",
        "two processes, a coroutine per batch": "pf.batch(16) first: a pipe crossing per batch",
    }
    rows = []
    for name in rates:
        if name == "torch":
            continue
        rate = median(rates[name])
        note = f"Little's law allows {ideal:,.0f}/s: {rate / ideal:.0%} of it"
        rows.append(
            Row(
                f"5 ms I/O, async, 512 in flight, {name}",
                "samples/s",
                rate,
                torch_rate,
                ">= 10x" if name == "one loop" else "",
                note=f"{note}; {notes[name]}" if name in notes else note,
                samples=rates,
            )
        )
    return rows


# -- 2. HTTP on loopback ----------------------------------------------------------------------
def _jpegs(count: int = 8, size: int = 96) -> list[bytes]:
    """Noise images, JPEG-encoded: about 12 kB each."""
    from PIL import Image

    rng = np.random.default_rng(0)
    out = []
    for _ in range(count):
        pixels = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, format="JPEG", quality=90)
        out.append(buf.getvalue())
    return out


class _Http(asyncio.Protocol):
    """A minimal HTTP/1.1 server: ``GET /<i>.jpg``, keep-alive unless the client closes."""

    def __init__(self, images: list[bytes], latency: float) -> None:
        self.images = images
        self.latency = latency
        self.buffer = b""
        self.transport: Any = None

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, chunk: bytes) -> None:
        self.buffer += chunk
        while b"\r\n\r\n" in self.buffer:
            head, _, self.buffer = self.buffer.partition(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            i = int(path.rsplit(b"/", 1)[1].split(b".")[0])
            close = b"connection: close" in head.lower()
            loop = asyncio.get_running_loop()
            loop.call_later(self.latency, self._respond, self.images[i % len(self.images)], close)

    def _respond(self, body: bytes, close: bool) -> None:
        if self.transport.is_closing():
            return
        head = b"HTTP/1.1 200 OK\r\nContent-Type: image/jpeg\r\nContent-Length: %d\r\n%s\r\n" % (
            len(body),
            b"Connection: close\r\n" if close else b"",
        )
        self.transport.write(head + body)
        if close:
            self.transport.close()


def _serve(conn: Any, latency: float, parent: int) -> None:
    """The server process: 127.0.0.1 only, an ephemeral port sent back, until told to stop
    (or the benchmark's process is gone)."""

    async def main() -> None:
        loop = asyncio.get_running_loop()
        images = _jpegs()
        server = await loop.create_server(
            lambda: _Http(images, latency), "127.0.0.1", 0, backlog=1024
        )
        conn.send((server.sockets[0].getsockname()[1], len(images[0])))
        while not conn.poll() and os.getppid() == parent:
            await asyncio.sleep(0.2)
        server.close()

    asyncio.run(main())


@contextlib.contextmanager
def http_server(latency: float = LATENCY) -> Iterator[tuple[str, int]]:
    """Start the loopback server; yield its base URL and one image's size."""
    here, there = multiprocessing.Pipe()
    proc = multiprocessing.get_context("fork").Process(
        target=_serve, args=(there, latency, os.getpid()), daemon=True
    )
    proc.start()
    try:
        if not here.poll(10):
            raise RuntimeError("the benchmark's HTTP server did not start")
        port, size = here.recv()
        yield f"http://127.0.0.1:{port}", size
    finally:
        here.send(None)
        proc.join(2)
        if proc.is_alive():
            proc.kill()
            proc.join()


class UrlDataset:
    """torch's side: one blocking ``urllib`` request per sample."""

    def __init__(self, base: str, n: int) -> None:
        self.base = base
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        with urllib.request.urlopen(f"{self.base}/{i}.jpg", timeout=10) as r:
            return len(r.read()), i


#: Each event loop's aiohttp session, held open by an async generator: pipeflow shuts a loop's
#: async generators down when it stops the loop, which closes the session cleanly.
_SESSIONS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


async def _hold_session(box: asyncio.Future[Any]) -> Any:
    import aiohttp

    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:
        box.set_result(session)
        yield


async def session() -> Any:
    """This event loop's aiohttp session (made on first use, closed when the loop stops)."""
    loop = asyncio.get_running_loop()
    held = _SESSIONS.get(loop)
    if held is None:
        box: asyncio.Future[Any] = loop.create_future()
        holder = _hold_session(box)
        _SESSIONS[loop] = held = (box, holder)
        await holder.__anext__()
    return await held[0]


@dataclass(frozen=True)
class AsyncUrl:
    """pipeflow's side: the same URLs, read with aiohttp."""

    base: str

    async def __call__(self, i: int) -> tuple[int, int]:
        client = await session()
        async with client.get(f"{self.base}/{i}.jpg") as r:
            return len(await r.read()), i


class RawAiohttp:
    """The same requests from aiohttp alone, no pipeflow: one event loop in this thread, 256
    in flight, kept across epochs as the persistent loaders keep theirs. An iterable of
    batches, so that it is timed interleaved with the loaders."""

    def __init__(self, base: str, n: int, in_flight: int = 256) -> None:
        self.fetch = AsyncUrl(base)
        self.n = n
        self.in_flight = in_flight
        self.loop = asyncio.new_event_loop()

    async def _epoch(self) -> list[tuple[int, int]]:
        sem = asyncio.Semaphore(self.in_flight)

        async def one(i: int) -> tuple[int, int]:
            async with sem:
                return await self.fetch(i)

        return list(await asyncio.gather(*(one(i) for i in range(self.n))))

    def __iter__(self) -> Iterator[np.ndarray]:
        got = self.loop.run_until_complete(self._epoch())
        for k in range(0, len(got), 16):
            yield np.array([size for size, _ in got[k : k + 16]])

    def close(self) -> None:
        _, holder = _SESSIONS.pop(self.loop)
        self.loop.run_until_complete(holder.aclose())
        self.loop.close()


def http(quick: bool) -> list[Row]:
    try:
        import aiohttp  # noqa: F401
    except ImportError:
        print("aio: aiohttp is not installed (pip install pipeflow[aio]); HTTP rows skipped")
        return []
    n = 2000 if quick else 4000
    reps = 3 if quick else 5
    with http_server() as (base, size):

        def coroutines(workers: int, backend: str = "thread") -> pf.Loader:
            stage = pf.parallel_map(
                AsyncUrl(base), workers=workers, backend=backend, max_in_flight=256, persistent=True
            )
            return pf.indices(n) | stage | pf.batch(16) | pf.collate()

        rates = compare(
            {
                "one loop": lambda: coroutines(1),
                "two processes": lambda: coroutines(2, "process"),
                "aiohttp alone": lambda: RawAiohttp(base, n),
                "torch": lambda: tud.DataLoader(
                    UrlDataset(base, n), batch_size=16, num_workers=16, persistent_workers=True
                ),
            },
            reps,
        )
        raw = median(rates["aiohttp alone"])
    torch_rate = median(rates["torch"])
    return [
        Row(
            f"HTTP loopback, 5 ms, {size / 1000:.0f} kB JPEG: aiohttp, {name}",
            "samples/s",
            median(rates[name]),
            torch_rate,
            note=(
                "torch: 16 workers, urllib (a connection per request); pipeflow: 256 in flight;"
                f" aiohttp alone, no pipeflow: {raw:,.0f}/s"
            ),
            samples=rates,
        )
        for name in ("one loop", "two processes")
    ]


def run(quick: bool) -> list[Row]:
    return simulated(quick) + http(quick)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--uvloop", action="store_true", help="every event loop uvloop's (pip install uvloop)"
    )
    args = parser.parse_args(argv)
    if args.uvloop:  # pipeflow's loops, and asyncio alone's, follow the policy
        import uvloop

        asyncio.set_event_loop_policy(uvloop.EventLoopPolicy())
    started = time.perf_counter()
    print(table(run(args.quick)))
    print(f"({time.perf_counter() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
