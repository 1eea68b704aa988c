"""Sharded tar data: pipeflow against WebDataset, side by side in one run (issue 25).

The same tar shards (WebDataset layout: each sample a 3x32x32 ``uint8`` ``.npy`` and a
``.cls``), the same decode (``numpy.load`` and ``int``), batches of 64 collated into tensors,
2 worker processes each:

- pipeflow: ``parallel_source(shards(...) | read_tar() | map(pair) | batch(64) | collate(),
  workers=2, backend="process")``;
- WebDataset: ``WebDataset(urls, shardshuffle=100).decode().to_tuple("npy", "cls")`` through
  ``torch.utils.data.DataLoader(batch_size=64, num_workers=2)``.

Rows, each a median of repetitions that alternate which loader goes first:

1. samples/s on local shards;
2. samples/s from an S3-compatible server (moto, on 127.0.0.1) behind a proxy that adds 20 ms
   to every request before forwarding it: pipeflow through s3fs (``s3://`` URLs), WebDataset
   through its own ``http://`` opener (``curl``, one GET per shard) on presigned URLs;
3. resuming at 90% of an epoch from that store: the bytes the store served from the resume to
   the first batch, as a fraction of an epoch's bytes (WebDataset cannot resume: a fresh
   loader iterates the consumed 90% again), and the time to the first batch;
4. peak memory one local epoch adds (PSS of the main process and its workers).

Run: ``python -m benchmarks.shards [--quick]`` (needs ``pip install "pipeflow[bench,stream]"``
and ``moto[server]``, in the ``dev`` extra).
"""

from __future__ import annotations

import contextlib
import http.client
import http.server
import io
import json
import os
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import numpy as np
import torch.utils.data as tud

import pipeflow as pf
from benchmarks._harness import Row, cli, compare, count, median

WORKERS = 2
BATCH = 64
LATENCY = 0.020  # seconds added to every request to the store


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
class _Delay(http.server.BaseHTTPRequestHandler):
    """Forwards each request to the store after :data:`LATENCY`, counting the bytes of the
    bodies it returns; ``GET /__served__`` answers that count at once."""

    protocol_version = "HTTP/1.1"
    target: ClassVar[tuple[str, int]] = ("127.0.0.1", 0)
    served: ClassVar[list[int]] = [0, 0]  # bytes, requests
    local = threading.local()

    def _reply(self, status: int, headers: list[tuple[str, str]], data: bytes, size: str) -> None:
        self.send_response(status)
        for k, v in headers:
            if k.lower() not in ("connection", "transfer-encoding", "content-length"):
                self.send_header(k, v)
        self.send_header("Content-Length", size)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)
            self.served[0] += len(data)

    def _forward(self) -> None:
        if self.path == "/__served__":
            data = f"{self.served[0]} {self.served[1]}".encode()
            self._reply(200, [], data, str(len(data)))
            self.served[0] -= len(data)
            return
        time.sleep(LATENCY)
        self.served[1] += 1
        size = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(size) if size else None
        conn = getattr(self.local, "conn", None)
        if conn is None:
            conn = self.local.conn = http.client.HTTPConnection(*self.target)
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        conn.request(self.command, self.path, body, headers)
        reply = conn.getresponse()
        data = reply.read()
        length = str(len(data))
        if self.command == "HEAD":  # its Content-Length is the object's: pass it on
            length = reply.getheader("Content-Length", "0")
        self._reply(reply.status, reply.getheaders(), data, length)

    def do_GET(self) -> None:
        self._forward()

    def do_HEAD(self) -> None:
        self._forward()

    def log_message(self, *args: Any) -> None:
        pass


def serve(folder: str) -> None:
    """The store, run in a process of its own (so that serving does not take the
    benchmark's GIL): moto's S3 on the loopback holding the tar files of *folder* in the
    bucket ``bench``, behind a proxy adding :data:`LATENCY` per request. Prints one JSON
    line (the s3fs options, presigned http URLs of the shards, the proxy's URL), then serves
    until its stdin closes."""
    import logging

    import s3fs
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    moto = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    moto.start()
    host, port = moto.get_host_and_port()
    handler = type("Delay", (_Delay,), {"target": (host, port), "served": [0, 0]})
    handler.local = threading.local()
    proxy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
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
    signer = s3fs.S3FileSystem(**options)  # URLs through the proxy, signed for an hour
    signed = [signer.url(n, expires=3600) for n in names]
    print(json.dumps({"options": options, "signed": signed, "base": base}), flush=True)
    sys.stdin.read()  # until the benchmark closes it, or dies
    os._exit(0)


class Served:
    """What the store's proxy at *base* has served so far: bytes of bodies, requests."""

    def __init__(self, base: str) -> None:
        self.base = base

    def _counts(self) -> list[int]:
        with urllib.request.urlopen(self.base + "/__served__") as reply:
            return [int(x) for x in reply.read().split()]

    def __call__(self) -> int:
        return self._counts()[0]

    def requests(self) -> int:
        return self._counts()[1]


@contextlib.contextmanager
def slow_store(folder: str) -> Iterator[tuple[dict[str, Any], list[str], Served]]:
    """:func:`serve` in a subprocess: ``(s3fs options, presigned http URLs of the shards,
    what it has served so far)``."""
    child = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.shards", "--serve", folder],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        cwd=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
    )
    try:
        assert child.stdout is not None
        told = json.loads(child.stdout.readline())

        served = Served(told["base"])
        yield told["options"], told["signed"], served
    finally:
        if child.stdin is not None:
            child.stdin.close()
        try:
            child.wait(10)
        except subprocess.TimeoutExpired:
            child.kill()
            child.wait()


# -- the rows ----------------------------------------------------------------------------------
def rate_row(name: str, make: dict[str, Callable[[], Any]], reps: int, target: str) -> Row:
    rates = compare(make, reps)
    return Row(
        name,
        "samples/s",
        median(rates["pipeflow"]),
        median(rates["torch"]),
        target,
        note="'torch' column: WebDataset through torch's DataLoader",
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


def remote_rows(folder: str, paths: list[str], reps: int, name: str, resume: bool) -> list[Row]:
    """The rate from the slow store holding *paths* (and the resume rows, if *resume*)."""
    with slow_store(folder) as (options, signed, served):
        urls = [f"s3://bench/{os.path.basename(p)}" for p in paths]
        remote = {
            "pipeflow": lambda: pipeflow_loader(urls, options),
            "torch": lambda: webdataset_loader(signed),
        }
        before = served.requests()
        rows = [rate_row(name, remote, reps, ">= 3x")]
        per_shard = (served.requests() - before) / (2 * (reps + 1) * len(paths))
        rows[0].note += f"; {per_shard:.1f} requests per shard, the two loaders together"
        if resume:
            rows += resume_rows(remote, served, 3)
    return rows


def run(quick: bool) -> list[Row]:
    shards, per_shard, reps = (32, 100, 3) if quick else (64, 200, 5)
    with tempfile.TemporaryDirectory(prefix="pipeflow-shards-") as folder:
        paths = write_shards(folder, shards, per_shard)
        local = {
            "pipeflow": lambda: pipeflow_loader(paths),
            "torch": lambda: webdataset_loader(paths),
        }
        rows = [
            rate_row(f"local tar shards ({per_shard} samples), 2 workers", local, reps, ">= 1.5x")
        ]
        rows.append(memory_row(local, 3))
        name = f"S3, 20 ms per request, {per_shard}-sample shards"
        rows += remote_rows(folder, paths, reps, name, resume=True)
    with tempfile.TemporaryDirectory(prefix="pipeflow-shards-") as folder:
        small = write_shards(folder, shards * 5 // 2, 10)  # where the latency is the cost
        name = "S3, 20 ms per request, 10-sample shards"
        rows += remote_rows(folder, small, 3, name, resume=False)
    return rows


main = cli(__doc__, run)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--serve"]:
        serve(sys.argv[2])
    else:
        raise SystemExit(main())
