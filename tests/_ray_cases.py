"""What the Ray backend's tests run in actors: module-level functions and classes, so that
they pickle by reference (the actors import this module, as process workers do).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

import pipeflow as pf


def where(i: int) -> tuple[int, str]:
    """The item, and the Ray node that computed it (run slowly enough that a pass takes a
    while: the fault tests act on the cluster while it runs)."""
    import ray

    time.sleep(0.01)
    return i, ray.get_runtime_context().get_node_id()


def with_worker(i: int) -> tuple[int, str]:
    """The item, and which worker of how many made it, on which backend."""
    info = pf.get_worker_info()
    assert info is not None and info.node  # an actor knows its node
    return i, f"{info.id} of {info.num_workers} {info.backend}"


def cube(i: int) -> int:
    return i * i * i


def noise(i: int, rng: Any) -> tuple[int, float]:
    """A draw keyed by the item's position (``pf.random_map``): the same in any worker."""
    return i, round(float(rng.random()), 9)


def big(i: int) -> np.ndarray:
    """A 4 MB result: it travels out of band, through the object store."""
    return np.full((1024, 1024), i, dtype=np.float32)


def actor_pid(_: int) -> int:
    time.sleep(0.005)
    return os.getpid()


@dataclass(frozen=True)
class SlowSquares:
    """A map-style dataset, slow enough per sample that a pass is still running when a test
    kills an actor or removes a node."""

    n: int
    delay: float = 0.01

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        time.sleep(self.delay)
        return i * i


class Counted:
    """A map-style dataset with a state of its own (how many samples its copy read, which
    each sample shows), saved and restored with the loader's state."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.reads = 0

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> tuple[int, int]:
        self.reads += 1
        return i, self.reads

    def state_dict(self) -> dict[str, Any]:
        return {"reads": self.reads}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reads = state["reads"]


def resumable(kind: str, workers: int) -> Any:
    """The loader the resume test takes a state from, and builds again in a new process:
    ``"draws"`` (a random draw per sample, keyed by its position) or ``"stateful"`` (a
    dataset whose copy in each actor counts its reads, saved in the state)."""
    if kind == "draws":
        work = pf.fetch(SlowSquares(30, delay=0.0)) | pf.random_map(noise, seed=2)
    else:  # round robin: which actor reads which sample (and so its count) is fixed
        work = pf.fetch(Counted(30))
    robin = kind == "stateful"
    stage = pf.parallel_map(work, workers=workers, backend="ray", seed=3, round_robin=robin)
    return pf.indices(30) | pf.shuffle(seed=1) | pf.batch(2) | stage
