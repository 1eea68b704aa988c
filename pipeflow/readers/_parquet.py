"""Parquet shards, through pyarrow: rows read by row group, the columns asked for.

A sample is a row as a dict of its columns, plus ``"__key__"``, ``"__url__"`` and
``"__index__"`` (the row's number in the file). The file's footer gives each row group's
rows, so a reader starts at any row by reading only its row group: a resumed pass reads the
footer and one row group before its first row. The next ``prefetch`` files are opened ahead
in threads (footer and first row group), so a remote store's latency overlaps the current
file. pyarrow is an optional dependency (``pip install pipeflow[stream]``).
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator
from concurrent.futures import Future
from itertools import accumulate
from typing import Any

from pipeflow.readers._bytes import ShardReadError, Storage, is_local, local_path
from pipeflow.readers._reader import Opened
from pipeflow.shards import Shard

__all__ = ["open_parquet", "parse_parquet"]

_POSITION = ("__key__", "__url__", "__index__")


class _File:
    """An open Parquet file: its row groups' sizes, and the first one read (ahead)."""

    def __init__(self, url: str, storage: Storage, want: int, columns: Any) -> None:
        import pyarrow.parquet as pq

        try:
            if is_local(url):
                self.file = pq.ParquetFile(local_path(url))
            else:
                fs, path = storage.system(url)
                self.file = pq.ParquetFile(fs.open(path, "rb"))
        except FileNotFoundError as e:
            raise ShardReadError(f"shard {url!r} does not exist") from e
        except OSError as e:
            raise ShardReadError(f"shard {url!r} is not a readable Parquet file ({e})") from e
        meta = self.file.metadata
        self.rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self.starts = [0, *accumulate(self.rows)]
        self.columns = columns
        self.group = max(bisect_right(self.starts, want) - 1, 0)
        self.first = self.read(self.group) if self.group < len(self.rows) else []

    def read(self, group: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.file.read_row_group(
            group, columns=self.columns
        ).to_pylist()
        return rows


def open_parquet(storage: Storage, shard: Shard, at: int, config: dict[str, Any]) -> Future[Any]:
    """Open *shard* in a thread, reading its footer and its first row group (ahead)."""
    if storage.pool is None:
        from concurrent.futures import ThreadPoolExecutor

        storage.pool = ThreadPoolExecutor(8, thread_name_prefix="pipeflow-shard-read")
    return storage.pool.submit(_File, shard.url, storage, shard.start + at, config["columns"])


def parse_parquet(
    shard: Shard, opened: Opened, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    """The shard's rows from its row ``shard.start + start``, with the row group of each
    next one (see :mod:`._reader`)."""
    want = shard.start + start
    early = opened.early
    if isinstance(early, Future):
        opened.early = None
        file = early.result()
    else:
        file = _File(shard.url, opened.storage, want, config["columns"])
    total = file.starts[-1]
    if shard.size is not None and total != shard.size:
        msg = f"shard {shard.url!r} has {total} rows, and sizes= gives it {shard.size}"
        raise ShardReadError(msg)
    stop = total if shard.stop is None else shard.stop
    url = shard.url
    for g in range(file.group, len(file.rows)):
        rows = file.first if g == file.group else file.read(g)
        base = file.starts[g]
        for j in range(max(want - base, 0), len(rows)):
            idx = base + j
            if idx >= stop:
                return
            row = rows[j]
            if any(k in row for k in _POSITION):
                msg = f"shard {url!r} has a column named like a sample's position ({_POSITION})"
                raise ShardReadError(msg)
            yield (
                {"__key__": str(idx), "__url__": url, "__index__": idx, **row},
                (g if j + 1 < len(rows) else g + 1),
            )
