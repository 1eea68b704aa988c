"""``backend="ray"`` against the process backend and torch's DataLoader, on a Ray cluster
simulated on this machine (``ray.cluster_utils.Cluster``: a head of 1 logical CPU, where the
driver runs, and two nodes of 3, every node its own raylet on the loopback address).

Run: ``python -m benchmarks.ray [--quick]`` from the repository root (needs
``pip install "pipeflow[ray]"``). Three workloads, each in one run, every loader built once
and then timed in alternating repetitions (medians):

1. **numpy ~1 ms/sample** (``benchmarks.datasets.NumpyAugment``), batches of 16: Ray with 2,
   4 and 6 actors (spread over the two worker nodes: every result crosses from its node to
   the driver's, as on a real cluster), Ray with 2 actors on the driver's node (no crossing),
   the process backend with 2 workers, torch with 2 workers.
2. **decode**: the demo's JPEG decode (``pipeflow.demo.Decode``, 64 px), batches of 16, the
   same loaders.
3. **per-item overhead**: items that cost nothing (``abs`` of an int), so the time per item
   is what the path itself costs: Ray with 2 actors against the process backend with 2
   workers, in µs per item.

On 2 cores, actors add no cores: 4 and 6 actors share the 2 that 2 use. What is measured is
what the Ray path costs, against the process backend at the same parallelism (goal: within
15%) and per item (goal: under 200 µs); what a real cluster adds is in docs/performance.md.
"""

from __future__ import annotations

import logging
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch.utils.data as tud

import pipeflow as pf
from benchmarks import datasets as data
from benchmarks._harness import Row, cli, compare, median

ACTORS = (2, 4, 6)
STORE = 250 * 1024**2  # each node's object store
#: Each actor asks for half a (logical) CPU: the loaders of 2, 4 and 6 actors are all built
#: before the timed epochs (12 actors on the 6 logical CPUs of the simulated nodes).
HALF = {"num_cpus": 0.5}
#: ... on the two worker nodes, not the driver's (the head's CPU is for the row "on the
#: driver's node").
SPREAD = {**HALF, "resources": {"worker_node": 0.5}}
#: Items (batches of 16 samples, up to 9.6 MB) in flight per actor: calls of 2. The default
#: (8 per actor, calls of 4) suits small items; 8 batches of 9.6 MB per actor, for 12 actors,
#: would not fit the simulated nodes' object stores, which would spill them to disk.
PER_ACTOR = 4


def _cluster() -> Any:
    import ray
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "object_store_memory": STORE, "include_dashboard": False},
    )
    for _ in range(2):
        cluster.add_node(num_cpus=3, object_store_memory=STORE, resources={"worker_node": 8})
    cluster.wait_for_nodes()
    ray.init(address=cluster.address, log_to_driver=False, logging_level=logging.WARNING)
    return cluster


def _here() -> dict[str, Any]:
    """Actor options that place the actors on the driver's own node (the head), whose
    results reach the driver without crossing between nodes."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    here = ray.get_runtime_context().get_node_id()
    return {**HALF, "scheduling_strategy": NodeAffinitySchedulingStrategy(here, soft=False)}


def _loaders(ds: Any, work: Any, batch: int) -> dict[str, Any]:
    """Ray with each actor count, the process backend and torch, 2 workers each."""

    def pipe(**kw: Any) -> Any:
        in_flight = PER_ACTOR * kw["workers"] if kw["backend"] == "ray" else None
        stage = pf.parallel_map(work, persistent=True, seed=0, max_in_flight=in_flight, **kw)
        return pf.indices(ds) | pf.shuffle(seed=0) | pf.batch(batch) | stage

    made: dict[str, Any] = {
        f"ray {k}": (lambda k=k: pipe(workers=k, backend="ray", ray_options=SPREAD)) for k in ACTORS
    }
    made["ray 2 here"] = lambda: pipe(workers=2, backend="ray", ray_options=_here())
    made["process 2"] = lambda: pipe(workers=2, backend="process")
    made["torch 2"] = lambda: tud.DataLoader(
        ds, batch_size=batch, shuffle=True, num_workers=2, persistent_workers=True
    )
    return made


def _rows(name: str, rates: dict[str, list[float]]) -> list[Row]:
    process, torch = rates["process 2"], rates["torch 2"]
    rows = [
        Row(
            f"{name}: ray 2 actors vs process 2",
            "samples/s",
            median(rates["ray 2"]),
            median(process),
            ">= 0.85x",
            f"'torch' column: pipeflow's process backend; torch 2 workers: {median(torch):,.0f}/s",
            samples={"pipeflow": rates["ray 2"], "torch": process},
        )
    ]
    for k in ACTORS[1:]:
        rows.append(
            Row(
                f"  same, ray {k} actors (2 cores) vs process 2",
                "samples/s",
                median(rates[f"ray {k}"]),
                median(process),
                samples={"pipeflow": rates[f"ray {k}"], "torch": process},
            )
        )
    rows.append(
        Row(
            "  same, ray 2 actors on the driver's node",
            "samples/s",
            median(rates["ray 2 here"]),
            median(process),
            note="results read from the driver's own node's store: no transfer between nodes",
            samples={"pipeflow": rates["ray 2 here"], "torch": process},
        )
    )
    rows.append(
        Row(
            "  same, ray 2 actors vs torch 2 workers",
            "samples/s",
            median(rates["ray 2"]),
            median(torch),
            samples={"pipeflow": rates["ray 2"], "torch": torch},
        )
    )
    return rows


def numpy_work(quick: bool) -> list[Row]:
    ds = data.NumpyAugment(400 if quick else 1200)
    rates = compare(_loaders(ds, pf.fetch(ds) | pf.collate(), 16), reps=3 if quick else 7)
    return _rows("numpy ~1 ms/sample", rates)


def decode(quick: bool) -> list[Row]:
    from pipeflow.demo import Decode, list_images, make_shapes

    count = 480 if quick else 1600
    folder = make_shapes(Path(tempfile.gettempdir()) / "pipeflow-bench-ray", count, size=64)
    ds = Decode(list_images(folder)[0], 64)
    rates = compare(_loaders(ds, pf.fetch(ds) | pf.collate(), 16), reps=3 if quick else 7)
    return _rows("decode 64px JPEG", rates)


def overhead(quick: bool) -> list[Row]:
    """µs per item of an empty stage, 2 workers: what the path costs per item (epochs
    timed alternately, after one to warm up)."""
    n = 4000 if quick else 12000

    def pipe(backend: str, in_flight: int | None = None) -> Any:
        stage = pf.parallel_map(
            abs, workers=2, backend=backend, persistent=True, max_in_flight=in_flight
        )
        return pf.indices(n) | stage

    loaders = {"ray": pipe("ray"), "ray 16": pipe("ray", 64), "process": pipe("process")}
    us: dict[str, list[float]] = {name: [] for name in loaders}
    for loader in loaders.values():
        assert sum(1 for _ in loader) == n
    for rep in range(3 if quick else 7):
        for name in list(loaders) if rep % 2 == 0 else reversed(list(loaders)):
            start = time.perf_counter()
            for _ in loaders[name]:
                pass
            us[name].append((time.perf_counter() - start) / n * 1e6)
    for loader in loaders.values():
        loader.close()
    return [
        Row(
            "per-item overhead, ray 2 actors",
            "µs/item",
            median(us["ray"]),
            median(us["process"]),
            "pipeflow < 200",
            "'torch' column: the process backend, 2 workers; items sent in calls of 4",
            higher_is_better=False,
            samples={"pipeflow": us["ray"], "torch": us["process"]},
        ),
        Row(
            "  same, calls of 16 (max_in_flight=64)",
            "µs/item",
            median(us["ray 16"]),
            median(us["process"]),
            "pipeflow < 200",
            higher_is_better=False,
            samples={"pipeflow": us["ray 16"], "torch": us["process"]},
        ),
    ]


def run(quick: bool) -> list[Row]:
    import ray

    cluster = _cluster()
    try:
        return [*overhead(quick), *numpy_work(quick), *decode(quick)]
    finally:
        ray.shutdown()
        cluster.shutdown()


main = cli(__doc__, run)


if __name__ == "__main__":
    sys.exit(main())
