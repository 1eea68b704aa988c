"""Parquet shards, through pyarrow: rows read by row group, the columns asked for.

A sample is a row as a dict of its columns, plus ``"__key__"``, ``"__url__"`` and
``"__index__"`` (the row's number in the file). The file's footer gives each row group's
rows, so a reader starts at any row by reading only its row group: a resumed pass reads the
footer and one row group before its first row. The next ``prefetch`` files are opened ahead
in threads (footer and first row group), so a remote store's latency overlaps the current
file. pyarrow is an optional dependency (``pip install pipeflow[stream]``).

**Columns.** ``columns=`` names top-level columns, or nested fields as ``"a.b"`` (as
:class:`pyarrow.parquet.ParquetFile` takes them). A file that lacks one is a
:class:`~pipeflow.ShardReadError` in its place, naming the columns it has: pyarrow's row
group reader would leave the column out of the rows without a word.

**One schema per pass.** The first file a pass reads fixes its schema: the selected
columns' names and arrow types. A later file whose columns differ (one added or missing,
or another type) is a :class:`~pipeflow.ShardReadError` naming the file and each
difference, and the pass goes on with the next file; rows of another shape never reach the
consumer. A column of type ``null`` (a writer's guess for a column with no values in the
file) matches any type, and the first file with a type for it fixes it. The columns'
order is free: a row is a dict. A state does not hold the schema: a resumed pass has no
first file before it, and the file it resumes in (or the first it reads) fixes its schema,
so where files differ, which of them fail may differ from the pass it resumes. Each
:func:`~pipeflow.parallel_source` worker has a reader of its own, so each holds its files
to the first it read.
"""

from __future__ import annotations

import hashlib
from bisect import bisect_right
from collections.abc import Iterator
from concurrent.futures import Future
from itertools import accumulate
from typing import Any

from pipeflow.sources.readers._bytes import ShardReadError, fingerprint_of, is_local, local_path
from pipeflow.sources.readers._reader import Opened
from pipeflow.sources.readers._storage import Storage
from pipeflow.sources.shards import Shard

__all__ = ["open_parquet", "parquet_version", "parse_parquet"]

_POSITION = ("__key__", "__url__", "__index__")

#: The pass's schema in its (per-pass) reader configuration: column -> (type, its file).
_SCHEMA = "parquet_schema"


class _File:
    """An open Parquet file: its row groups' sizes, and the first one read (ahead): row
    group *group*, or else the one that holds row *row*."""

    def __init__(
        self, url: str, storage: Storage, columns: Any, row: int, group: int | None = None
    ) -> None:

        self.file, self.version = _open(url, storage)
        _check_columns(self.file, url, columns)
        self.schema = self.file.read_row_groups([], columns=columns).schema  # no data read
        meta = self.file.metadata
        self.rows = [meta.row_group(g).num_rows for g in range(meta.num_row_groups)]
        self.starts = [0, *accumulate(self.rows)]
        self.columns = columns
        self.group = self.group_of(row) if group is None else min(group, len(self.rows))
        self.first = self.read(self.group) if self.group < len(self.rows) else []

    def group_of(self, row: int) -> int:
        """The row group that holds *row* (the number of groups past the last row)."""
        return max(bisect_right(self.starts, row) - 1, 0)

    def start_at(self, row: int) -> None:
        """Make the first row group the one that holds *row*, if it was opened at another."""
        group = self.group_of(row)
        if group != self.group:
            self.group = group
            self.first = self.read(group) if group < len(self.rows) else []

    def read(self, group: int) -> list[dict[str, Any]]:
        rows: list[dict[str, Any]] = self.file.read_row_group(
            group, columns=self.columns
        ).to_pylist()
        return rows


def _open(url: str, storage: Storage) -> tuple[Any, dict[str, Any]]:
    """The Parquet file at *url* (its footer read), and its version: its size and a digest
    of its footer (rows, row groups, their columns' statistics, the schema), a state's check
    that it is the file it stopped in (:mod:`._versions`)."""
    import pyarrow.parquet as pq

    try:
        if is_local(url):
            handle: Any = open(local_path(url), "rb")  # noqa: SIM115 (pyarrow keeps it)
        else:
            fs, path = storage.system(url)
            handle = fs.open(path, "rb")
        size, footer = _footer(handle)
        version = fingerprint_of(size, hashlib.blake2b(footer).digest())  # all of it
        file = pq.ParquetFile(handle)
    except FileNotFoundError as e:
        raise ShardReadError(f"shard {url!r} does not exist") from e
    except OSError as e:
        raise ShardReadError(f"shard {url!r} is not a readable Parquet file ({e})") from e
    return file, version


def _footer(handle: Any) -> tuple[int, bytes]:
    """A Parquet file's size and footer (read through *handle*, left at its start)."""
    size = handle.seek(0, 2)
    if size < 12:
        raise OSError(f"{size} bytes: too short for a Parquet file")
    handle.seek(size - 8)
    tail = handle.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length > size - 12:
        raise OSError("no Parquet footer at the end")
    handle.seek(size - 8 - length)
    footer = handle.read(length)
    handle.seek(0)
    return size, footer


def parquet_version(
    storage: Storage, url: str, config: dict[str, Any], saved: dict[str, Any]
) -> dict[str, Any]:
    """*url*'s version as :func:`_open` tells it (the footer read, no row group)."""
    return _open(url, storage)[1]


def _check_columns(file: Any, url: str, columns: list[str] | None) -> None:
    """Every column asked for is in the file: a top-level name, or a nested field's path."""
    if not columns:
        return
    names: set[str] = set()
    for i in range(len(file.schema)):
        parts = file.schema.column(i).path.split(".")
        names.update(".".join(parts[: k + 1]) for k in range(len(parts)))
    missing = [c for c in columns if c not in names]
    if missing:
        has = file.schema_arrow.names
        shown = ", ".join(map(repr, has[:30])) + (
            f" and {len(has) - 30} more" if len(has) > 30 else ""
        )
        msg = (
            f"shard {url!r} has no column{'s' if len(missing) > 1 else ''} "
            f"{', '.join(map(repr, missing))} "
            f"(its columns: {shown or 'none'}); columns= names a file's columns, or "
            "a nested field as 'a.b'"
        )
        raise ShardReadError(msg)


def _check_schema(schema: Any, url: str, config: dict[str, Any]) -> None:
    """The file's columns and types are the pass's; the first file of the pass fixes them
    (see the module's text), kept in the pass's configuration (a copy per pass)."""
    if any(k in schema.names for k in _POSITION):
        msg = f"shard {url!r} has a column named like a sample's position ({_POSITION})"
        raise ShardReadError(msg)
    here = dict(zip(schema.names, schema.types))
    if _SCHEMA not in config:
        config[_SCHEMA] = (url, {name: (t, url) for name, t in here.items()})
        return
    first, columns = config[_SCHEMA]
    differences = _differences(here, columns)
    if differences:
        msg = (
            f"shard {url!r} does not have the columns of {first!r}, the first file of this "
            f"pass: {'; '.join(differences)}. A pass's files must have the same columns of "
            "the same types: write them alike, or pass columns= the ones they share"
        )
        raise ShardReadError(msg)
    for name, t in here.items():  # the first file with a type for a null column fixes it
        if _is_null(columns[name][0]) and not _is_null(t):
            columns[name] = (t, url)


def _differences(here: dict[str, Any], columns: dict[str, tuple[Any, str]]) -> list[str]:
    """How a file's columns and types differ from the pass's, in words."""
    out = [f"column {name!r} added" for name in here if name not in columns]
    out += [f"column {name!r} missing" for name in columns if name not in here]
    for name, t in here.items():
        if name in columns:
            ref, where = columns[name]
            if t != ref and not _is_null(t) and not _is_null(ref):
                out.append(f"{name!r}: {t} here, {ref} in {where!r}")
    return out


def _is_null(t: Any) -> bool:
    """Whether *t* is arrow's ``null`` type (a column with no values)."""
    import pyarrow as pa

    return bool(pa.types.is_null(t))


def open_parquet(storage: Storage, shard: Shard, at: int, config: dict[str, Any]) -> Future[Any]:
    """Open *shard* in a thread, reading its footer and its first row group (ahead): row
    group *at*, the offset of a resumed pass's first shard, or that of the shard's first
    row."""
    group = at or None  # 0: the shard's start, or row group 0 (the same group)
    return storage.submit(_File, shard.url, storage, config["columns"], shard.start, group)


def parse_parquet(
    shard: Shard, opened: Opened, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    """The shard's rows from its row ``shard.start + start``, with the row group of each
    next one (see :mod:`._reader`)."""
    want = shard.start + start
    early = opened.early
    if isinstance(early, Future):
        opened.early = None
        file = opened.storage.wait(early, shard.url, None)  # bounded: see Storage.wait
        file.start_at(want)  # a resumed pass's offset says where; without one, read again
    else:
        file = _File(shard.url, opened.storage, config["columns"], want)
    opened.known = opened.known or file.version  # a resumed file's was checked at load
    total = file.starts[-1]
    if shard.size is not None and total != shard.size:
        msg = f"shard {shard.url!r} has {total} rows, and sizes= gives it {shard.size}"
        raise ShardReadError(msg)
    _check_schema(file.schema, shard.url, config)
    stop = total if shard.stop is None else shard.stop
    url = shard.url
    for g in range(file.group, len(file.rows)):
        rows = file.first if g == file.group else file.read(g)
        base = file.starts[g]
        for j in range(max(want - base, 0), len(rows)):
            idx = base + j
            if idx >= stop:
                return
            yield (
                {"__key__": str(idx), "__url__": url, "__index__": idx, **rows[j]},
                (g if j + 1 < len(rows) else g + 1),
            )
