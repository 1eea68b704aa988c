"""JSON lines shards: one sample per non-blank line.

A sample is ``{"__key__", "__url__", "__index__", "json": value}`` (the line parsed; its bytes
with ``decode=False``), where ``"__index__"`` counts the shard's non-blank lines. Each line's
end is where the next sample starts: a resumed pass seeks there.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from pipeflow._failure import Failure
from pipeflow.errors import _add_note
from pipeflow.readers._reader import Opened
from pipeflow.readers._tar import _check_count, _check_more
from pipeflow.shards import Shard

__all__ = ["parse_jsonl"]


def parse_jsonl(
    shard: Shard, opened: Opened, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    """The shard's samples from its sample ``shard.start + start``, with where each next
    one starts (see :mod:`._reader`)."""
    stream = opened.stream(shard.url)
    want = shard.start + start
    idx = want if offset is not None else 0
    url, decode = shard.url, config["decode"] is not False
    try:
        while line := stream.readline():
            if not line.strip():
                continue
            if shard.stop is not None and idx >= shard.stop:
                _check_more(shard, stream.pos - len(line))
                return
            if idx >= want:
                yield _sample(line, idx, url, decode), stream.pos
            idx += 1
        _check_count(shard, idx)
    finally:
        stream.close()


def _sample(line: bytes, idx: int, url: str, decode: bool) -> Any:
    body = line.rstrip(b"\r\n")
    try:
        value = json.loads(body) if decode else body
    except ValueError as e:
        _add_note(e, f"pipeflow: line {idx} of shard {url!r} is not JSON")
        return Failure(e, [(url, idx)])
    return {"__key__": str(idx), "__url__": url, "__index__": idx, "json": value}
