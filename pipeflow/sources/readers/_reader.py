"""What every reader shares: shards in, samples out, the next shards opened ahead, and a
record of where the consumer stands for an exact, cheap resume.

A reader stage takes :class:`~pipeflow.Shard` records (or plain names) and yields each
shard's samples through a format's parser (:mod:`._tar`, :mod:`._jsonl`, :mod:`._parquet`),
a generator of ``(sample, next)`` pairs: *next* is where the shard's next sample starts (a
byte offset; a Parquet row group), so that a resumed pass seeks there instead of reading the
shard again.

**The record** (:class:`ReadRecord`, made by the reader's :func:`rule`) is in the ``{"inputs": n,
"start": m}`` form of :mod:`pipeflow.state`, with a key of the reader's own: ``n`` shards
were done, ``m`` samples of the next one were consumed, and ``"offset"`` says where its
sample ``m`` starts. A resumed pass starts the source at shard ``n``; the reader opens it at
``offset`` and reads on from sample ``m``: it reads no other shard and no byte before. For
each shard of the pass the record keeps where its outputs began, and for the latest
:data:`KEEP_OFFSETS` shards every sample's offset (8 bytes each); a state that falls in an
older shard (a long buffer after the reader) has no offset, and the shard is read from its
start, skipping ``m`` samples: exact still, a little dearer.

**Failures**: a sample that fails to decode is a failure in its place (``ignore_errors``
drops it); a shard that cannot be read (missing, truncated, the store failing past the
retries) is one :class:`~pipeflow.ShardReadError` in the place of its unread samples, and
the reader goes on with the next shard. Each counts as one output.
"""

from __future__ import annotations

import functools
from array import array
from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeflow.engine._context import Context
from pipeflow.engine._failure import Failure
from pipeflow.engine._stage import Stage, _short
from pipeflow.errors import ShardReadError, annotate
from pipeflow.resume.state import Form, Int, Record, Rule, Value
from pipeflow.sources.readers._bytes import Stream, is_local
from pipeflow.sources.readers._decode import decoders
from pipeflow.sources.readers._storage import Storage
from pipeflow.sources.readers._versions import check_fingerprint, verify_shard
from pipeflow.sources.shards import Shard

__all__ = [
    "KEEP_OFFSETS",
    "OPEN_AHEAD",
    "Opened",
    "ReadRecord",
    "as_shard",
    "open_stream",
    "read",
    "rule",
]

#: The shards of a pass whose samples' offsets a record keeps (the latest ones).
KEEP_OFFSETS = 64

#: A parser: ``parse(shard, opened, start, offset, config) -> Iterator[(sample, next)]``,
#: yielding the shard's samples from sample *start* on; *offset* (or ``None``) is where
#: sample *start* begins, when a resumed pass knows it.
Parser = Callable[..., Iterator[tuple[Any, int]]]


def as_shard(item: Any) -> Shard:
    """A reader's input as a :class:`Shard` (a plain name stands for the whole shard)."""
    if isinstance(item, Shard):
        return item
    if isinstance(item, str):
        return Shard(item, -1)
    msg = f"a reader takes shard names or pf.Shard records (got {type(item).__name__})"
    raise TypeError(msg)


class ReadRecord(Record):
    """Where each shard of a pass began in its outputs, and its samples' offsets (see the
    module's text). *offset*: shards done before the pass; *start*, *first*: the first
    shard's samples consumed before the pass, and where the next one starts."""

    #: ``{"inputs": n}``, or ``{"inputs": n, "start": m}`` with an ``"offset"`` (a position
    #: in the shard) and the ``"shard"`` it is in (its version). A reader makes any number of
    #: samples of a shard, so *n* is not bounded by what the position says; *m*, samples of
    #: the epoch's outputs consumed, is.
    FORM = Form(
        {
            "inputs": Int(0, "total"),
            "start": Int(0, "consumed", True),
            "offset": Int(0, None, True),
            "shard": Value(check_fingerprint, True),
        },
        (
            (
                lambda v: "offset" not in v or bool(v.get("start")),
                lambda v: f"{v['where']} has an offset but no 'start' (samples read)",
            ),
            (
                lambda v: "shard" not in v or bool(v.get("start")),
                lambda v: f"{v['where']} names a shard but no 'start' (samples read)",
            ),
            (
                lambda v: (
                    "offset" not in v or "shard" not in v or v["offset"] <= v["shard"]["bytes"]
                ),
                lambda v: (
                    f"{v['where']}['offset'] is {v['offset']}, past the end of its shard "
                    f"({v['shard']['bytes']} bytes)"
                ),
            ),
        ),
    )

    @classmethod
    def begin(cls, stage: Any, context: Context, saved: dict[str, Any] | None) -> ReadRecord:
        saved = saved or {}
        return cls(context.offset, context.start, saved.get("offset"), saved.get("shard"))

    __slots__ = (
        "before",
        "bytes",
        "current",
        "ends",
        "first",
        "heads",
        "inputs",
        "named",
        "numbers",
        "offset",
        "offsets",
        "skipped",
        "spans",
    )

    def __init__(
        self, offset: int, start: int, first: int | None, shard: dict[str, Any] | None = None
    ) -> None:
        self.offset = offset
        self.inputs = 0  # shards opened in this pass
        self.before = array("q")  # per shard: outputs of the pass before its first one
        self.skipped = array("q")  # per shard: its samples consumed before the pass
        self.ends = array("q")  # per shard: its outputs in the pass (-1: still open)
        self.offsets: deque[tuple[int, array[int]]] = deque()  # (shard, next offsets)
        self.first = (start, first, shard)
        # Per shard, what names it and tells its version (see _fingerprint): its number in
        # the source's list, its size and head digest (-1: not known), a plain name's URL.
        self.numbers, self.bytes, self.heads = array("q"), array("q"), array("q")
        self.spans = array("q")
        self.named: dict[int, str] = {}
        self.current: Opened | None = None

    def open(self, made: int, start: int, shard: Shard, opened: Opened) -> array[int]:
        """*shard* opens after *made* outputs of the pass; its *start* samples were consumed
        before. Returns where its samples' offsets go."""
        self._settle()
        self.before.append(made)
        self.skipped.append(start)
        self.ends.append(-1)
        self.numbers.append(shard.number)
        self.bytes.append(-1)
        self.heads.append(0)
        self.spans.append(0)
        if shard.number < 0:
            self.named[self.inputs] = shard.url
        self.current = opened
        offsets = array("q")
        self.offsets.append((self.inputs, offsets))
        if len(self.offsets) > KEEP_OFFSETS:
            self.offsets.popleft()
        self.inputs += 1
        return offsets

    def close(self, outputs: int) -> None:
        """The open shard made *outputs* outputs in this pass."""
        self.ends[-1] = outputs
        self._settle()

    def _settle(self) -> None:
        """Keep the open shard's fingerprint as two numbers, once known."""
        if self.current is not None and self.bytes[-1] < 0:
            known = self.current.fingerprint()
            if known is not None:
                self.bytes[-1] = known["bytes"]
                self.heads[-1] = int.from_bytes(bytes.fromhex(known["head"]), "big", signed=True)
                self.spans[-1] = known.get("span", 0)
        if self.ends and self.ends[-1] >= 0:
            self.current = None

    def _fingerprint(self, j: int) -> dict[str, Any] | None:
        """Shard *j*'s name and version, as a state keeps them (``None``: not known)."""
        if j == self.inputs - 1:
            self._settle()
        if self.bytes[j] < 0:
            return None
        head = self.heads[j].to_bytes(8, "big", signed=True).hex()
        number = self.numbers[j]
        named = {"number": number} if number >= 0 else {"url": self.named.get(j, "")}
        return {**named, "bytes": self.bytes[j], "head": head, "span": self.spans[j]}

    def after(self, consumed: int) -> dict[str, Any]:
        """Where the reader stands once the consumer took *consumed* of this pass's outputs."""
        j = bisect_right(self.before, consumed) - 1
        if j < 0:  # nothing opened yet: where the pass began
            start, first, shard = self.first
            return _form(self.offset, start, first, shard)
        into = consumed - self.before[j]
        if self.ends[j] == into and (j + 1 == self.inputs or self.before[j + 1] > consumed):
            return {"inputs": self.offset + j + 1}  # the shard is done
        start = self.skipped[j] + into
        offset = self._offset(j, into)
        shard = self._fingerprint(j) if start else None
        if shard is None and j == 0:
            shard = self.first[2]
        return _form(self.offset + j, start, offset, shard)

    def _offset(self, j: int, into: int) -> int | None:
        if into == 0:
            return self.first[1] if j == 0 else None
        for shard, offsets in self.offsets:
            if shard == j:
                return offsets[into - 1] if into - 1 < len(offsets) else None
        return None


def _form(
    inputs: int, start: int, offset: int | None, shard: dict[str, Any] | None
) -> dict[str, Any]:
    out: dict[str, Any] = {"inputs": inputs}
    if start:
        out["start"] = start
        if offset is not None:
            out["offset"] = offset
        if shard is not None:
            out["shard"] = shard
    return out


def rule(parse: Parser, prefetch: int) -> Rule:
    """How a reader of *parse*'s format resumes: where its first *k* outputs leave it is in
    the pass's record (:class:`ReadRecord`); it reads ahead when it opens the next
    *prefetch* shards while it reads one."""
    verify = functools.partial(_verify, parse)
    return Rule.recorded(ReadRecord, verify=verify, identity=_identity, reads_ahead=prefetch > 0)


def read(
    parse: Parser,
    name: str,
    upstream: Iterable[Any],
    context: Context,
    record: ReadRecord | None,
    config: dict[str, Any],
) -> Iterator[Any]:
    """A reader stage's function, for the format's parser *parse* (see :func:`_read`)."""
    first = (None, None) if record is None else (record.first[1], record.first[2])
    return _read(parse, name, upstream, context, record, first, config)


def _identity(stage: Stage[Any, Any]) -> list[str]:
    """What a state compares: the format and what it makes of the bytes, not how they are
    fetched (prefetch, blocks, retries, timeouts, storage options may change between runs)."""
    kept = {k: v for k, v in stage.config.items() if k in ("decode", "columns")}
    return [f"{stage.name}({', '.join(f'{k}={_short(v)}' for k, v in kept.items())})"]


def _verify(
    parse: Parser, stage: Stage[Any, Any], record: dict[str, Any], where: str, source: Any
) -> None:
    """Refuse a checked record whose shard changed since the state was taken (another size
    or head) or is gone: its samples after the ``start`` consumed would not be the ones the
    state means. The shard is found by its number in *source*'s list, wherever the list now
    lives (see :func:`~pipeflow.sources.shards.root_of`)."""
    shard = record.get("shard")
    if shard is None:
        return
    check_fingerprint(shard, f"{where}['shard']")
    urls = getattr(source, "urls", None)
    number = shard.get("number", -1)
    url = urls[number] if urls is not None and 0 <= number < len(urls) else shard.get("url")
    if not isinstance(url, str):
        msg = f"load_state_dict: {where} names shard {number}, which the source does not have"
        raise ValueError(msg)
    verify_shard(parse, url, shard, dict(stage.config), where, record.get("start", 0))


def _read(
    parse: Parser,
    name: str,
    upstream: Iterable[Any],
    context: Context,
    record: ReadRecord | None,
    first: tuple[int | None, dict[str, Any] | None],
    config: dict[str, Any],
) -> Iterator[Any]:
    """The samples of every shard from *upstream*, the first from ``context.start`` (at the
    byte offset *first* gives, when known, in the version of the shard it names); a shard
    that fails is a :class:`ShardReadError` in its place."""
    config = {**config, "decoders": decoders(name, config.get("decode", False))}
    storage = Storage.of(config)
    start, made, offset = context.start, 0, first[0]
    try:
        open_ahead = OPEN_AHEAD.get(parse, open_stream)
        shards = _ahead(upstream, storage, first, open_ahead, config)
        for shard, opened in shards:
            offsets = record.open(made, start, shard, opened) if record is not None else None
            count, last = 0, None
            try:
                for sample, nxt in parse(shard, opened, start, offset, config):
                    if offsets is not None:
                        offsets.append(nxt)
                    count += 1
                    made += 1
                    last = sample
                    if sample.__class__ is Failure:  # a sample that failed to decode
                        annotate(sample.error, name, context.epoch, index=sample.indices[0])
                    yield sample
            except Exception as e:  # a parser's own, or anything it did not foresee
                if isinstance(e, ShardReadError):
                    error = _delivered(e, count, last, start)
                else:
                    error = _unforeseen(e, shard, count)
                count += 1
                made += 1
                if record is not None:  # the shard is done once its error is out
                    record.close(count)
                yield Failure(error, [(shard.url, shard.start + start + count - 1)])
            if record is not None:
                record.close(count)
            start, offset = 0, None
    finally:
        storage.close()


def _delivered(error: ShardReadError, count: int, last: Any, resumed: int) -> ShardReadError:
    """*error* (the store failing past the retries, a shard cut short...), saying how many
    samples of its shard were delivered before it, and the last by its key, where the
    parser's message does not already."""
    text = str(error)
    if "delivered before it" in text:
        return error
    key = last.get("__key__") if isinstance(last, dict) else None
    told = f"{count} of its samples were delivered before it" + (
        f", the last {key!r}" if key else ""
    )
    if resumed:
        told += f" (after the {resumed} before this pass resumed)"
    error.args = (f"{text}; {told}", *error.args[1:])
    return error


def _unforeseen(error: Exception, shard: Shard, count: int) -> ShardReadError:
    """A parser's unforeseen failure as the shard's one error: the pass goes on."""
    out = ShardReadError(
        f"shard {shard.url!r} could not be read after {count} of its samples were delivered "
        f"({type(error).__name__}: {error})"
    )
    out.__cause__ = error
    return out


class Opened:
    """A shard as its parser gets it: :meth:`stream` gives its bytes from byte *at* (already
    on their way, for a remote shard opened ahead); *storage* opens anything else (a Parquet
    file's footer and row groups)."""

    __slots__ = ("at", "early", "known", "opened", "storage")

    def __init__(
        self, storage: Storage, at: int, early: Any = None, known: dict[str, Any] | None = None
    ) -> None:
        self.storage, self.at, self.early = storage, at, early
        self.known = known  # the shard's fingerprint, when a parser or a state tells it
        self.opened: Stream | None = None

    def stream(self, url: str) -> Stream:
        """The shard's bytes from byte ``at`` (raises :class:`ShardReadError`)."""
        early, self.early = self.early, None
        if isinstance(early, BaseException):
            raise early
        self.opened = early if early is not None else self.storage.open(url, self.at)
        return self.opened

    def fingerprint(self) -> dict[str, Any] | None:
        """The shard's :func:`~pipeflow.sources.readers._bytes.fingerprint_of`, once known."""
        if self.known is None and self.opened is not None:
            self.known = self.opened.version()
        return self.known

    def close(self) -> None:
        """Release what was opened ahead and not read."""
        early, self.early = self.early, None
        if isinstance(early, Stream):
            early.close()
        elif hasattr(early, "cancel"):
            early.cancel()


def open_stream(storage: Storage, shard: Shard, at: int, config: dict[str, Any]) -> Any:
    """Open a remote shard's byte stream ahead (its first blocks on their way); ``None``
    for a local one (a buffered file needs no head start)."""
    return None if is_local(shard.url) else storage.open(shard.url, at)


#: How each format opens a shard ahead, by its parser (the byte stream formats by default).
OPEN_AHEAD: dict[Any, Callable[..., Any]] = {}


def _ahead(
    upstream: Iterable[Any],
    storage: Storage,
    first_at: tuple[int | None, dict[str, Any] | None],
    open_ahead: Callable[..., Any],
    config: dict[str, Any],
) -> Iterator[tuple[Shard, Opened]]:
    """Each shard with its :class:`Opened`, the next ``prefetch`` shards opened ahead (the
    first shard of a resumed pass from *offset*), so their bytes are on their way while one
    is parsed."""
    pending: deque[tuple[Shard, Opened]] = deque()
    first, prefetch = True, config["prefetch"]
    offset, known = first_at
    try:
        for item in upstream:
            shard = as_shard(item)
            at = (offset or 0) if first else 0
            # A resumed shard opened inside is the version its state names (checked at load).
            opened = Opened(storage, at, known=known if first and at else None)
            first = False
            if prefetch:
                try:
                    opened.early = open_ahead(storage, shard, at, config)
                except ShardReadError as e:
                    opened.early = e
            pending.append((shard, opened))
            if len(pending) > prefetch:
                yield pending.popleft()
        while pending:
            yield pending.popleft()
    finally:
        for _, opened in pending:
            opened.close()
