"""Readers: stages that turn shards into samples (tar, JSON lines, Parquet).

Put one after :func:`~pipeflow.shards`; each keeps a record of where the consumer stands
(the shards done, the open shard's sample and byte offset), so a resumed pass opens only
the shard it stopped in and seeks into it (see :mod:`._reader`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeflow import _checks
from pipeflow.errors import ShardReadError
from pipeflow.readers._decode import decoders
from pipeflow.readers._jsonl import parse_jsonl
from pipeflow.readers._parquet import open_parquet, parse_parquet
from pipeflow.readers._reader import OPEN_AHEAD, Reader
from pipeflow.readers._tar import parse_tar

__all__ = ["ShardReadError", "read_jsonl", "read_parquet", "read_tar"]

OPEN_AHEAD[parse_parquet] = open_parquet


class _Options(dict):  # type: ignore[type-arg]
    """Storage options, shown without their values (they may hold credentials)."""

    def __repr__(self) -> str:
        return "{...}" if self else "{}"


def _common(
    stage: str,
    prefetch: Any,
    block_size: Any,
    window: Any,
    retries: Any,
    storage_options: Any,
) -> dict[str, Any]:
    if storage_options is not None and not isinstance(storage_options, Mapping):
        msg = f"{stage}: storage_options must be a mapping (got {type(storage_options).__name__})"
        raise TypeError(msg)
    return {
        "prefetch": _checks.integer(stage, "prefetch", prefetch, low=0),
        "block_size": _checks.integer(stage, "block_size", block_size, low=1),
        "window": _checks.integer(stage, "window", window, low=1),
        "retries": _checks.integer(stage, "retries", retries, low=0),
        "storage_options": _Options(storage_options or {}),
    }


def read_tar(
    *,
    decode: bool | Mapping[str, Any] = True,
    prefetch: int = 4,
    block_size: int = 8 << 20,
    window: int = 2,
    retries: int = 3,
    storage_options: Mapping[str, Any] | None = None,
) -> Reader:
    """Read tar shards in the WebDataset layout: each sample a dict keyed by extension.

    Files are grouped into samples by their key (the name up to the first dot), as
    WebDataset groups them; a sample is ``{"__key__": key, "__url__": shard, "__index__":
    its number in the shard, "jpg": ..., "cls": ...}``, its fields decoded by extension (see
    :mod:`pipeflow.readers._decode`). A sample that fails to decode is a failure in its place
    (:func:`~pipeflow.ignore_errors` drops it); a shard that cannot be read is one
    :class:`~pipeflow.ShardReadError`, and the reader goes on with the next shard.

    A resumed pass opens only the shard it stopped in, at the byte where its next sample
    starts: nothing before it is read again.

    Args:
        decode: ``True`` (decode known extensions), ``False`` (bytes), or a mapping from
            extension to a function of the bytes (``None``: keep the bytes), added to the
            defaults.
        prefetch: remote shards opened ahead of the one being read, their first blocks
            fetched while it is parsed (coroutines on fsspec's event loop for async file
            systems such as s3fs and HTTP). 0 reads one shard at a time.
        block_size: bytes per range request to a remote store.
        window: blocks of a remote shard requested ahead of the parser.
        retries: how often a failed request is retried before the shard fails.
        storage_options: options for fsspec's file system (credentials, endpoint).

    Examples:
        >>> import io, tarfile, tempfile, os
        >>> import pipeflow as pf
        >>> folder = tempfile.mkdtemp()
        >>> with tarfile.open(os.path.join(folder, "s-0.tar"), "w") as tar:
        ...     for name, data in [("a.txt", b"hello"), ("a.cls", b"1"), ("b.txt", b"bye")]:
        ...         info = tarfile.TarInfo(name)
        ...         info.size = len(data)
        ...         tar.addfile(info, io.BytesIO(data))
        >>> loader = pf.shards(os.path.join(folder, "*.tar"), shuffle=False) | pf.read_tar()
        >>> [(s["__key__"], s["txt"], s.get("cls")) for s in loader]
        [('a', 'hello', 1), ('b', 'bye', None)]
    """
    decoders("read_tar", decode)
    config = {
        "decode": decode,
        **_common("read_tar", prefetch, block_size, window, retries, storage_options),
    }
    return Reader(parse_tar, "read_tar", config, failures="mark")


def read_jsonl(
    *,
    decode: bool = True,
    prefetch: int = 4,
    block_size: int = 8 << 20,
    window: int = 2,
    retries: int = 3,
    storage_options: Mapping[str, Any] | None = None,
) -> Reader:
    """Read JSON lines shards: a sample per non-blank line.

    Each sample is ``{"__key__": str(index), "__url__": shard, "__index__": index, "json":
    value}``; with ``decode=False`` the line's bytes stand in for the value. A line that is
    not JSON is a failure in its place. Arguments as for :func:`read_tar`.

    Examples:
        >>> import os, tempfile
        >>> import pipeflow as pf
        >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
        >>> with open(path, "w") as f:
        ...     _ = f.write('{"text": "a"}\\n\\n{"text": "b"}\\n')
        >>> [(s["__index__"], s["json"]["text"]) for s in pf.shards([path]) | pf.read_jsonl()]
        [(0, 'a'), (1, 'b')]
    """
    _checks.boolean("read_jsonl", "decode", decode)
    config = {
        "decode": decode,
        **_common("read_jsonl", prefetch, block_size, window, retries, storage_options),
    }
    return Reader(parse_jsonl, "read_jsonl", config, failures="mark")


def read_parquet(
    *,
    columns: Sequence[str] | None = None,
    prefetch: int = 2,
    retries: int = 3,
    storage_options: Mapping[str, Any] | None = None,
) -> Reader:
    """Read Parquet shards through pyarrow: a sample per row, read by row group.

    Each sample is the row as a dict of its *columns* (all of them by default), plus
    ``"__key__"``, ``"__url__"`` and ``"__index__"`` (the row's number in the file). A
    resumed pass reads the footer and the row group of its next row, and nothing before it.
    The next *prefetch* files are opened ahead in threads (footer and first row group).
    Needs pyarrow (``pip install pipeflow[stream]``).

    Args:
        columns: the columns to read, or ``None`` for all.
        prefetch: as for :func:`read_tar`.
        retries: as for :func:`read_tar`.
        storage_options: as for :func:`read_tar`.

    Examples:
        >>> import os, tempfile
        >>> import pyarrow as pa, pyarrow.parquet as pq
        >>> import pipeflow as pf
        >>> path = os.path.join(tempfile.mkdtemp(), "part-0.parquet")
        >>> pq.write_table(pa.table({"x": [1, 2, 3], "y": ["a", "b", "c"]}), path, row_group_size=2)
        >>> [(s["__index__"], s["x"]) for s in pf.shards([path]) | pf.read_parquet(columns=["x"])]
        [(0, 1), (1, 2), (2, 3)]
    """
    if columns is not None:
        if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
            msg = f"read_parquet: columns must be a list of column names or None (got {columns!r})"
            raise TypeError(msg)
        columns = list(columns)
    common = _common("read_parquet", prefetch, 1, 1, retries, storage_options)
    config = {"columns": columns, **common}
    return Reader(parse_parquet, "read_parquet", config, failures="mark")
