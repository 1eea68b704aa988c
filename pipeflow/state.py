"""Exact resumption, in one place: what a state records, and the skip plan of a resumed pass.

A state is a small JSON-serialisable dict (when the user's objects' states are):

```python
{
    "pipeflow_state": 3,              # the format's version
    "epoch": 3,                       # the epoch to resume
    "position": 1200,                 # outputs of that epoch already consumed
    "length": 782,                    # outputs per epoch, when known
    "pipeline": ["indices(50000)", "shuffle(seed=<seed>)", "batch(size=64, ...)", ...],
    "seeds": [["shuffle", 0, False]],  # every seed: its stage, value, drawn by pipeflow?
    "stages": {"4": {"prefix": 8000, "extras": [8003, 8010]}},  # the stages' records
    "source": {"at": 1200, "object": ..., "iterator": ...},  # the source's, if it keeps one
    "digests": {"seeds": "9f0c...", "stages": {"4": "1be2..."}, "source": "77a0..."},
}
```

What a pipeline *is* — its stages, sizes, dataset length, the seeds the user gave — is
compared when a state is loaded (:mod:`pipeflow._state_check`), and anything that differs is
refused by name; seeds pipeflow drew itself travel in the state and a freshly built loader
adopts them (:mod:`pipeflow._seeds`), so a new process resumes. Runtime knobs (workers,
backends, in-flight bounds) are not part of it: a map-style pipeline resumes with any worker
count. The ``digests`` bind the seeds and every record to the pipeline, and every record to
the epoch and position it was taken at (:mod:`pipeflow._seal`): a record changed after
``state_dict()`` gave it, or taken from another state, is refused at load.

Each stage says how its first ``k`` outputs are skipped, through one method,
:meth:`pipeflow.Stage.resumption`, which answers with a :class:`Resume`:

- ``Resume.below(n)``: skipping its first ``n`` inputs skips exactly its first ``k`` outputs
  (a map: ``n = k``; a batch of 64: ``n = 64 * k``). The question moves up a stage, so the
  first ``position`` outputs of ``indices | shuffle | batch(64) | fetch | collate`` are
  skipped as the first ``64 * position`` shuffled indices: nothing consumed is fetched,
  decoded or collated again.
- ``Resume.seek()``: the stage skips them itself, cheaply (it gets ``context.start = k``).
- ``Resume.replay()``: the consumed items are replayed through the stage and dropped after
  it (a ``filter``: which inputs made the first ``k`` outputs is only known by running it).
- ``Resume.recorded()``: the stage keeps a record of each pass (:meth:`pipeflow.Stage.new_record`)
  whose ``after(consumed)`` says where it stood once the consumer had taken ``consumed`` of
  its outputs, in one of two forms:

  - ``{"prefix": p, "extras": [...]}``: it delivers out of order (an unordered
    ``parallel_map``), so "the first k" is not enough: every item numbered below ``p``, and
    the ``extras`` after it, were delivered, and a resumed pass skips exactly those;
  - ``{"inputs": n}`` or ``{"inputs": n, "start": m}``: a resumed pass skips the stage's
    first ``n`` inputs (``context.offset == n``), and the stage skips its own first ``m``
    outputs after that itself (``context.start == m``): ``ignore_errors`` (the inputs its
    outputs and drops took), or a stage with a bounded buffer that restarts where its
    buffer was last empty and makes the same ``m`` outputs again without yielding them.

Besides, the user's stateful objects (a dataset, sampler or iterable with ``state_dict()``)
are saved where the consumer stood (:mod:`pipeflow._objects`), and so are a parallel stage's
workers' states (:mod:`pipeflow.parallel._records`).

A state saved after the last item of an epoch, before the pass ended, resumes to an empty rest
of that epoch, then the next epoch; a state saved after the pass ended is the next epoch's
start (with what carries into it: a stateful dataset's state, persistent workers' states).
"""

from __future__ import annotations

import itertools
import operator
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pipeflow._random import DrawnSeed
from pipeflow._seal import digest
from pipeflow._seeds import MASK, replaced, slots

__all__ = [
    "READS",
    "VERSION",
    "Kept",
    "Plan",
    "Progress",
    "Record",
    "Resume",
    "digests",
    "fingerprint",
    "plan",
    "seeds",
    "take",
    "taken",
    "through",
]

VERSION = 3
#: The formats :func:`pipeflow._state_check.check` reads: format 2 (pipeflow before the
#: digests) is checked as it was, without them.
READS = (2, 3)


@dataclass(frozen=True)
class Resume:
    """How a stage skips its first outputs when a pass resumes (see the module's text)."""

    kind: Literal["below", "seek", "replay", "recorded"]
    inputs: int = 0
    #: A recorded stage that delivers out of order (an unordered ``parallel_map``).
    unordered: bool = False

    @staticmethod
    def below(inputs: int) -> Resume:
        """Skipping the first *inputs* inputs skips exactly the outputs asked about."""
        return Resume("below", inputs)

    @staticmethod
    def seek() -> Resume:
        """The stage skips the outputs itself, told by ``context.start``."""
        return Resume("seek")

    @staticmethod
    def replay() -> Resume:
        """The consumed items are replayed through the stage and dropped after it."""
        return Resume("replay")

    @staticmethod
    def recorded(unordered: bool = False) -> Resume:
        """The stage records in each pass what resuming it needs (see :class:`Delivery`,
        :class:`Drops`); a state holds that record's :meth:`after`. *unordered*: it
        delivers out of order (its record is a :class:`Delivery`)."""
        return Resume("recorded", unordered=unordered)


class Record:
    """What a recording stage (or source) keeps in one pass for ``state_dict()``: the base of
    every record, with what the loader may ask of any of them.

    :meth:`after` is the record's state once the consumer took *consumed* of the pass's
    outputs; the others answer for the records that need them: :meth:`ended_record` (what
    carries into the next epoch), :meth:`watch` (how many outputs the consumer took, for a
    record that folds what it had), :meth:`read_ahead` (a later stage reads ahead of the
    consumer: keep a snapshot after every item)."""

    __slots__ = ()

    def after(self, consumed: int) -> dict[str, Any]:
        """The record's state once the consumer took *consumed* of this pass's outputs."""
        raise NotImplementedError

    def ended_record(self) -> dict[str, Any] | None:
        """What the record carries into the next epoch once its pass ended (``None``)."""
        return None

    def watch(self, consumed: Callable[[], int | None]) -> None:
        """*consumed()* tells how many of this pass's outputs the consumer has taken."""

    def read_ahead(self) -> None:
        """A stage after this one reads ahead of the consumer (nothing to do, by default)."""


class Delivery:
    """What an out-of-order stage delivered in one pass: every item numbered below *prefix*
    and *extras* before the pass (a resumed one), then *order*, in delivery order."""

    __slots__ = ("extras", "order", "prefix")

    def __init__(self, prefix: int, extras: frozenset[int]) -> None:
        self.prefix = prefix
        self.extras = extras
        self.order: list[int] = []

    @staticmethod
    def check(record: Any, where: str, consumed: int | None, total: int | None) -> dict[str, Any]:
        """Refuse a record that :meth:`after` could not have made for an epoch of *total*
        items of which the consumer took *consumed* outputs (``None``: not known)."""
        record_keys(record, where, {"prefix", "extras"}, set())
        prefix = integer(record["prefix"], f"{where}['prefix']", 0, total)
        extras = record["extras"]
        if not isinstance(extras, list):
            msg = f"load_state_dict: {where}['extras'] must be a list (got {extras!r})"
            raise ValueError(msg)
        last = prefix
        for i, x in enumerate(extras):
            integer(x, f"{where}['extras'][{i}]", last + 1, None if total is None else total - 1)
            last = x
        if consumed is not None and prefix + len(extras) > consumed:
            msg = (
                f"load_state_dict: {where} says {prefix + len(extras)} items were delivered, "
                f"but the state's position says only {consumed} outputs were consumed"
            )
            raise ValueError(msg)
        return {"prefix": prefix, "extras": list(extras)}

    def after(self, consumed: int) -> dict[str, Any]:
        """The stage's state once the consumer took *consumed* of this pass's outputs."""
        done = set(self.extras) | set(self.order[:consumed])
        prefix = self.prefix
        while prefix in done:
            done.discard(prefix)
            prefix += 1
        return {"prefix": prefix, "extras": sorted(done)}


class Drops(Record):
    """What a stage that drops inputs (``ignore_errors``) did in one pass: for each input it
    dropped, how many outputs it had yielded before. Its first *consumed* outputs then took
    ``offset + consumed + (drops before)`` of its inputs: a resumed pass skips exactly those,
    so a dropped item is not read again."""

    __slots__ = ("before", "earlier", "every", "offset")

    def __init__(self, offset: int, earlier: int = 0) -> None:
        self.offset = offset  # inputs skipped before this pass (a resumed one)
        self.earlier = earlier  # failures dropped in this epoch before this pass
        self.before: list[int] = []  # outputs yielded before each item dropped whole
        self.every: list[int] = []  # outputs yielded before each drop (samples included)

    def after(self, consumed: int) -> dict[str, Any]:
        """The stage's state once the consumer took *consumed* of this pass's outputs: the
        inputs those outputs took, and the failures dropped so far in the epoch (what the
        error budget has spent)."""
        return {
            "inputs": self.offset + consumed + sum(d <= consumed for d in self.before),
            "dropped": self.earlier + sum(d <= consumed for d in self.every),
        }

    @staticmethod
    def check(record: Any, where: str, consumed: int | None, total: int | None) -> dict[str, Any]:
        """Refuse a record :meth:`after` could not have made (see :func:`check_inputs`)."""
        checked = check_inputs(record, where, consumed, total, {"dropped"})
        dropped = integer(checked.get("dropped", 0), f"{where}['dropped']", 0, checked["inputs"])
        if consumed is not None and not consumed <= checked["inputs"] <= consumed + dropped:
            msg = (
                f"load_state_dict: {where} says its outputs took {checked['inputs']} inputs, "
                f"but the state's position says {consumed} outputs were consumed, with "
                f"{dropped} items dropped"
            )
            raise ValueError(msg)
        return checked


class Kept(Record):
    """What a stage that keeps some of its inputs and drops the others (``filter``) did in
    one pass: its first *consumed* outputs took ``offset + consumed`` inputs, and the ones it
    dropped before its output ``consumed + 1``; a resumed pass skips exactly those.

    The drops are kept as runs (how many outputs were made before a run of drops, and the
    drops up to its end), two ``array('q')``: 16 bytes per run, nothing per kept item.

    Examples:
        >>> k = Kept(offset=10)
        >>> for keep in (False, False, True, True, True, False):
        ...     k.note(keep)
        ...
        >>> k.after(0), k.after(2), k.after(3)
        ({'inputs': 12}, {'inputs': 14}, {'inputs': 16})
    """

    __slots__ = ("drops", "made", "offset", "outputs")

    def __init__(self, offset: int) -> None:
        self.offset = offset
        self.made = 0  # outputs of the pass so far (an item whose test raised is one)
        self.outputs = array("q")  # outputs made before each run of drops
        self.drops = array("q")  # drops up to the end of each run

    def note(self, kept: bool) -> None:
        """One input, kept (an output, or an error in its place) or dropped."""
        if kept:
            self.made += 1
        elif self.outputs and self.outputs[-1] == self.made:
            self.drops[-1] += 1
        else:
            self.outputs.append(self.made)
            self.drops.append((self.drops[-1] if self.drops else 0) + 1)

    def after(self, consumed: int) -> dict[str, Any]:
        """The inputs the first *consumed* outputs of the pass took (with the drops before
        the next output: dropping them again would give the same). Past the outputs made
        (a ``batch`` after it counts its last, short batch as full), all it read."""
        consumed = min(consumed, self.made)
        i = bisect_right(self.outputs, consumed)
        return {"inputs": self.offset + consumed + (self.drops[i - 1] if i else 0)}

    @staticmethod
    def check(record: Any, where: str, consumed: int | None, total: int | None) -> dict[str, Any]:
        """Refuse a record :meth:`after` could not have made (see :func:`check_inputs`)."""
        checked = check_inputs(record, where, None, total)
        return {"inputs": checked["inputs"]}


def check_inputs(
    record: Any,
    where: str,
    consumed: int | None,
    total: int | None,
    optional: set[str] | frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Refuse an ``{"inputs": n, ...}`` record (see :class:`Resume`) that is malformed or
    out of range: *n* is at most the stage's *total* inputs per epoch, and at least its
    *consumed* outputs when it yields at most one output per input (a ``"start"``, other
    keys in *optional*: integers at least 0, checked here; anything else is the stage's)."""
    record_keys(record, where, {"inputs"}, {"start", *optional})
    inputs = integer(record["inputs"], f"{where}['inputs']", 0, total)
    if "start" in record:  # outputs it makes again and skips: some the consumer took
        integer(record["start"], f"{where}['start']", 0, consumed)
    return {**record, "inputs": inputs}


class Progress:
    """One pass, as resumption sees it: its epoch, where it started, what it delivered."""

    __slots__ = ("delivered", "deliveries", "done", "epoch", "source", "start", "superseded")

    def __init__(self, epoch: int, start: int) -> None:
        self.source: Any = None  # the source's record (its stateful objects' snapshots)
        self.epoch = epoch
        self.start = start  # outputs of this epoch skipped (a resumed pass)
        self.delivered = 0  # outputs yielded by this pass
        self.done = False  # the pass ran to its end
        self.superseded = False  # set_epoch / load_state_dict / a newer pass came after it
        self.deliveries: dict[int, Any] = {}  # by stage position: records (Delivery, Drops)


@dataclass(frozen=True)
class Plan:
    """Where a pass skips what was consumed.

    Attributes:
        source_skip: items to skip straight out of the source.
        cut: ``{stage position: outputs to drop after that stage}`` (a replayed stage).
        start: ``{stage position: outputs it skips itself}`` (a seeking stage).
        offsets: per stage, how many of its inputs were skipped before its first one.
        extras: ``{stage position: numbers of items delivered before}`` (out-of-order).
    """

    source_skip: int = 0
    cut: tuple[tuple[int, int], ...] = ()
    start: tuple[tuple[int, int], ...] = ()
    offsets: tuple[int, ...] = ()
    extras: tuple[tuple[int, frozenset[int]], ...] = ()


def plan(stages: Sequence[Any], contexts: Sequence[Any], resume: dict[str, Any]) -> Plan:
    """The skip plan for a pass that resumes at ``resume["position"]`` (and its stages).

    *contexts* are the stages' contexts as the pass would give them without resuming (a
    stage's answer may depend on them).
    """
    n = len(stages)
    records = resume.get("stages", {})
    k = resume.get("position", 0)
    end = n
    extras: tuple[tuple[int, frozenset[int]], ...] = ()
    unordered = [i for i, r in records.items() if "prefix" in r]
    offsets = [0] * n
    if unordered:  # an out-of-order stage: skip what it had delivered, below it
        end = min(unordered)
        k = records[end]["prefix"]
        extras = ((end, frozenset(records[end]["extras"])),)
        offsets[end] = k
        for j in range(end + 1, n):  # after it, what its outputs skipped, by length
            prev = offsets[j - 1]
            offsets[j] = (stages[j - 1].length(prev) or 0) if prev else 0
    source_skip = k
    cut: tuple[tuple[int, int], ...] = ()
    start: tuple[tuple[int, int], ...] = ()
    for i in range(end - 1, -1, -1):
        if i + 1 < end:
            offsets[i + 1] = k  # stage i + 1 skips the k outputs of stage i
        saved = records.get(i)
        if saved is not None and "inputs" in saved:  # a recording stage said where it stood
            if saved.get("start"):  # it restarts at that input and skips its own outputs
                start = (*start, (i, saved["start"]))
            k = source_skip = saved["inputs"]
            continue
        answer = stages[i].resumption(k, contexts[i])
        if answer.kind == "below":
            k = source_skip = answer.inputs
            continue
        source_skip = 0
        if answer.kind == "seek":
            start = (*start, (i, k))
        elif k:
            cut = ((i, k),)
        break
    else:
        if end > 0:
            offsets[0] = source_skip  # stage 0 skips what the source skipped
    return Plan(source_skip, cut, start, tuple(offsets), extras)


def integer(value: Any, where: str, low: int = 0, high: int | None = None) -> int:
    """*value* as an int in ``[low, high]``, else a ``ValueError`` naming *where*."""
    if isinstance(value, bool) or not isinstance(value, int):
        msg = f"{where} must be an integer (got {value!r})"
        raise ValueError(f"load_state_dict: {msg}")
    if value < low or (high is not None and value > high):
        bound = f"at least {low}" if high is None else f"between {low} and {high}"
        msg = f"{where} must be {bound} (got {value})"
        raise ValueError(f"load_state_dict: {msg}")
    return value


def record_keys(record: Any, where: str, required: set[str], optional: set[str]) -> None:
    """Refuse a record that is not a dict with the *required* keys and no unknown one."""
    if not isinstance(record, dict):
        msg = f"{where} must be a dict (got {type(record).__name__})"
        raise ValueError(f"load_state_dict: {msg}")
    missing = sorted(required - set(record))
    if missing:
        msg = f"{where} lacks the key {missing[0]!r} (it has {sorted(map(str, record))})"
        raise ValueError(f"load_state_dict: {msg}")
    unknown = sorted(set(map(str, record)) - required - optional)
    if unknown:
        msg = f"{where} has an unknown key {unknown[0]!r} (known: {sorted(required | optional)})"
        raise ValueError(f"load_state_dict: {msg}")


# -- taking states ------------------------------------------------------------------------------
def _identity(stage: Any) -> list[str]:
    identity: list[str] = stage.identity()
    return identity


def fingerprint(source: Any, stages: Sequence[Any]) -> list[str]:
    """The pipeline's identity: its source and every stage, without runtime knobs, with every
    seed shown as ``<seed>`` (seeds are compared apart: see :func:`seeds`).

    A ``parallel_map`` in order counts as the stages it runs, so states move freely between
    runs with and without workers.
    """
    source, *masked = replaced([source, *stages], itertools.repeat(MASK))
    return [source.identity(), *(x for s in masked for x in _identity(s))]


def seeds(source: Any, stages: Sequence[Any]) -> list[list[Any]]:
    """Every seed of the pipeline as ``[owner, seed, drawn]``, in order (JSON-ready)."""
    return [
        [owner, int(seed), isinstance(seed, DrawnSeed)] for owner, seed in slots([source, *stages])
    ]


def flat_index(stages: Sequence[Any], index: int) -> int:
    """Where stage *index* starts in the fingerprint (after the source)."""
    return sum(len(_identity(s)) for s in stages[:index])


def take(
    source: Any,
    stages: Sequence[Any],
    length: int | None,
    progress: Progress | None,
    pending: tuple[int, dict[str, Any]],
) -> dict[str, Any]:
    """The state of a loader, given its latest pass and where its next pass would start.

    *pending* is ``(epoch, resume)``: what the next pass does when no pass is in progress (a
    loaded state's records, kept as they were loaded).
    """
    records: dict[int, Any] = {}
    if progress is None or progress.superseded:
        epoch, resume = pending
        position = resume.get("position", 0)
        records = resume.get("stages", {})
        kept = resume.get("source", source.idle_record())
    elif progress.done:
        epoch, position = progress.epoch + 1, 0
        kept = progress.source.ended_record() if progress.source is not None else None
        kept = source.idle_record() if kept is None else kept
        records = _carried(progress)
    else:
        epoch, position = progress.epoch, progress.start + progress.delivered
        records = _recorded(stages, progress)
        kept = None
        if progress.source is not None:
            needed = plan(stages, [None] * len(stages), {"position": position, "stages": records})
            kept = progress.source.after(needed.source_skip)
    state = {
        "pipeflow_state": VERSION,
        "epoch": epoch,
        "position": position,
        "length": length,
        "pipeline": fingerprint(source, stages),
        "seeds": seeds(source, stages),
        "stages": {str(flat_index(stages, k)): v for k, v in records.items()},
    }
    if kept is not None:
        state["source"] = kept
    state["digests"] = digests(state)
    return state


def digests(state: dict[str, Any]) -> dict[str, Any]:
    """The digests that bind *state*'s seeds and records to its pipeline, and its records to
    its epoch and position (see :mod:`pipeflow._seal`): ``{"seeds": ..., "stages": {key:
    ...}, "source": ...}``."""
    pipeline, epoch, position = state["pipeline"], state["epoch"], state["position"]
    out: dict[str, Any] = {
        "seeds": digest("seeds", pipeline, state["seeds"]),
        "stages": {
            key: digest("stage", pipeline, key, epoch, position, record)
            for key, record in state["stages"].items()
        },
    }
    if "source" in state:
        out["source"] = digest("source", pipeline, epoch, position, state["source"])
    return out


def light(source: Any, stages: Sequence[Any], progress: Progress | None) -> dict[str, Any] | None:
    """Where a pass stands, without the pipeline's identity: what a worker's replica of a
    loader reports with each item (``None`` when its position, which the main process
    counts, says it all: no stateful objects, no stage records)."""
    if progress is None or (progress.source is None and not progress.deliveries):
        return None
    if progress.done:
        kept = source.idle_record()
        return {"position": 0, "stages": {}, **({"source": kept} if kept else {})}
    position = progress.start + progress.delivered
    records = _recorded(stages, progress)
    out: dict[str, Any] = {"position": position, "stages": records}
    if progress.source is not None:
        needed = plan(stages, [None] * len(stages), {"position": position, "stages": records})
        out["source"] = progress.source.after(needed.source_skip)
    out["stages"] = {str(flat_index(stages, k)): v for k, v in records.items()}
    return out


def through(stages: Sequence[Any], k: int) -> int | None:
    """The inputs of the first of *stages* that the first *k* outputs of the last took, or
    ``None`` past a stage that is not a map or a batch (it can't be told without a record)."""
    for s in reversed(stages):
        answer = s.resumption(k, None)
        if answer.kind != "below":
            return None
        k = answer.inputs
    return k


def taken(record: dict[str, Any]) -> int:
    """How many of its stage's inputs a record's outputs took: its ``inputs``; for an
    out-of-order stage, its ``prefix`` (the stage resumes numbering its inputs there, and
    passes over the ``extras`` it had delivered after it)."""
    return int(record["inputs"] if "inputs" in record else record["prefix"])


def _carried(progress: Progress) -> dict[int, Any]:
    """What a finished pass's recording stages carry into the next epoch (a stateful
    dataset's state, persistent workers' states), by stage position."""
    out = {}
    for i, record in progress.deliveries.items():
        kept = record.ended_record()
        if kept is not None:
            out[i] = kept
    return out


def _recorded(stages: Sequence[Any], progress: Progress) -> dict[int, Any]:
    """What the recording stages of a pass in progress hold, by stage position.

    Walks from the last stage up, turning the outputs the consumer took into each stage's
    inputs taken, so every record is read at the count of its own outputs consumed. Above
    a stage that a resumed pass replays or that seeks (it re-reads its input from the
    epoch's start), every record is read at 0: where its stage stood at the pass's start.
    """
    records: dict[int, Any] = {}
    consumed = progress.delivered  # outputs of stage i taken, from the end
    for i in range(len(stages) - 1, -1, -1):
        record = progress.deliveries.get(i)
        if record is not None:
            saved = record.after(consumed)
            records[i] = saved
            consumed = taken(saved)
            continue
        answer = stages[i].resumption(consumed, None)
        consumed = answer.inputs if answer.kind == "below" else 0
    return records


def reread_after_unordered(stages: Sequence[Any]) -> str | None:
    """Why no state of *stages* could be taken mid-epoch, or ``None``: a stage that
    delivers out of order (an unordered ``parallel_map``) with a stage after it that a
    resumed pass replays or that seeks (it re-reads its input from the epoch's start, and
    the out-of-order stage would deliver it in another order)."""
    for i, s in enumerate(stages):
        if not s.resumption(1, None).unordered:
            continue
        for later in stages[i + 1 :]:
            kind = later.resumption(1, None).kind
            if kind in ("seek", "replay"):
                why = (
                    "it reads the whole epoch first"
                    if kind == "seek"
                    else "what it made is only known by running it"
                )
                return (
                    f"{s.name} (stage {i + 1}) delivers out of order, and {later.name} after "
                    f"it reads its input again from the epoch's start when a pass resumes "
                    f"({why}), which would come in another order: no state of this pipeline "
                    f"could be taken mid-epoch. Use ordered=True, or put {later.name} before "
                    f"{s.name}"
                )
    return None


# -- the pieces a pass runs --------------------------------------------------------------------
def numbered(items: Iterable[Any], first: int, skip: frozenset[int]) -> Iterator[Any]:
    """``(number, item)`` pairs counted from *first*, without the numbers in *skip* (items
    an out-of-order stage delivered before the pass resumed)."""
    if not skip:
        return enumerate(items, first)
    return ((seq, item) for seq, item in enumerate(items, first) if seq not in skip)


def recording(pairs: Iterable[tuple[int, Any]], order: list[int] | None) -> Iterator[Any]:
    """Strip the numbers from ``(number, result)`` pairs, noting them in *order*."""
    if order is None:
        return map(_second, pairs)
    return _noting(pairs, order.append)


_second = operator.itemgetter(1)


def _noting(pairs: Iterable[tuple[int, Any]], note: Callable[[int], Any]) -> Iterator[Any]:
    for seq, value in pairs:
        note(seq)
        yield value
