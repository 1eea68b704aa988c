"""Writing small shards for the tests: tar (WebDataset layout), JSON lines, Parquet."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Sequence

import pipeflow as pf


def sample_id(shard: int, index: int) -> str:
    """The text every test sample carries: which shard, which sample."""
    return f"{shard}-{index}"


def write_tar(path: str, shard: int, count: int) -> None:
    """A tar shard of *count* samples, each a ``.txt`` (its id) and a ``.cls`` (its index)."""
    with tarfile.open(path, "w") as tar:
        for i in range(count):
            for ext, data in (("txt", sample_id(shard, i).encode()), ("cls", str(i).encode())):
                info = tarfile.TarInfo(f"s{shard:04d}_{i:05d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def write_jsonl(path: str, shard: int, count: int) -> None:
    with open(path, "w") as f:
        for i in range(count):
            f.write(json.dumps({"id": sample_id(shard, i)}) + "\n")


def write_parquet(path: str, shard: int, count: int, group: int = 3) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    ids = [sample_id(shard, i) for i in range(count)]
    pq.write_table(pa.table({"id": pa.array(ids, pa.string())}), path, row_group_size=group)


WRITERS = {"tar": write_tar, "jsonl": write_jsonl, "parquet": write_parquet}


def write_shards(folder: str, sizes: Sequence[int], kind: str = "tar") -> list[str]:
    """Shards of the given sizes in *folder*; their paths, in order."""
    paths = []
    for k, count in enumerate(sizes):
        path = os.path.join(folder, f"shard-{k:04d}.{kind}")
        WRITERS[kind](path, k, count)
        paths.append(path)
    return paths


def ident(sample: dict) -> str:
    """A read sample's id, whatever the format."""
    if "txt" in sample:
        return sample["txt"]
    if "json" in sample:
        return sample["json"]["id"]
    return sample["id"]


def stream_loader(
    paths: Sequence[str],
    rank: int = 0,
    world: int = 1,
    workers: int = 0,
    backend: str = "thread",
    seeds: Sequence[int] | None = None,
) -> pf.Loader:
    """This rank's tar shards, read, then buffer-shuffled, on *workers* workers of *backend*
    (0: in line), whole shards dealt to the ranks; the seeds in order (shards, shuffle, the
    workers'), or drawn (``None``: a state carries them)."""
    drawn = iter(seeds) if seeds is not None else iter(lambda: None, 0)
    shards = pf.shards(list(paths), seed=next(drawn), rank=rank, world_size=world, balance="shards")
    inner = shards | pf.read_tar() | pf.shuffle(seed=next(drawn), buffer_size=4)
    if not workers:
        return inner
    return pf.parallel_source(inner, workers=workers, backend=backend, seed=next(drawn))
