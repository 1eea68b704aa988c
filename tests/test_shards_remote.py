"""Shards from an S3-compatible server (moto, started here on 127.0.0.1, reached through
s3fs as a user reaches S3) and from an HTTP server: every sample once, exact resume, and the
real failures: a shard that disappears, a connection reset mid-shard (retried, nothing
duplicated), a reset that does not stop (a clear error naming the shard and the offset)."""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

import pipeflow as pf
from tests._servers import http_server, s3_server
from tests._shards import ident, sample_id, write_shards

pytest.importorskip("s3fs")
pytest.importorskip("moto")


def test_s3_every_sample_once_with_workers_and_an_exact_resume(tmp_path: Any) -> None:
    import s3fs

    sizes = [4, 0, 7, 3, 5]
    paths = write_shards(str(tmp_path), sizes)
    with s3_server() as options:
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir("data")
        for p in paths:
            fs.put(p, f"data/{os.path.basename(p)}")

        def make() -> Any:
            shards = pf.shards("s3://data/shard-*.tar", seed=1, storage_options=options)
            reader = pf.read_tar(storage_options=options, block_size=1024, window=2)
            return pf.parallel_source(shards | reader, workers=2, backend="thread")

        loader = make()
        full = [ident(s) for s in loader]
        assert sorted(full) == sorted(
            sample_id(k, i) for k, n in enumerate(sizes) for i in range(n)
        )
        loader.set_epoch(0)
        it = iter(loader)
        head = [ident(next(it)) for _ in range(9)]
        state = json.loads(json.dumps(loader.state_dict()))
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [ident(s) for s in resumed] == full
        # the shards regenerated under the same names: the state is refused, naming one
        os.mkdir(tmp_path / "other")
        others = write_shards(str(tmp_path / "other"), [s + 1 for s in sizes])
        for p in others:
            fs.put(p, f"data/{os.path.basename(p)}")
        with pytest.raises(ValueError, match=r"shard 's3://data/shard-000\d.tar' changed"):
            make().load_state_dict(state)
        for p in paths:
            fs.put(p, f"data/{os.path.basename(p)}")
        # a shard that disappears after it was listed: an error naming it, the rest read
        listed, dropping = make(), make() | pf.ignore_errors()  # listed before the rm
        fs.rm("data/shard-0002.tar")
        out, errors = [], []
        it = iter(listed)
        while True:
            try:
                out.append(ident(next(it)))
            except StopIteration:
                break
            except pf.ShardReadError as e:
                errors.append(str(e))
        assert len(errors) == 1 and "shard-0002.tar" in errors[0] and "does not exist" in errors[0]
        assert sorted(out) == sorted(x for x in full if not x.startswith("2-"))
        # under ignore_errors: dropped and counted, as one failed item
        assert sorted(ident(s) for s in dropping) == sorted(out)
        assert dropping.stats().stages[-1].ignored_errors == 1


def test_http_a_reset_mid_shard_is_retried_and_nothing_is_read_twice(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [6, 6, 6])
    names = [os.path.basename(p) for p in paths]
    with http_server(str(tmp_path)) as (base, handler):
        urls = [f"{base}/{n}" for n in names]
        handler.faults[names[1]] = 2  # two resets, then it works
        loader = pf.shards(urls, shuffle=False) | pf.read_tar(block_size=4096, retries=3)
        assert [ident(s) for s in loader] == [sample_id(k, i) for k in range(3) for i in range(6)]
        handler.faults[names[1]] = 100  # it never works
        loader = pf.shards(urls, shuffle=False) | pf.read_tar(block_size=4096, retries=2)
        it = iter(loader)
        got = [ident(next(it)) for _ in range(6)]
        with pytest.raises(pf.ShardReadError) as info:
            next(it)
        assert names[1] in str(info.value) and "at byte 0" in str(info.value)
        assert "failed 3 times" in str(info.value)
        assert "0 of its samples were delivered before it" in str(info.value)
        got += [ident(s) for s in it]  # the pass goes on with the next shard
        assert got == [sample_id(k, i) for k in (0, 2) for i in range(6)]


def test_http_a_shard_shorter_than_a_block_takes_one_request(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [6, 6, 6])  # 12 KiB each
    names = [os.path.basename(p) for p in paths]
    with http_server(str(tmp_path)) as (base, handler):
        urls = [f"{base}/{n}" for n in names]
        loader = pf.shards(urls, shuffle=False) | pf.read_tar()  # blocks of 8 MiB
        assert [ident(s) for s in loader] == [sample_id(k, i) for k in range(3) for i in range(6)]
        assert (len(handler.requests), handler.heads) == (3, [])  # no request for the size
        handler.requests.clear()
        small = pf.shards(urls, shuffle=False) | pf.read_tar(block_size=4096)
        assert [ident(s) for s in small] == [sample_id(k, i) for k in range(3) for i in range(6)]
        assert len(handler.heads) == 3  # a longer shard's size is asked for
        blocks = sum(-(-os.path.getsize(p) // 4096) for p in paths)
        assert len(handler.requests) == blocks  # its first block is not read again
