"""Sharded tar data: pipeflow against WebDataset, side by side in one run (issue 25).

The same tar shards (WebDataset layout: each sample a 3x32x32 ``uint8`` ``.npy`` and a
``.cls``), the same decode (``numpy.load`` and ``int``), batches of 64 collated into tensors,
2 worker processes each:

- pipeflow: ``parallel_source(shards(...) | read_tar() | map(pair) | batch(64) | collate(),
  workers=2, backend="process")``;
- WebDataset: ``WebDataset(urls, shardshuffle=100).decode().to_tuple("npy", "cls")`` through
  ``torch.utils.data.DataLoader(batch_size=64, num_workers=2)``.

Rows, each a median of repetitions that alternate which loader goes first:

1. the store's own latency, first, so that a reader sees the store is honest: the median of
   50 GETs of a 1 KB object through it, over one kept-alive connection (as s3fs, pipeflow's
   client, reaches it) and over a new connection each (as ``curl``, WebDataset's, does),
   against the 20 ms it declares;
2. samples/s on local shards;
3. samples/s from an S3-compatible server (moto, on 127.0.0.1) behind a proxy that adds 20 ms
   to every request before forwarding it: pipeflow through s3fs (``s3://`` URLs), WebDataset
   through its own ``http://`` opener (``curl``, one GET per shard) on presigned URLs. The
   proxy adds those 20 ms and nothing else: ``TCP_NODELAY`` on its sockets (accepted and to
   moto), each reply's headers and body in one write, and a listen backlog of 128. Without
   the first two, a kept-alive GET of a reply smaller than a loopback segment (64 KB: the
   1 KB object, a 10-sample shard) waits on Nagle's algorithm and delayed ACKs, about 44 ms
   more, which a new connection per request, as ``curl``'s, escapes; with socketserver's
   backlog of 5, a burst of new connections (fresh workers opening theirs at once, as
   pipeflow's do at each pass) overflows it, and each connection dropped waits a second for
   its SYN to be sent again. Both favoured WebDataset. Each rate's note says, per loader,
   the requests per shard and the mean number of requests in flight;
4. resuming at 90% of an epoch from that store: the bytes the store served from the resume to
   the first batch, as a fraction of an epoch's bytes (WebDataset cannot resume: a fresh
   loader iterates the consumed 90% again), and the time to the first batch;
5. peak memory one local epoch adds (PSS of the main process and its workers).

Run: ``python -m benchmarks.shards [--quick] [--nagle]`` (needs ``pip install
"pipeflow[bench,stream]"`` and ``moto[server]``, in the ``dev`` extra). ``--nagle`` first prints
the store's rows with the store as it was before (headers and body written apart, no
``TCP_NODELAY``, a listen backlog of 5), then the whole table with the store as it is: before
and after in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import http.server
import io
import json
import os
import socket
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import torch.utils.data as tud

import pipeflow as pf
from benchmarks._harness import Row, compare, count, median, table

WORKERS = 2
BATCH = 64
LATENCY = 0.020  # seconds added to every request to the store
NAGLE = (
    "the store as it was before: headers and body written apart, no TCP_NODELAY, "
    "a listen backlog of 5"
)
BACKLOG = 128  # connections the store's proxy queues before accepting them (moto's too)
SMALL = 1024  # bytes of the object whose GETs measure the store's latency


# -- the data ----------------------------------------------------------------------------------
def write_shards(folder: str, shards: int, per_shard: int) -> list[str]:
    """*shards* tar files of *per_shard* samples (``.npy`` and ``.cls``); their paths."""
    rng = np.random.default_rng(0)
    paths = []
    for k in range(shards):
        path = os.path.join(folder, f"train-{k:04d}.tar")
        with tarfile.open(path, "w") as tar:
            for i in range(per_shard):
                buf = io.BytesIO()
                np.save(buf, rng.integers(0, 256, (3, 32, 32), dtype=np.uint8))
                for ext, data in (("npy", buf.getvalue()), ("cls", str(i % 10).encode())):
                    info = tarfile.TarInfo(f"{k:04d}_{i:05d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
        paths.append(path)
    return paths


def pair(sample: dict[str, Any]) -> tuple[Any, int]:
    """What both loaders make of a sample: ``(array, class)``."""
    return sample["npy"], sample["cls"]


# -- the loaders -------------------------------------------------------------------------------
def pipeflow_loader(urls: list[str], options: dict[str, Any] | None = None) -> pf.Loader[Any]:
    """pipeflow's: shards split across the workers, read, decoded, batched and collated in
    the workers."""
    shards = pf.shards(urls, seed=0, storage_options=options)
    inner = shards | pf.read_tar(storage_options=options) | pf.map(pair)
    inner = inner | pf.batch(BATCH) | pf.collate()
    return pf.parallel_source(inner, workers=WORKERS, backend="process")


def webdataset_loader(urls: list[str]) -> tud.DataLoader[Any]:
    """WebDataset's, through torch's DataLoader (the shards split by worker, its default)."""
    import webdataset as wds

    ds = wds.WebDataset(urls, shardshuffle=100, seed=0).decode().to_tuple("npy", "cls")
    return tud.DataLoader(ds, batch_size=BATCH, num_workers=WORKERS)


# -- the store: moto's S3, 20 ms away ----------------------------------------------------------
class _Upstream(http.client.HTTPConnection):
    """A connection to moto with ``TCP_NODELAY`` set (unless the store is the old one)."""

    nagle = False

    def connect(self) -> None:
        super().connect()
        if not self.nagle:
            self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


class _Delay(http.server.BaseHTTPRequestHandler):
    """Forwards each request to the store after :data:`LATENCY`, counting the bytes of the
    bodies it returns, the requests, and the seconds they spent in the proxy (their sum over
    a span of time is the mean number in flight); ``GET /__served__`` answers those counts at
    once.

    It adds :data:`LATENCY` and nothing more: ``TCP_NODELAY`` on the sockets it accepts (the
    stdlib's ``disable_nagle_algorithm``) and on those to moto, and a reply's status line,
    headers and body in one write (and, in :func:`serve`, a listen backlog of
    :data:`BACKLOG`). With :attr:`nagle` (:data:`NAGLE`) it is the proxy as it was: headers
    and body in two writes, Nagle's algorithm on, socketserver's backlog of 5."""

    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True
    nagle: ClassVar[bool] = False
    target: ClassVar[tuple[str, int]] = ("127.0.0.1", 0)
    served: ClassVar[list[float]] = [0, 0, 0.0]  # bytes, requests, seconds in the proxy
    lock = threading.Lock()
    local = threading.local()

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes, size: str) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", size)
        body = data if self.command != "HEAD" else b""
        if self.nagle:
            self.end_headers()
            if body:
                self.wfile.write(body)
        else:  # one write: the status line and headers (buffered by send_header), the body
            self._headers_buffer.append(b"\r\n" + body)  # what end_headers appends, and more
            self.flush_headers()
        with self.lock:
            self.served[0] += len(body)

    def _forward(self) -> None:
        if self.path == "/__served__":
            with self.lock:
                data = " ".join(map(str, self.served)).encode()
            self._reply(200, [], data, str(len(data)))
            with self.lock:
                self.served[0] -= len(data)
            return
        start = time.perf_counter()
        time.sleep(LATENCY)
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else None
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = _Upstream(*self.target)
            conn.nagle = self.nagle
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body, headers)
        reply = conn.getresponse()
        data = reply.read()
        length = str(len(data))
        if self.command == "HEAD":  # its Content-Length is the object's: pass it on
            length = reply.getheader("Content-Length", "0")
        self._reply(reply.status, reply.getheaders(), data, length)
        with self.lock:
            self.served[1] += 1
            self.served[2] += time.perf_counter() - start

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def log_message(self, *args: Any) -> None:
        pass


def serve(folder: str, nagle: bool = False) -> None:
    """The store, run in a process of its own (so that serving does not take the
    benchmark's GIL): moto's S3 on the loopback holding the tar files of *folder* in the
    bucket ``bench`` (and a :data:`SMALL`-byte object, ``small``), behind a proxy adding
    :data:`LATENCY` per request (*nagle*: the proxy as it was, :data:`NAGLE`). Prints one JSON
    line (the s3fs options, presigned http URLs of the shards and of the small object, the
    proxy's URL), then serves until its stdin closes."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    handler = type(
        "Delay",
        (_Delay,),
        {
            "target": (host, port),
            "served": [0, 0, 0.0],
            "nagle": nagle,
            "disable_nagle_algorithm": not nagle,
            "lock": threading.Lock(),
            "local": threading.local(),
        },
    )
    server = type(
        "Proxy",
        (http.server.ThreadingHTTPServer,),
        {"request_queue_size": 5 if nagle else BACKLOG},
    )
    proxy = server(("127.0.0.1", 0), handler)
    threading.Thread(target=proxy.serve_forever, daemon=True).start()
    base = f"http://127.0.0.1:{proxy.server_port}"
    options = {
        "key": "bench",
        "secret": "bench",
        "client_kwargs": {"endpoint_url": base, "region_name": "us-east-1"},
        "skip_instance_cache": True,
    }
    direct = s3fs.S3FileSystem(
        **{**options, "client_kwargs": {"endpoint_url": f"http://{host}:{port}"}}
    )
    direct.mkdir("bench")
    names = [f"bench/{n}" for n in sorted(os.listdir(folder)) if n.endswith(".tar")]
    for n in names:
        direct.put(os.path.join(folder, os.path.basename(n)), n)
    direct.pipe("bench/small", bytes(SMALL))
    signer = s3fs.S3FileSystem(**options)  # URLs through the proxy, signed for an hour
    signed = [signer.url(n, expires=3600) for n in names]
    small = signer.url("bench/small", expires=3600)
    told = {"options": options, "signed": signed, "small": small, "base": base}
    print(json.dumps(told), flush=True)
    sys.stdin.read()  # until the benchmark closes it, or dies
    os._exit(0)


class Served:
    """What the store's proxy at *base* has served so far: bytes of bodies, requests, and
    the seconds requests spent in it; *small*: a presigned URL of a :data:`SMALL`-byte
    object."""

    def __init__(self, base: str, small: str = "") -> None:
        self.base = base
        self.small = small

    def counts(self) -> tuple[int, int, float]:
        """``(bytes, requests, seconds in the proxy)`` so far."""
        with urllib.request.urlopen(self.base + "/__served__") as reply:
            data, requests, seconds = reply.read().split()
        return int(data), int(requests), float(seconds)

    def __call__(self) -> int:
        return self.counts()[0]

    def requests(self) -> int:
        return self.counts()[1]

    def latency(self, n: int = 50, keep_alive: bool = True) -> float:
        """Median seconds of *n* GETs of the small object through the store: over one
        kept-alive connection (after one GET that opens it), or each over a new one."""
        url = urllib.parse.urlsplit(self.small)
        path = f"{url.path}?{url.query}"
        opening = 1 if keep_alive else 0  # the GET that opens the kept-alive connection
        times = []
        conn = None
        for _ in range(opening + n):
            if conn is None:
                conn = http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port)
            start = time.perf_counter()
            conn.request("GET", path)
            with conn.getresponse() as reply:
                got = len(reply.read())
            times.append(time.perf_counter() - start)
            if reply.status != 200 or got != SMALL:
                raise RuntimeError(f"the store answered {reply.status}, {got} bytes")
            if not keep_alive:
                conn.close()
                conn = None
        if conn is not None:
            conn.close()
        return median(times[opening:])


@contextlib.contextmanager
def slow_store(
    folder: str, nagle: bool = False
) -> Iterator[tuple[dict[str, Any], list[str], Served]]:
    """:func:`serve` in a subprocess: ``(s3fs options, presigned http URLs of the shards,
    what it has served so far)``; *nagle*: the store as it was (:data:`NAGLE`)."""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.shards", "--serve", folder]
        + (["--nagle"] if nagle else []),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        assert child.stdout is not None
        told = json.loads(child.stdout.readline())

        served = Served(told["base"], told["small"])
        yield told["options"], told["signed"], served
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


class _Metered:
    """A loader whose passes the store meters: the requests they made, and the seconds
    those spent in the proxy and the passes took (their ratio: the mean in flight)."""

    def __init__(self, loader: Any, served: Served) -> None:
        self.loader, self.served = loader, served
        self.requests, self.busy, self.wall, self.passes = 0, 0.0, 0.0, 0

    def __iter__(self) -> Iterator[Any]:
        _, requests, busy = self.served.counts()
        start = time.perf_counter()
        yield from self.loader
        self.wall += time.perf_counter() - start
        _, now, then = self.served.counts()
        self.requests, self.busy, self.passes = (
            self.requests + now - requests,
            self.busy + then - busy,
            self.passes + 1,
        )

    def close(self) -> None:
        close = getattr(self.loader, "close", None)
        if close is not None:
            close()


# -- the rows ----------------------------------------------------------------------------------
def rate_row(
    name: str,
    make: dict[str, Callable[[], Any]],
    reps: int,
    target: str,
    served: Served | None = None,
    shards: int = 0,
) -> Row:
    """Samples/s of each loader; from the store (*served*, holding *shards* shards), the
    note says each loader's requests per shard and mean number of requests in flight."""
    metered: dict[str, _Metered] = {}

    def meter(name: str, fn: Callable[[], Any]) -> Callable[[], Any]:
        def made() -> Any:
            assert served is not None
            metered[name] = _Metered(fn(), served)
            return metered[name]

        return made

    if served is not None:
        make = {k: meter(k, fn) for k, fn in make.items()}
    rates = compare(make, reps)
    note = "'torch' column: WebDataset through torch's DataLoader"
    for k, who in (("pipeflow", "pipeflow"), ("torch", "WebDataset")):
        m = metered.get(k)
        if m is not None and m.passes and m.wall:
            note += (
                f"; {who}: {m.requests / (m.passes * shards):.2f} requests per shard, "
                f"{m.busy / m.wall:.1f} in flight"
            )
    return Row(
        name,
        "samples/s",
        median(rates["pipeflow"]),
        median(rates["torch"]),
        target,
        note=note,
        samples=rates,
    )


def _resumed(make: Callable[[], Any], state: dict[str, Any] | None, skip: int) -> float:
    """Seconds from building a loader (and loading *state*) to its batch after *skip*; the
    loader then reads the rest of its epoch (so the store serves all it reads)."""
    start = time.perf_counter()
    loader = make()
    if state is not None:
        loader.load_state_dict(state)
    it = iter(loader)
    for _ in range(skip + 1):
        next(it)
    elapsed = time.perf_counter() - start
    for _ in it:
        pass
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return elapsed


def _state_at_90(make: Callable[[], Any]) -> tuple[dict[str, Any], int, float, list[int]]:
    """A pipeflow loader's epoch: its state after 90% of the batches, how many, the
    epoch's time, and each batch's size."""
    loader = make()
    start = time.perf_counter()
    sizes = [count(b) for b in loader]
    epoch = time.perf_counter() - start
    k = len(sizes) * 9 // 10
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = loader.state_dict()
    del it
    loader.close()
    return state, k, epoch, sizes


def resume_rows(
    make: dict[str, Callable[[], Any]], served: Callable[[], int], reps: int
) -> list[Row]:
    """Resume at 90% of an epoch from the store: the bytes read again (what the resumed
    pass read to the epoch's end, less the bytes of the samples left, as fractions of the
    epoch's), and the time to the first batch (as a fraction of the epoch's time)."""
    again: dict[str, list[float]] = {"pipeflow": [], "torch": []}
    times: dict[str, list[float]] = {"pipeflow": [], "torch": []}
    seconds: dict[str, list[float]] = {"pipeflow": [], "torch": []}
    for _ in range(reps):
        before = served()
        state, k, epoch, sizes = _state_at_90(make["pipeflow"])
        whole = (served() - before) / 2  # the epoch read twice: the whole, then to 90%
        left = sum(sizes[k:]) / sum(sizes)
        for name, loaded in (("pipeflow", state), ("torch", None)):
            before = served()
            took = _resumed(make[name], loaded, k if loaded is None else 0)
            again[name].append(max((served() - before) / whole - left, 0.0))
            times[name].append(took / epoch)
            seconds[name].append(took)
    note = "'torch' column: WebDataset, which iterates the consumed 90% again"
    took = (
        f"{median(seconds['pipeflow']):.2f} s against {median(seconds['torch']):.2f} s; a fresh "
        "loader's start (2 workers, their S3 clients) is part of both"
    )
    return [
        Row(
            "resume at 90% from the store: bytes re-read",
            "of epoch",
            median(again["pipeflow"]),
            median(again["torch"]),
            "pipeflow < 0.01",
            note=note,
            higher_is_better=False,
            samples=again,
        ),
        Row(
            "  same, time to the first batch",
            "of epoch",
            median(times["pipeflow"]),
            median(times["torch"]),
            "",
            note=took,
            higher_is_better=False,
            samples=times,
        ),
    ]


def _peak(make: Callable[[], Any]) -> float:
    """MB that one epoch of a fresh loader adds to this process and its workers (PSS of
    anonymous and shared-memory pages, sampled every 20 ms), at its peak."""
    from benchmarks.memory import _sample

    root = os.getpid()
    loader = make()
    base = _sample(root)["unique"]
    peak, done = base, threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.wait(0.02):
            peak = max(peak, _sample(root)["unique"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    for _ in loader:
        peak = max(peak, _sample(root)["unique"])
    done.set()
    watcher.join()
    close = getattr(loader, "close", None)
    if close is not None:
        close()
    return (peak - base) / 1e6


def memory_row(make: dict[str, Callable[[], Any]], reps: int) -> Row:
    peaks: dict[str, list[float]] = {"pipeflow": [], "torch": []}
    for rep in range(reps):
        for name in ("pipeflow", "torch") if rep % 2 == 0 else ("torch", "pipeflow"):
            peaks[name].append(_peak(make[name]))
    return Row(
        "peak memory an epoch adds, local",
        "MB",
        median(peaks["pipeflow"]),
        median(peaks["torch"]),
        "",
        higher_is_better=False,
        samples=peaks,
    )


def latency_row(served: Served) -> Row:
    """The store's latency: a kept-alive GET (s3fs's way) and a GET on a new connection
    (``curl``'s), medians of 50, in ms."""
    kept, fresh = served.latency(keep_alive=True) * 1e3, served.latency(keep_alive=False) * 1e3
    declared = LATENCY * 1e3
    return Row(
        f"the store: a 1 KB GET, {declared:.0f} ms declared",
        "ms",
        kept,
        fresh,
        "",
        note=f"'pipeflow' column: one kept-alive connection, as s3fs; 'torch': a new one per "
        f"GET, as WebDataset's curl; medians of 50: {kept - declared:+.1f} ms and "
        f"{fresh - declared:+.1f} ms on the {declared:.0f} ms declared",
        higher_is_better=False,
    )


def remote_rows(
    folder: str, paths: list[str], reps: int, name: str, resume: bool, nagle: bool = False
) -> list[Row]:
    """The store's latency (see :func:`latency_row`), then the rate from the slow store
    holding *paths* (and the resume rows, if *resume*); *nagle*: the store as it was
    (:data:`NAGLE`)."""
    with slow_store(folder, nagle) as (options, signed, served):
        urls = [f"s3://bench/{os.path.basename(p)}" for p in paths]
        remote = {
            "pipeflow": lambda: pipeflow_loader(urls, options),
            "torch": lambda: webdataset_loader(signed),
        }
        rows = [latency_row(served), rate_row(name, remote, reps, ">= 3x", served, len(paths))]
        if resume:
            rows += resume_rows(remote, served, 3)
    return rows


def run(quick: bool, nagle: bool = False, local: bool = True) -> list[Row]:
    """The suite's rows, the store's latency first; *nagle*: with the store as it was
    (:data:`NAGLE`); *local*: with the rows on local shards (which don't use the store)."""
    shards, per_shard, reps = (32, 100, 3) if quick else (64, 200, 5)
    rows = []
    with tempfile.TemporaryDirectory(prefix="pipeflow-shards-") as folder:
        paths = write_shards(folder, shards, per_shard)
        if local:
            loaders = {
                "pipeflow": lambda: pipeflow_loader(paths),
                "torch": lambda: webdataset_loader(paths),
            }
            name = f"local tar shards ({per_shard} samples), 2 workers"
            rows.append(rate_row(name, loaders, reps, ">= 1.5x"))
            rows.append(memory_row(loaders, 3))
        name = f"S3, 20 ms per request, {per_shard}-sample shards"
        store, *remote = remote_rows(folder, paths, reps, name, resume=True, nagle=nagle)
        rows = [store, *rows, *remote]
    with tempfile.TemporaryDirectory(prefix="pipeflow-shards-") as folder:
        small = write_shards(folder, shards * 5 // 2, 10)  # where the latency is the cost
        name = "S3, 20 ms per request, 10-sample shards"
        again, *remote = remote_rows(folder, small, 3, name, resume=False, nagle=nagle)
        remote[0].note += f"; this store: a kept-alive GET {again.pipeflow:.1f} ms"
        rows += remote
    return rows


def main(argv: list[str] | None = None) -> int:
    """Print the suite's table; with ``--nagle``, the store's rows with the store as it was
    (:data:`NAGLE`) first."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="a short run (32 shards of 100)")
    parser.add_argument(
        "--nagle",
        action="store_true",
        help=f"first the store's rows with {NAGLE} (a kept-alive GET then waits on Nagle's "
        "algorithm and delayed ACKs), then the whole table with the store as it is: before "
        "and after in one run",
    )
    args = parser.parse_args(argv)
    if args.nagle:
        print(f"before: {NAGLE}")
        print(table(run(args.quick, nagle=True, local=False), args.quick))
        print(
            f"\nafter: TCP_NODELAY on the store's sockets, a reply in one write, a listen "
            f"backlog of {BACKLOG}"
        )
    print(table(run(args.quick), args.quick))
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2], nagle=sys.argv[3:4] == ["--nagle"])
    else:
        raise SystemExit(main())
