"""A rank of a real torch.distributed job (gloo, CPU), for tests/test_distributed.py.

Run by torchrun (``python -m torch.distributed.run --standalone --nproc-per-node N``) or
spawned by the test with RANK / WORLD_SIZE / MASTER_ADDR / MASTER_PORT set. Writes what this
rank saw to ``$PIPEFLOW_DDP_OUT/rank<r>.json``.
"""

from __future__ import annotations

import faulthandler
import json
import os
import sys

import torch
import torch.distributed as dist
import torch.utils.data as tud

import pipeflow as pf


class Numbers(tud.Dataset):
    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> int:
        return i


def main() -> int:
    # A rank still running after 60 s prints every thread's stack to stderr (which the test
    # shows when it times out), so a hang says where it is.
    faulthandler.dump_traceback_later(60, exit=True)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = Numbers()
    loader = (
        pf.indices(ds)
        | pf.shuffle(seed=4, generator="torch")
        | pf.shard()  # rank and world size from the process group
        | pf.batch(4)
        | pf.fetch(ds)
        | pf.collate()
    )
    facade = pf.DataLoader(ds, batch_size=4, sampler=tud.DistributedSampler(ds, seed=4))
    seen: dict[str, list[list[int]]] = {"pipeline": [], "facade": [], "sampler": []}
    for epoch in range(2):
        loader.set_epoch(epoch)
        facade.sampler.set_epoch(epoch)
        batches = [b.tolist() for b in loader]
        seen["pipeline"].append([i for b in batches for i in b])
        seen["facade"].append([i for b in facade for i in b.tolist()])
        seen["sampler"].append(list(facade.sampler))
        count = torch.tensor([len(batches)])
        dist.all_reduce(count)  # completes only if every rank reaches it: no rank hangs
        seen.setdefault("reduced", []).append(int(count))
    # A DataPipe shuffled from each rank's own global seed: the loader takes rank 0's seed, so
    # the ranks shuffle alike and their shards (rank r of world, one worker each) add up.
    from torch.utils.data.datapipes.iter import IterableWrapper

    for cls, key in ((pf.DataLoader, "datapipe_pf"), (tud.DataLoader, "datapipe_torch")):
        pipe = IterableWrapper(range(20)).shuffle(buffer_size=5).sharding_filter()
        dl = cls(pipe, batch_size=None, shuffle=True, num_workers=1)
        torch.manual_seed(100 + rank)
        seen[key] = [list(dl), list(dl)]
    out = os.environ["PIPEFLOW_DDP_OUT"]
    with open(os.path.join(out, f"rank{rank}.json"), "w") as f:
        json.dump({"rank": rank, "world": world, **seen}, f)
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
