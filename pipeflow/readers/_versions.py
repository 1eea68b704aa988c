"""A shard's version: what a state keeps of the shard it stopped in, and its check at load.

A state that stops inside a shard (``{"inputs": n, "start": m, "offset": o}``) means "the
samples of this shard after its *m*-th": true only of the shard as it was. So the record
also names the shard and its version, ``"shard": {"number": 3, "bytes": 81920, "head":
"9c0e…"}``: its number in :func:`~pipeflow.shards`'s list (or ``"url"`` for a plain name), its
size, and a digest of its first bytes (:func:`~pipeflow.readers._bytes.fingerprint_of`, taken
as the shard is read: nothing more is fetched for it). ``load_state_dict`` looks at the shard
again and refuses the state by name when it changed or is gone, instead of seeking into
another file and yielding whatever lies there. The shard is found by its number, so the
same shards moved to another folder or bucket resume.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from pipeflow.errors import ShardReadError
from pipeflow.readers._storage import Storage
from pipeflow.state import integer

__all__ = ["VERSIONS", "check_fingerprint", "current_version", "verify_shard"]


def check_fingerprint(shard: Any, where: str) -> None:
    """Refuse a malformed ``"shard"`` entry of a reader's record."""
    if not isinstance(shard, dict):
        msg = f"load_state_dict: {where} must be a dict (got {type(shard).__name__})"
        raise ValueError(msg)
    named = {"number", "url"} & set(shard)
    if len(named) != 1 or set(shard) - {"number", "url", "bytes", "head"}:
        msg = (
            f"load_state_dict: {where} must hold 'number' or 'url', 'bytes' and 'head' "
            f"(got {sorted(shard)})"
        )
        raise ValueError(msg)
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


def _stream_version(storage: Storage, url: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """A byte-stream shard's fingerprint: its first block read, as a reader reads it."""
    stream = storage.open(url, 0)
    try:
        stream.read(1)
        return stream.fingerprint
    finally:
        stream.close()


#: How a format tells a shard's version, by its parser (byte streams by default).
VERSIONS: dict[Any, Callable[[Storage, str, dict[str, Any]], dict[str, Any] | None]] = {}


def current_version(parse: Any, url: str, config: dict[str, Any]) -> dict[str, Any] | None:
    """The fingerprint of *url* as it is now (raises :class:`ShardReadError`)."""
    storage = Storage.of(config)
    try:
        return VERSIONS.get(parse, _stream_version)(storage, url, config)
    finally:
        storage.close()


def verify_shard(
    parse: Any, url: str, saved: dict[str, Any], config: dict[str, Any], where: str, start: int
) -> None:
    """Refuse the state *saved* comes from when *url* is not the version it names."""
    try:
        now = current_version(parse, url, config)
    except ShardReadError as e:
        msg = (
            f"load_state_dict: {where}: the state stopped after sample {start} of shard "
            f"{url!r}, which can't be read now ({e}): the rest of its samples can't be found"
        )
        raise ValueError(msg) from e
    was = {"bytes": saved["bytes"], "head": saved["head"]}
    if now is not None and now != was:
        msg = (
            f"load_state_dict: shard {url!r} changed since the state was taken "
            f"({was['bytes']} bytes, head #{was['head']} then; {now['bytes']} bytes, head "
            f"#{now['head']} now): the state stopped after its sample {start}, and in this "
            "version of the shard the samples after it are others. Resume over the shards "
            f"the state was taken on, or start the epoch afresh ({where})"
        )
        raise ValueError(msg)
