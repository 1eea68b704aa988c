"""A shard's version: what a state keeps of the shard it stopped in, and its check at load.

A state that stops inside a shard (``{"inputs": n, "start": m, "offset": o}``) means "the
samples of this shard after its *m*-th": true only of the shard as it was. So the record
also names the shard and its version, ``"shard": {"number": 3, "bytes": 81920, "head":
"9c0e…", "span": 65536}``: its number in :func:`~pipeflow.sources.shards`'s list (or
``"url"`` for a plain name), its size, and a digest of its first ``span`` bytes
(:func:`~pipeflow.sources.readers._bytes.fingerprint_of`, taken as the shard is read:
nothing more is fetched for it; a Parquet file's is its footer's). ``load_state_dict`` looks
at the shard again and refuses the state by name when it changed or is gone, instead of
seeking into another file and yielding whatever lies there. The shard is found by its
number, so the same shards moved to another folder or bucket resume.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from pipeflow.errors import ShardReadError
from pipeflow.resume.state import integer
from pipeflow.sources.readers._bytes import HEAD, fingerprint_of, is_local, local_path
from pipeflow.sources.readers._storage import Storage

__all__ = ["VERSIONS", "check_fingerprint", "current_version", "verify_shard"]


def check_fingerprint(shard: Any, where: str) -> None:
    """Refuse a malformed ``"shard"`` entry of a reader's record."""
    if not isinstance(shard, dict):
        msg = f"load_state_dict: {where} must be a dict (got {type(shard).__name__})"
        raise ValueError(msg)
    named = {"number", "url"} & set(shard)
    if len(named) != 1 or set(shard) - {"number", "url", "bytes", "head", "span"}:
        msg = (
            f"load_state_dict: {where} must hold 'number' or 'url', 'bytes', 'head' and "
            f"'span' (got {sorted(shard)})"
        )
        raise ValueError(msg)
    if "span" in shard:
        integer(shard["span"], f"{where}['span']", 0, HEAD)
    if "number" in shard:
        integer(shard["number"], f"{where}['number']")
    elif not isinstance(shard["url"], str):
        raise ValueError(f"load_state_dict: {where}['url'] must be a string")
    integer(shard.get("bytes"), f"{where}['bytes']")
    head = shard.get("head")
    if not (isinstance(head, str) and len(head) == 16 and _is_hex(head)):
        msg = f"load_state_dict: {where}['head'] must be 16 hex digits (got {head!r})"
        raise ValueError(msg)


def _is_hex(text: str) -> bool:
    try:
        bytes.fromhex(text)
    except ValueError:
        return False
    return True


def _stream_version(
    storage: Storage, url: str, config: dict[str, Any], saved: dict[str, Any]
) -> dict[str, Any] | None:
    """A byte-stream shard's fingerprint over as many first bytes as *saved*'s (``"span"``):
    a local file's, or a remote one's from two small requests (no whole block)."""
    span = saved.get("span", HEAD)
    if not is_local(url):
        return storage.version(url, span)
    try:
        with open(local_path(url), "rb") as f:
            size = f.seek(0, 2)
            return fingerprint_of(size, os.pread(f.fileno(), span, 0))
    except FileNotFoundError as e:
        raise ShardReadError(f"shard {url!r} does not exist") from e


#: How a format tells a shard's version, by its parser (byte streams by default): a
#: function of the storage, the shard, the reader's configuration and the version saved.
Version = Callable[[Storage, str, dict[str, Any], dict[str, Any]], "dict[str, Any] | None"]
VERSIONS: dict[Any, Version] = {}


def current_version(
    parse: Any, url: str, config: dict[str, Any], saved: dict[str, Any]
) -> dict[str, Any] | None:
    """The fingerprint of *url* as it is now, told as *saved* was (raises
    :class:`ShardReadError`)."""
    storage = Storage.of(config)
    try:
        version: Version = VERSIONS.get(parse, _stream_version)
        return version(storage, url, config, saved)
    finally:
        storage.close()


def verify_shard(
    parse: Any, url: str, saved: dict[str, Any], config: dict[str, Any], where: str, start: int
) -> None:
    """Refuse the state *saved* comes from when *url* is not the version it names."""
    try:
        now = current_version(parse, url, config, saved)
    except ShardReadError as e:
        msg = (
            f"load_state_dict: {where}: the state stopped after sample {start} of shard "
            f"{url!r}, which can't be read now ({e}): the rest of its samples can't be found"
        )
        raise ValueError(msg) from e
    was = {"bytes": saved["bytes"], "head": saved["head"]}
    if now is not None and {"bytes": now["bytes"], "head": now["head"]} != was:
        msg = (
            f"load_state_dict: shard {url!r} changed since the state was taken "
            f"({was['bytes']} bytes, head #{was['head']} then; {now['bytes']} bytes, head "
            f"#{now['head']} now): the state stopped after its sample {start}, and in this "
            "version of the shard the samples after it are others. Resume over the shards "
            f"the state was taken on, or start the epoch afresh ({where})"
        )
        raise ValueError(msg)
