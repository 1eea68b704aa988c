"""pipeflow against its peers on the same workloads at the same parallelism: torch's
DataLoader, torchdata.nodes, Grain and SPDL, each used as its documentation recommends.

Run: ``python -m pipeflow bench peers [--quick]`` (or ``python -m benchmarks.peers``) from a
checkout. A peer that is not installed is skipped with a note; ``pip install 'pipeflow[peers]'``
installs them all (in their own environment: Grain and SPDL bring their own dependencies).

Every loader is built once and its epochs alternate with the others' (``benchmarks._harness.
compare``); a row shows the medians and pipeflow's ratio to that peer, with the goal of
issue 28: at least 1.1x, or, where the peer is already near this machine's limit (the
workload's time per sample on one core, times the cores used; for I/O, Little's law with one
sample's measured latency),
pipeflow within 5% of that limit, printed beside the row. An epoch is a fresh iterator, as in
training: worker processes start and stop in it for every library (none is kept between
epochs), so a pass's fixed costs count, as they do for a user's validation loop.
"""

from __future__ import annotations

import asyncio
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import pipeflow as pf
from benchmarks import datasets as data
from benchmarks import peers_first
from benchmarks._harness import Row, cli, compare, median

PEERS = ("torch", "nodes", "grain", "spdl")
#: Which module each peer is, to find out whether it is installed.
MODULES = {"torch": "torch", "nodes": "torchdata.nodes", "grain": "grain", "spdl": "spdl.pipeline"}
INSTALL = "pip install 'pipeflow[peers]'"
CORES = 2  # the workloads' parallelism: 2 workers (the I/O rows: 32 in flight)


def installed(peer: str) -> bool:
    """Whether *peer*'s package can be imported here."""
    try:
        return importlib.util.find_spec(MODULES[peer]) is not None
    except ModuleNotFoundError:  # its parent package is missing
        return False


@dataclass(frozen=True)
class Workload:
    """One workload: its dataset, batch size, and how it runs in parallel."""

    name: str
    dataset: Any
    batch: int
    #: "process" (CPU work: 2 workers), "thread" (I/O: 32 in flight), "async" (coroutines),
    #: "facade" (pf.DataLoader against torch's DataLoader only, the same arguments)
    kind: str
    workers: int
    #: samples/s no loader can pass here (Little's law), if known in advance; the thread rows
    #: measure theirs (:func:`latency`), the process rows one core's rate
    limit: float | None = None


class FetchCollate:
    """A batch of indices to a collated batch, in a worker (nodes, SPDL): what torch's
    DataLoader does in its workers, with torch's own ``default_collate``."""

    def __init__(self, dataset: Any) -> None:
        self.dataset = dataset

    def __call__(self, idx: list[int]) -> Any:
        from torch.utils.data import default_collate

        return default_collate([self.dataset[i] for i in idx])


def _collate(items: list[Any]) -> Any:
    from torch.utils.data import default_collate

    return default_collate(items)


class Epochs:
    """A loader rebuilt for each epoch by *make* (SPDL: a pipeline runs once), closed after."""

    def __init__(self, make: Callable[[], Any]) -> None:
        self.make = make

    def __iter__(self) -> Iterator[Any]:
        pipeline = self.make()
        with pipeline.auto_stop():
            yield from pipeline


# -- each library's loader ------------------------------------------------------------------
def pipeflow_loader(w: Workload) -> Any:
    ds = w.dataset
    if w.kind == "facade":
        return pf.DataLoader(ds, w.batch, num_workers=w.workers, multiprocessing_context="fork")
    if w.kind == "process":
        work = pf.fetch(ds) | pf.collate()
        stage = pf.parallel_map(work, workers=w.workers, backend="process", mp_context="fork")
        return pf.indices(ds) | pf.batch(w.batch) | stage
    fn: Any = pf.fetch(ds) if w.kind == "thread" else AsyncRemote()
    if w.kind == "async":  # one event loop, *workers* coroutines at once
        stage = pf.parallel_map(fn, workers=1, backend="thread", max_in_flight=w.workers)
    else:  # threads: the default 2 items out per thread, as torchdata.nodes' ParallelMapper
        stage = pf.parallel_map(fn, workers=w.workers, backend="thread")
    return pf.indices(ds) | stage | pf.batch(w.batch) | pf.collate()


def torch_loader(w: Workload) -> Any:
    import torch.utils.data as tud

    if w.kind == "async":
        return None  # torch has no coroutine workers (benchmarks.aio: 16 processes)
    workers = min(w.workers, 16)  # I/O: 16 processes, as benchmarks.throughput runs it
    return tud.DataLoader(
        w.dataset, batch_size=w.batch, num_workers=workers, multiprocessing_context="fork"
    )


def nodes_loader(w: Workload) -> Any:
    import torch.utils.data as tud
    import torchdata.nodes as tn

    if w.kind in ("async", "facade"):
        return None
    node: Any = tn.SamplerWrapper(tud.SequentialSampler(w.dataset))
    if w.kind == "process":
        node = tn.Batcher(node, batch_size=w.batch)
        node = tn.ParallelMapper(
            node,
            FetchCollate(w.dataset),
            num_workers=w.workers,
            method="process",
            multiprocessing_context="fork",
        )
    else:
        node = tn.ParallelMapper(
            node, w.dataset.__getitem__, num_workers=w.workers, method="thread"
        )
        node = tn.Mapper(tn.Batcher(node, batch_size=w.batch), _collate)
    return tn.Loader(node)


def grain_loader(w: Workload) -> Any:
    import grain

    if w.kind in ("async", "facade"):
        return None
    ds = grain.MapDataset.source(w.dataset)
    if w.kind == "process":
        options = grain.MultiprocessingOptions(num_workers=w.workers)
        return ds.batch(w.batch).to_iter_dataset().mp_prefetch(options)
    read = grain.ReadOptions(num_threads=w.workers, prefetch_buffer_size=w.workers)
    return ds.to_iter_dataset(read).batch(w.batch)


def spdl_loader(w: Workload) -> Any:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    from spdl.pipeline import PipelineBuilder

    n = len(w.dataset)
    if w.kind == "facade":
        return None

    def make() -> Any:
        builder: Any = PipelineBuilder().add_source(range(n))
        if w.kind == "process":
            pool = ProcessPoolExecutor(w.workers, mp_context=multiprocessing.get_context("fork"))
            builder = builder.aggregate(w.batch).pipe(
                FetchCollate(w.dataset), concurrency=w.workers, executor=pool, output_order="input"
            )
        else:
            fn: Any = w.dataset.__getitem__ if w.kind == "thread" else AsyncRemote()
            builder = builder.pipe(fn, concurrency=w.workers, output_order="input")
            builder = builder.aggregate(w.batch).pipe(_collate)
        return builder.add_sink(4).build(num_threads=min(w.workers, 32))

    return Epochs(make)


LOADERS: dict[str, Callable[[Workload], Any]] = {
    "torch": torch_loader,
    "nodes": nodes_loader,
    "grain": grain_loader,
    "spdl": spdl_loader,
}


class AsyncRemote:
    """The coroutine of benchmarks.aio: 5 ms of awaited latency, then a small array."""

    async def __call__(self, i: int) -> tuple[np.ndarray, int]:
        await asyncio.sleep(0.005)
        return np.full(16, i, dtype=np.float32), i


class Inline:
    """The same work as a process workload's, in this process, on one core: the limit's
    measure (its rate times the cores used)."""

    def __init__(self, w: Workload) -> None:
        self.w = w

    def __iter__(self) -> Iterator[Any]:
        return iter(
            pf.indices(self.w.dataset)
            | pf.batch(self.w.batch)
            | pf.fetch(self.w.dataset)
            | pf.collate()
        )


def latency(dataset: Any, calls: int = 100) -> float:
    """Seconds one ``dataset[i]`` takes alone (the median of three runs): ``time.sleep(0.005)``
    overshoots 5 ms (timer slack, the wake-up), which the thread rows' limit must count."""
    runs = []
    for _ in range(3):
        start = time.perf_counter()
        for i in range(calls):
            dataset[i]
        runs.append((time.perf_counter() - start) / calls)
    return median(runs)


# -- the rows -------------------------------------------------------------------------------
def workloads(quick: bool) -> list[Workload]:
    k = 1 if quick else 3
    return [
        Workload("tiny samples, batch 64, 2 processes", data.Points(20_000 * k), 64, "process", 2),
        Workload(
            "numpy ~1 ms/sample, batch 16, 2 processes",
            data.NumpyAugment(300 * k),
            16,
            "process",
            2,
        ),
        Workload(
            "numpy ~1 ms/sample, batch 16, 2 processes: pf.DataLoader",
            data.NumpyAugment(300 * k),
            16,
            "facade",
            2,
        ),
        Workload(
            "pure Python ~1 ms/sample, batch 16, 2 processes",
            data.PythonWork(300 * k),
            16,
            "process",
            2,
        ),
        Workload("602 KB samples, batch 32, 2 processes", data.Images(320 * k), 32, "process", 2),
        Workload(
            "I/O 5 ms/sample, batch 64, 32 threads",
            data.Remote(1000 * k),
            64,
            "thread",
            32,
        ),
        Workload(
            "coroutine I/O 5 ms/sample, batch 16, 512 in flight",
            data.Remote(4000 * k),
            16,
            "async",
            512,
            limit=512 / 0.005,
        ),
    ]


def one(w: Workload, quick: bool) -> list[Row]:
    """Every installed peer against pipeflow on *w*, alternating, in one run."""
    make: dict[str, Callable[[], Any]] = {"pipeflow": lambda: pipeflow_loader(w)}
    missing = []
    for peer in PEERS:
        if not installed(peer):
            missing.append(peer)
        elif LOADERS[peer](w) is not None:
            make[peer] = lambda peer=peer: LOADERS[peer](w)
    if w.kind in ("process", "facade"):
        make["one core"] = lambda: Inline(w)
    rates = compare(make, reps=3 if quick else 5)
    if w.kind == "thread":  # Little's law with one sample's measured latency, not nominal
        limit = w.workers / latency(w.dataset)
    else:
        limit = w.limit if w.limit is not None else CORES * median(rates["one core"])
    ours = median(rates["pipeflow"])
    rows = []
    for peer in [p for p in PEERS if p in rates]:
        theirs = median(rates[peer])
        goal = 1.2 if w.kind == "facade" else 1.1  # the facade's goal against torch: 1.2x
        near = theirs >= 0.95 * limit / goal  # the goal's ratio would pass the limit
        share = f"pipeflow at {ours / limit:.0%} of it, {peer} at {theirs / limit:.0%}"
        note = f"limit {limit:,.0f}/s: {share}"
        met = ours >= goal * theirs or (near and ours >= 0.95 * limit)
        rows.append(
            Row(
                f"{peer:<5} {w.name}",
                "samples/s",
                ours,
                theirs,
                f">= {goal}x",
                note,
                samples={"pipeflow": rates["pipeflow"], peer: rates[peer]},
                met=met,
            )
        )
    for peer in missing:
        rows.append(
            Row(
                f"{peer:<5} {w.name}",
                "samples/s",
                ours,
                float("nan"),
                "",
                f"not installed, skipped ({INSTALL})",
            )
        )
    return rows


def first_batch(shape: str, quick: bool) -> list[Row]:
    """The first spawn loader's first batch (:mod:`benchmarks.peers_first`), each library in
    fresh interpreters, alternating, medians: 1.1x sooner than each peer, and no later than
    Grain's (issue 28); or, where the peer is already near the floor (a fresh interpreter
    importing the script's modules, which every spawn worker does first), within 5% of it."""
    libs = ["pipeflow", *[p for p in PEERS if installed(p)]]
    seconds: dict[str, list[float]] = {lib: [] for lib in [*libs, "floor"]}
    for rep in range(3 if quick else 5):
        for lib in libs if rep % 2 == 0 else reversed(libs):
            seconds[lib].append(peers_first.measure(lib, shape))
        seconds["floor"].append(peers_first.floor(shape))
    what = {
        "torch": "a training script: torch imported first, tensors",
        "numpy": "a script without torch, numpy batches",
    }[shape]
    ours, least = median(seconds["pipeflow"]), median(seconds["floor"])
    rows = []
    for peer in PEERS:
        name = f"{peer:<5} first spawn batch, {what}"
        if peer not in seconds:
            rows.append(Row(name, "seconds", ours, float("nan"), "", f"not installed ({INSTALL})"))
            continue
        goal = 1.0 if peer == "grain" else 1.1  # Grain's: at least as soon
        theirs = median(seconds[peer])
        near = theirs <= goal * least / 0.95  # the goal's ratio would go under the floor
        met = ours * goal <= theirs or (near and ours <= least / 0.95)
        note = (
            f"floor {least:.3f} s (a fresh interpreter importing the script's modules): "
            f"pipeflow at {ours / least:.2f}x it, {peer} at {theirs / least:.2f}x"
        )
        samples = {"pipeflow": seconds["pipeflow"], peer: seconds[peer]}
        rows.append(
            Row(
                name,
                "seconds",
                ours,
                theirs,
                f"<= {1 / goal:.2g}x",
                note,
                higher_is_better=False,
                samples=samples,
                met=met,
            )
        )
    return rows


def run(quick: bool) -> list[Row]:
    """Every workload against every installed peer."""
    os.environ.setdefault("GRAIN_LOG_LEVEL", "error")
    rows: list[Row] = []
    for w in workloads(quick):
        print(f"  {w.name} ...", flush=True, file=sys.stderr)
        rows.extend(one(w, quick))
    for shape in ("torch", "numpy"):
        print(f"  first spawn batch, {shape} ...", flush=True, file=sys.stderr)
        rows.extend(first_batch(shape, quick))
    return rows


main = cli(__doc__, run)

if __name__ == "__main__":
    sys.exit(main())
