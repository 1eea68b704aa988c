"""JSON lines shards: one sample per non-blank line.

A sample is ``{"__key__", "__url__", "__index__", "json": value}`` (the line parsed; its bytes
with ``decode=False``), where ``"__index__"`` counts the shard's non-blank lines. Each line's
end is where the next sample starts: a resumed pass seeks there.

What a line is, as `JSON Lines <https://jsonlines.org>`_ has it:

- A line ends at ``\\n``; a ``\\r`` before it is part of the end (``\\r\\n``), not of the
  value. The last line may have no ``\\n`` (many writers leave it out): it is a line like
  the others, a sample if it parses and a failure if not (a file cut in a line's middle).
- A line is UTF-8. A UTF-8 byte order mark at its start (``utf-8-sig``, as Windows tools
  write a file's first line; or files concatenated) is dropped, as the
  ``jsonlines`` package drops it; ``json.loads`` on text and pandas' ``read_json`` refuse it.
- A blank line (nothing but JSON's whitespace: spaces, tabs, ``\\r``) is skipped: no sample,
  no ``"__index__"``.
- A line that is not JSON is a failure in its sample's place, its note naming the line
  (counted from 1, blank ones too) and its byte; the rest of the shard is read. A resumed
  pass that seeks into a shard does not know the lines before it, and names the byte only.
"""

from __future__ import annotations

import codecs
import json
from collections.abc import Iterator
from typing import Any

from pipeflow.engine._failure import Failure
from pipeflow.errors import _add_note
from pipeflow.sources.readers._reader import Opened
from pipeflow.sources.readers._tar import _check_count, _check_more
from pipeflow.sources.shards import Shard

__all__ = ["parse_jsonl"]

_BOM = codecs.BOM_UTF8
_WHITESPACE = b" \t\r\n"  # JSON's (RFC 8259): a line of only these is blank


def parse_jsonl(
    shard: Shard, opened: Opened, start: int, offset: int | None, config: dict[str, Any]
) -> Iterator[tuple[Any, int]]:
    """The shard's samples from its sample ``shard.start + start``, with where each next
    one starts (see :mod:`._reader`)."""
    stream = opened.stream(shard.url)
    want = shard.start + start
    idx = want if offset is not None else 0
    line_no = 0 if offset is None else None  # unknown after a seek
    url, decode = shard.url, config["decode"] is not False
    try:
        while line := stream.readline():
            if line_no is not None:
                line_no += 1
            body = _body(line)
            if not body.strip(_WHITESPACE):
                continue
            if shard.stop is not None and idx >= shard.stop:
                _check_more(shard, stream.pos - len(line))
                return
            if idx >= want:
                at = stream.pos - len(line)
                yield _sample(body, idx, url, decode, line_no, at), stream.pos
            idx += 1
        _check_count(shard, idx)
    finally:
        stream.close()


def _body(line: bytes) -> bytes:
    """The line without its end (``\\n`` or ``\\r\\n``) and a byte order mark."""
    if line.endswith(b"\n"):
        line = line[:-2] if line.endswith(b"\r\n") else line[:-1]
    return line[len(_BOM) :] if line.startswith(_BOM) else line


def _sample(body: bytes, idx: int, url: str, decode: bool, line_no: int | None, at: int) -> Any:
    try:
        value = json.loads(body.decode("utf-8")) if decode else body
    except ValueError as e:  # UnicodeDecodeError too
        where = f"line {line_no} (byte {at})" if line_no is not None else f"the line at byte {at}"
        _add_note(e, f"pipeflow: {where} of shard {url!r} is not JSON")
        return Failure(e, [(url, idx)])
    return {"__key__": str(idx), "__url__": url, "__index__": idx, "json": value}
