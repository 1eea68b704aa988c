"""A rank of a two-rank gloo job over uneven shards, for tests/test_shards.py (the DDP hang of
pytorch/pytorch#141069).

Spawned by the test with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set, and
``sys.argv[1:]``: the folder of results, then the shards' paths. Each rank reads its share of
the shards (``pf.shards`` asks torch.distributed for the rank and the world size) and, like a
DDP step, all-reduces once per batch: first with the default policy (``balance="pad"``, with
``sizes=``), then inside and after two ``parallel_source`` workers, then with ``balance="shards"`` and
no ``Join``. A collective the other rank never
joins waits for the process group's timeout (3 s here; 30 minutes by default), so the hang
shows as a timeout, recorded with the step it happened at. Each rank writes
``rank<r>.json`` and waits for the other's before it leaves (so a rank that finished early is
still there, as in a real job, while the other waits on it).
"""

from __future__ import annotations

import datetime
import faulthandler
import json
import os
import sys
import time

import torch
import torch.distributed as dist

import pipeflow as pf
from tests._shards import ident

BATCH = 2
WORKERS = {"backend": "thread"}  # threads: no fork of a process that holds a process group


def steps(loader: pf.Loader) -> dict[str, object]:
    """Run one epoch as a DDP loop would: one all-reduce per batch; what happened."""
    done: list[str] = []
    count = 0
    try:
        for batch in loader:
            dist.all_reduce(torch.ones(1))  # the gradients' sync: every rank must join
            count += 1
            done += [ident(s) for s in batch]
    except RuntimeError as e:  # the process group's timeout: the other rank never joined
        return {"steps": count, "samples": done, "hung": str(e)[:200]}
    return {"steps": count, "samples": done, "hung": None}


def main() -> int:
    faulthandler.dump_traceback_later(60, exit=True)  # a real hang would print its stack
    out, paths = sys.argv[1], sys.argv[2:]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank = dist.get_rank()
    one = {"rank": 0, "world_size": 1}  # each shard read whole here, to count its samples
    sizes = [sum(1 for _ in pf.shards([p], **one) | pf.read_tar(decode=False)) for p in paths]
    result: dict[str, object] = {}
    shards = pf.shards(paths, shuffle=False, sizes=sizes)
    result["pad"] = steps(shards | pf.read_tar() | pf.batch(BATCH))
    # Two workers per rank: batching inside them is refused as the pass starts (each
    # worker's share ends in a partial batch of its own, and the shares differ by rank);
    # batching after them keeps the ranks even.
    inside = pf.parallel_source(shards | pf.read_tar() | pf.batch(BATCH), workers=2, **WORKERS)
    try:
        result["inside"] = steps(inside)
    except ValueError as e:
        result["inside"] = {"refused": str(e)}
    after = pf.parallel_source(shards | pf.read_tar(), workers=2, **WORKERS) | pf.batch(BATCH)
    result["after"] = steps(after)
    whole = pf.shards(paths, shuffle=False, sizes=sizes, balance="shards")
    result["shards"] = steps(whole | pf.read_tar() | pf.batch(BATCH))  # last: it hangs
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump(result, f)
    other = os.path.join(out, f"rank{1 - rank}.json")
    deadline = time.monotonic() + 30
    while not os.path.exists(other) and time.monotonic() < deadline:
        time.sleep(0.05)
    os._exit(0)  # no destroy_process_group: after a timeout it may wait on the other rank


if __name__ == "__main__":
    sys.exit(main())
