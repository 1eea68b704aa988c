"""Readers: stages that turn shards into samples (tar, JSON lines, Parquet).

Put one after :func:`~pipeflow.sources.shards`; each keeps a record of where the consumer stands
(the shards done, the open shard's sample and byte offset), so a resumed pass opens only
the shard it stopped in and seeks into it (see :mod:`._reader`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from pipeflow import _checks
from pipeflow.engine._context import Context
from pipeflow.engine._stage import Stage
from pipeflow.errors import ShardReadError
from pipeflow.sources.readers._decode import decoders
from pipeflow.sources.readers._jsonl import parse_jsonl
from pipeflow.sources.readers._parquet import open_parquet, parquet_version, parse_parquet
from pipeflow.sources.readers._reader import OPEN_AHEAD, ReadRecord, read, rule
from pipeflow.sources.readers._remote import check_timeout
from pipeflow.sources.readers._tar import parse_tar
from pipeflow.sources.readers._versions import VERSIONS

__all__ = ["ShardReadError", "read_jsonl", "read_parquet", "read_tar"]

OPEN_AHEAD[parse_parquet] = open_parquet
VERSIONS[parse_parquet] = parquet_version


def _tar(shards: Any, *, context: Context, record: ReadRecord | None, **config: Any) -> Any:
    return read(parse_tar, "read_tar", shards, context, record, config)


def _jsonl(shards: Any, *, context: Context, record: ReadRecord | None, **config: Any) -> Any:
    return read(parse_jsonl, "read_jsonl", shards, context, record, config)


def _parquet(shards: Any, *, context: Context, record: ReadRecord | None, **config: Any) -> Any:
    return read(parse_parquet, "read_parquet", shards, context, record, config)


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
    timeout: Any,
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
        "timeout": check_timeout(stage, timeout),
        "storage_options": _Options(storage_options or {}),
    }


def read_tar(
    *,
    decode: bool | Mapping[str, Any] = True,
    prefetch: int = 4,
    block_size: int = 8 << 20,
    window: int = 2,
    retries: int = 3,
    timeout: float = 60.0,
    storage_options: Mapping[str, Any] | None = None,
) -> Stage[Any, Any]:
    """Read tar shards in the WebDataset layout: each sample a dict keyed by extension.

    Files are grouped into samples by their key (the name up to the first dot of its last
    part), as WebDataset's own reader groups them: the extension is lowercased (``A.JPG`` is
    field ``"jpg"``); files without an extension, meta files (``__name__``, anything under
    ``__name__/``), directories and links are passed over without ending the sample; pax and
    GNU long names are read. A sample is ``{"__key__": key, "__url__": shard, "__index__":
    its number in the shard, "jpg": ..., "cls": ...}``, its fields decoded by extension,
    looked up whole and then by its last part (a ``"seg.png"`` decoder, else ``"png"``'s;
    see :mod:`pipeflow.sources.readers._decode`). A sample that fails to decode is a failure in its
    place (:func:`~pipeflow.ignore_errors` drops it).

    pipeflow differs from WebDataset where WebDataset would end the stream or lose samples
    without a word. Two files of one extension in a sample (``a.txt`` twice, or ``a.txt``
    and ``a.TXT``) make that sample a ``ValueError`` in its place: WebDataset raises and its
    pipeline ends, and one bad sample should cost one sample, not the epoch. A damaged shard
    (a header whose checksum or size is wrong, a malformed pax record, a cut anywhere, no
    end-of-archive block, a store that fails past the retries or the timeout) is one
    :class:`~pipeflow.ShardReadError` naming the shard, the byte and the samples delivered
    before it, after every complete sample before the damage; the reader goes on with the
    next shard (WebDataset's tarfile ends a shard at a bad header without a word).
    ``next()`` raises the error at its turn; :func:`~pipeflow.ignore_errors` drops and counts
    it. The sample in progress at the damage is delivered unless the damaged file is known to
    be its own (a cut between two files of one sample looks like one between samples;
    WebDataset delivers it too). Sparse files are an error (WebDataset expands them), and pax
    global headers are passed over (tarfile applies them to every later file).

    A resumed pass opens only the shard it stopped in, at the byte where its next sample
    starts: nothing before it is read again. The state names that shard and its version, and
    is refused at load if the shard changed since (:mod:`pipeflow.sources.readers._versions`).

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
        timeout: seconds a request may take (each attempt: a store that accepts the
            connection and never answers fails it), then it is retried; after ``retries + 1``
            attempts the shard fails with a :class:`~pipeflow.ShardReadError` naming the
            byte and the timeout. A setting of the run, not of the data: a state taken with
            one timeout resumes with another.
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
        ...
        >>> loader = pf.shards(os.path.join(folder, "*.tar"), shuffle=False) | pf.read_tar()
        >>> [(s["__key__"], s["txt"], s.get("cls")) for s in loader]
        [('a', 'hello', 1), ('b', 'bye', None)]
    """
    decoders("read_tar", decode)
    config = {
        "decode": decode,
        **_common("read_tar", prefetch, block_size, window, retries, timeout, storage_options),
    }
    resume = rule(parse_tar, config["prefetch"])
    return Stage(_tar, "read_tar", config, failures="mark", resume=resume)


def read_jsonl(
    *,
    decode: bool = True,
    prefetch: int = 4,
    block_size: int = 8 << 20,
    window: int = 2,
    retries: int = 3,
    timeout: float = 60.0,
    storage_options: Mapping[str, Any] | None = None,
) -> Stage[Any, Any]:
    """Read JSON lines shards: a sample per non-blank line.

    Each sample is ``{"__key__": str(index), "__url__": shard, "__index__": index, "json":
    value}``; with ``decode=False`` the line's bytes (without its end) stand in for the value.
    A line ends at ``\\n`` or ``\\r\\n``, and the last one may have no end; a line of only
    whitespace is skipped and not counted; a UTF-8 byte order mark at a line's start is
    dropped. A line that is not JSON (or not UTF-8) is a failure in its place, its note
    naming the line number and byte, and the rest of the shard is read. Arguments as for
    :func:`read_tar`.

    Examples:
        >>> import os, tempfile
        >>> import pipeflow as pf
        >>> path = os.path.join(tempfile.mkdtemp(), "rows.jsonl")
        >>> with open(path, "w") as f:
        ...     _ = f.write('{"text": "a"}\\n\\n{"text": "b"}\\n')
        ...
        >>> [(s["__index__"], s["json"]["text"]) for s in pf.shards([path]) | pf.read_jsonl()]
        [(0, 'a'), (1, 'b')]
    """
    _checks.boolean("read_jsonl", "decode", decode)
    config = {
        "decode": decode,
        **_common("read_jsonl", prefetch, block_size, window, retries, timeout, storage_options),
    }
    resume = rule(parse_jsonl, config["prefetch"])
    return Stage(_jsonl, "read_jsonl", config, failures="mark", resume=resume)


def read_parquet(
    *,
    columns: Sequence[str] | None = None,
    prefetch: int = 2,
    retries: int = 3,
    timeout: float = 60.0,
    storage_options: Mapping[str, Any] | None = None,
) -> Stage[Any, Any]:
    """Read Parquet shards through pyarrow: a sample per row, read by row group.

    Each sample is the row as a dict of its *columns* (all of them by default), plus
    ``"__key__"``, ``"__url__"`` and ``"__index__"`` (the row's number in the file). A
    resumed pass reads the footer and the row group of its next row, and nothing before it.
    The next *prefetch* files are opened ahead in threads (footer and first row group).
    Needs pyarrow (``pip install pipeflow[stream]``).

    A file without one of *columns* is a :class:`~pipeflow.ShardReadError` in its place,
    naming the columns it has. The first file a pass reads fixes the columns and their arrow
    types; a later file that differs (a column added or missing, another type) is a
    :class:`~pipeflow.ShardReadError` naming the file and the difference, and the pass goes
    on. A column of type ``null`` matches any type. A resumed pass takes the first file it
    reads as its reference.

    Args:
        columns: the columns to read (top-level names, or nested fields as ``"a.b"``), or
            ``None`` for all.
        prefetch: as for :func:`read_tar`.
        retries: as for :func:`read_tar`.
        timeout: as for :func:`read_tar` (each request for the footer, a row group's bytes).
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
    common = _common("read_parquet", prefetch, 1, 1, retries, timeout, storage_options)
    config = {"columns": columns, **common}
    resume = rule(parse_parquet, config["prefetch"])
    return Stage(_parquet, "read_parquet", config, failures="mark", resume=resume)
