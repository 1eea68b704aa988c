"""A rank of a real torch.distributed job (gloo, CPU) drawing random numbers after a shard.

Run by tests/test_billion.py under torchrun; writes ``$PIPEFLOW_DDP_OUT/rank<r>.json``:
``{"draws": [[sample, draw], ...]}`` for ``indices(23) | shuffle | shard() | random_map``.
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import torch.distributed as dist

import pipeflow as pf


def draw(i: int, rng: np.random.Generator) -> tuple[int, int]:
    return i, int(rng.integers(2**30))


def main() -> int:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    loader = pf.indices(23) | pf.shuffle(seed=4) | pf.shard() | pf.random_map(draw, seed=0)
    draws = [list(x) for x in loader]
    with open(os.path.join(os.environ["PIPEFLOW_DDP_OUT"], f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "draws": draws}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
