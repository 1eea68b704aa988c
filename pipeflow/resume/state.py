"""The resume protocol's declarations (:class:`Rule`, :class:`Record`, :class:`Form` and its
field types, :func:`conform`, the one validator), the skip plan of a resumed pass
(:func:`plan`), and the taking of a state (:func:`take`, :func:`light`).

What a state holds, and the four rules, are told in :mod:`pipeflow.state`, the public face of
this module.
"""

from __future__ import annotations

import itertools
import operator
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from pipeflow._random import DrawnSeed
from pipeflow.resume._seal import digest
from pipeflow.resume._seeds import MASK, replaced, slots

__all__ = [
    "READS",
    "VERSION",
    "ByWorker",
    "Each",
    "Form",
    "Int",
    "Kept",
    "Nested",
    "Plan",
    "Progress",
    "Record",
    "Rising",
    "Rule",
    "Value",
    "conform",
    "digests",
    "fingerprint",
    "flag",
    "plan",
    "seeds",
    "skipped",
    "take",
    "taken",
    "through",
]

VERSION = 3
#: The formats :func:`pipeflow.resume._check.check` reads: format 2 (pipeflow before the
#: digests) is checked as it was, without them.
READS = (2, 3)


# -- what a state may hold of a record, declared once ------------------------------------------
@dataclass(frozen=True)
class Int:
    """A field of a record: an integer in ``[low, high]``. A bound is a number, or the name
    of a bound the validator is given (``"consumed"``, ``"total"``) or of a field declared
    before it; a bound that is ``None`` there (unknown) does not bound."""

    low: int | str = 0
    high: int | str | None = None
    optional: bool = False


@dataclass(frozen=True)
class Rising:
    """A field of a record: a list of strictly increasing integers, each above the field
    *above* and below the bound *below* (as for :class:`Int`)."""

    above: str
    below: str | None = None
    optional: bool = False


@dataclass(frozen=True)
class Value:
    """A field of a record that is not a number: any value, refused by *check(value,
    where)* (a ``ValueError``) when given one, or when *required* is set and it is ``None``."""

    check: Callable[[Any, str], Any] | None = None
    optional: bool = False
    required: bool = False


@dataclass(frozen=True)
class Each:
    """A field of a record: a list of *length* values (a number, or a bound's name, as for
    :class:`Int`; ``None``: any), each as *item* declares."""

    item: Int | Value | Nested
    length: int | str | None = None
    optional: bool = False


@dataclass(frozen=True)
class Nested:
    """A field of a record that is a record itself, as *form* declares (checked with the same
    bounds); ``None`` too when *nullable*."""

    form: Form
    nullable: bool = False
    optional: bool = False


@dataclass(frozen=True)
class ByWorker:
    """A field of a record: a dict keyed by worker ids (``"0"``, ``"1"``...), each value as
    *form* declares (checked with the same bounds, and ``"worker"``: its id); an id at or
    above the bound *below* (a bound's name; ``None``: any) is refused."""

    form: Form
    below: str | None = None
    optional: bool = False


#: An invariant between a record's fields and the validator's bounds: ``(holds, says)``,
#: two functions of the mapping of both (and ``"where"``): whether it holds, and what a
#: refusal says when it does not.
Invariant = tuple[Callable[[Mapping[str, Any]], bool], Callable[[Mapping[str, Any]], str]]


@dataclass(frozen=True)
class Form:
    """What a state may hold of a record: its fields, in order, and its invariants.

    Attributes:
        fields: every key, and what its value must be (:class:`Int`, :class:`Rising`,
            :class:`Value`); a key not declared is refused, a declared one that is not
            optional must be there.
        invariants: what must hold between them (see :data:`Invariant`), checked in order
            once every field passed.
        keep: the fields the checked record keeps (``None``: all it has).

    Examples:
        >>> form = Form({"inputs": Int(0, "total"), "start": Int(0, "consumed", True)})
        >>> conform(form, {"inputs": 4, "start": 1}, "r", {"consumed": 2, "total": 10})
        {'inputs': 4, 'start': 1}
        >>> conform(form, {"inputs": 12}, "r", {"consumed": 2, "total": 10})
        Traceback (most recent call last):
        ...
        ValueError: load_state_dict: r['inputs'] must be between 0 and 10 (got 12)
    """

    fields: Mapping[str, Int | Rising | Value | Each | Nested | ByWorker]
    invariants: tuple[Invariant, ...] = ()
    keep: tuple[str, ...] | None = None


def conform(form: Form, record: Any, where: str, bounds: Mapping[str, Any]) -> dict[str, Any]:
    """The validator: *record* as *form* declares it, else a ``ValueError`` that names
    *where*, the key and the reason (see :class:`Form`). *bounds* are what the fields may
    be bounded by (``"consumed"``, ``"total"``; ``None`` where unknown)."""
    required = {k for k, f in form.fields.items() if not f.optional}
    record_keys(record, where, required, set(form.fields) - required)
    known: dict[str, Any] = {**bounds, "where": where}
    out: dict[str, Any] = {}
    for key, field in form.fields.items():
        if key in record:
            known[key] = out[key] = _field(field, record[key], f"{where}[{key!r}]", known)
    for holds, says in form.invariants:
        if not holds(known):
            raise ValueError(f"load_state_dict: {says(known)}")
    return out if form.keep is None else {k: out[k] for k in form.keep if k in out}


def _field(field: Any, value: Any, place: str, known: Mapping[str, Any]) -> Any:
    """*value* as *field* declares it (see :func:`conform`)."""
    bounds = {k: v for k, v in known.items() if k != "where"}
    if isinstance(field, Int):
        low = _bound(field.low, known)
        return integer(value, place, 0 if low is None else low, _bound(field.high, known))
    if isinstance(field, Rising):
        return _rising(value, place, known[field.above], _bound(field.below, known))
    if isinstance(field, Each):
        n = _bound(field.length, known)
        if not isinstance(value, list) or (n is not None and len(value) != n):
            size = "a list" if n is None else f"a list of {n}"
            raise ValueError(f"load_state_dict: {place} must be {size} (got {value!r})")
        return [_field(field.item, x, f"{place}[{i}]", known) for i, x in enumerate(value)]
    if isinstance(field, Nested):
        if value is None and field.nullable:
            return None
        return conform(field.form, value, place, bounds)
    if isinstance(field, ByWorker):
        return _by_worker(field, value, place, bounds)
    if field.required and value is None:
        raise ValueError(f"load_state_dict: {place} is missing")
    if field.check is not None:
        field.check(value, place)
    return value


def _by_worker(field: ByWorker, value: Any, place: str, bounds: dict[str, Any]) -> Any:
    if not isinstance(value, dict):
        raise ValueError(f"load_state_dict: {place} must be a dict (got {type(value).__name__})")
    below = _bound(field.below, bounds)
    for key, entry in value.items():
        wid = int(key) if isinstance(key, str) and key.isdigit() else None
        if wid is None or (below is not None and wid >= below):
            msg = f"load_state_dict: {place} names a worker {key!r} that does not exist"
            raise ValueError(msg)
        conform(field.form, entry, f"{place}[{key!r}]", {**bounds, "worker": wid})
    return value


def flag(value: Any, where: str) -> None:
    """Refuse a field that must be a bool."""
    if not isinstance(value, bool):
        raise ValueError(f"load_state_dict: {where} must be a bool (got {value!r})")


def _bound(bound: int | str | None, known: Mapping[str, Any]) -> int | None:
    return known.get(bound) if isinstance(bound, str) else bound


def _rising(value: Any, where: str, above: int, below: int | None) -> list[int]:
    if not isinstance(value, list):
        raise ValueError(f"load_state_dict: {where} must be a list (got {value!r})")
    last = above
    for i, x in enumerate(value):
        integer(x, f"{where}[{i}]", last + 1, None if below is None else below - 1)
        last = x
    return list(value)


@dataclass(frozen=True)
class Rule:
    """How a stage resumes, declared once when the stage is built: the stage's
    :attr:`~pipeflow.Stage.resume` (see the module's text for the four kinds). A source
    declares its own the same way (:attr:`~pipeflow.Source.resume`): ``replay`` (its items
    are read again), ``seek`` (it starts at ``context.start``), or ``recorded`` (it starts
    there from the record its pass kept).

    The functions a rule holds are called with the stage itself first (so that a stage with
    the state's seeds adopted checks with those); the loader calls them, never the stage.

    Attributes:
        kind: ``"below"``, ``"seek"``, ``"replay"`` or ``"recorded"``.
        per: for ``"below"``, the inputs its first ``k`` outputs took: ``"same"`` (``k``: a
            map) or ``per(k, **config)`` (a batch of 64: ``64 * k``).
        unordered: a recorded stage that delivers out of order (its record is a
            :class:`Delivery`).
        record: the class of the stage's record (a :class:`Record`), or ``None``: it keeps
            none. ``record.begin(stage, context, saved)`` makes the pass's record, given the
            stage's record in the state the pass resumes (``None`` at an epoch's start); the
            stage's function gets it as its ``record`` keyword. What a state may hold of it
            is declared once, by the class's :attr:`Record.FORM`, and checked at load by
            :meth:`Record.check`.
        check_pass: ``check_pass(stage, record, where, epoch)``: refuse a checked record
            from another pass than the one the state resumes (epoch *epoch*).
        verify: ``verify(stage, record, where, source)``: refuse a checked record whose data
            changed since the state was taken (a reader's shard).
        identity: ``identity(stage)``: what a state compares to tell whether it comes from a
            pipeline like this one, as a list of strings (its repr, a source's
            ``describe()``, by default); runtime knobs are left out.
        must_hold: for a recording source, whether a state that consumed some of its items
            must hold its record: a bool, or ``must_hold(source)``.
        idle: for a recording source, ``idle(source)``: its record between passes (a
            stateful object's state now), or ``None``.
        reads_ahead: the stage reads its input ahead of its consumer (a parallel stage, a
            prefetching thread): the stateful objects above it keep a snapshot after every
            item, so a state is taken where the consumer stood (:mod:`pipeflow.resume._objects`).

    Examples:
        >>> Rule.below("same").inputs(5, {})
        5
        >>> Rule.below(lambda k, size: k * size).inputs(3, {"size": 64})
        192
        >>> Rule.replay().inputs(3, {}) is None
        True
    """

    kind: Literal["below", "seek", "replay", "recorded"]
    per: Any = None
    unordered: bool = False
    record: type[Record] | None = None
    check_pass: Callable[..., None] | None = None
    verify: Callable[..., None] | None = None
    identity: Callable[[Any], list[str]] | None = None
    reads_ahead: bool = False
    must_hold: bool | Callable[[Any], bool] = False
    idle: Callable[[Any], dict[str, Any] | None] | None = None

    @staticmethod
    def below(per: Any, **more: Any) -> Rule:
        """Skipping the inputs its first ``k`` outputs took (``per``) skips those outputs."""
        return Rule("below", per, **more)

    @staticmethod
    def seek(**more: Any) -> Rule:
        """The stage skips its first outputs itself, told by ``context.start``."""
        return Rule("seek", **more)

    @staticmethod
    def replay(**more: Any) -> Rule:
        """The consumed items are replayed through the stage and dropped after it."""
        return Rule("replay", **more)

    @staticmethod
    def recorded(record: type[Record], **more: Any) -> Rule:
        """The stage records in each pass what resuming it needs, in a *record* (see
        :class:`Drops`, :class:`Kept`); a state holds that record's :meth:`Record.after`."""
        return Rule("recorded", record=record, **more)

    def __repr__(self) -> str:
        shown = [repr(self.kind)]
        for f in fields(self)[1:]:
            value = getattr(self, f.name)
            if value != f.default:
                text = getattr(value, "__qualname__", None) or repr(value)
                shown.append(f"{f.name}={text}")
        return f"Rule({', '.join(shown)})"

    def inputs(self, k: int, config: Any) -> int | None:
        """For a ``"below"`` rule, the inputs the stage's first *k* outputs took (*config*
        its configuration); ``None`` for the others (only a record or a replay can tell)."""
        if self.kind != "below":
            return None
        return k if self.per == "same" else int(self.per(k, **config))


def skipped(stage: Any, k: int) -> int | None:
    """The inputs *stage*'s first *k* outputs took, when its rule tells without a record."""
    rule: Rule = stage.resume
    return rule.inputs(k, stage.config) if rule.kind == "below" else None


class Record:
    """What a recording stage (or source) keeps in one pass for ``state_dict()``: the base of
    every record, with what the loader may ask of any of them.

    A record class declares once what a state may hold of it, its :attr:`FORM`, and
    :meth:`check` (the one validator, :func:`conform`) refuses anything else at load;
    :meth:`begin` makes the record of a pass.

    :meth:`after` is the record's state once the consumer took *consumed* of the pass's
    outputs; the others answer for the records that need them: :meth:`ended_record` (what
    carries into the next epoch), :meth:`watch` (how many outputs the consumer took, for a
    record that folds what it had), :meth:`read_ahead` (a later stage reads ahead of the
    consumer: keep a snapshot after every item)."""

    __slots__ = ()

    #: What :meth:`after` makes, declared (see :class:`Form`).
    FORM: ClassVar[Form | None] = None

    @classmethod
    def begin(cls, stage: Any, context: Any, saved: dict[str, Any] | None) -> Record:
        """The record of *stage*'s pass with *context*, resuming from *saved* (its record in
        the state the pass resumes, already checked; ``None`` at an epoch's start)."""
        raise NotImplementedError

    @classmethod
    def check(
        cls, stage: Any, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """Refuse a loaded *record* that :meth:`after` could not have made (a ``ValueError``
        naming *where* and the key), told how many of the stage's outputs the position says
        were consumed and its inputs per epoch (``None`` where unknown); return it as the
        next pass gets it. By default: :func:`conform` to :attr:`FORM`."""
        assert cls.FORM is not None, cls
        bounds = {"consumed": consumed, "total": total, "stage": stage}
        return conform(cls.FORM, record, where, bounds)

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

    #: Every item numbered below *prefix* of the epoch's *total*, and the *extras* above it,
    #: delivered: no more than the *consumed* outputs.
    FORM = Form(
        {"prefix": Int(0, "total"), "extras": Rising("prefix", "total")},
        (
            (
                lambda v: v["consumed"] is None or v["prefix"] + len(v["extras"]) <= v["consumed"],
                lambda v: (
                    f"{v['where']} says {v['prefix'] + len(v['extras'])} items were delivered, "
                    f"but the state's position says only {v['consumed']} outputs were consumed"
                ),
            ),
        ),
    )

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

    #: The inputs its consumed outputs took, and the failures dropped in the epoch so far:
    #: between the outputs consumed and those plus the drops.
    FORM = Form(
        {
            "inputs": Int(0, "total"),
            "start": Int(0, "consumed", True),
            "dropped": Int(0, "inputs", True),
        },
        (
            (
                lambda v: (
                    v["consumed"] is None
                    or v["consumed"] <= v["inputs"] <= v["consumed"] + v.get("dropped", 0)
                ),
                lambda v: (
                    f"{v['where']} says its outputs took {v['inputs']} inputs, but the state's "
                    f"position says {v['consumed']} outputs were consumed, with "
                    f"{v.get('dropped', 0)} items dropped"
                ),
            ),
        ),
    )

    @classmethod
    def begin(cls, stage: Any, context: Any, saved: dict[str, Any] | None) -> Drops:
        return cls(context.offset, saved.get("dropped", 0) if saved else 0)


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

    #: The inputs its consumed outputs took (a ``start`` is read and left out).
    FORM = Form({"inputs": Int(0, "total"), "start": Int(0, None, True)}, keep=("inputs",))

    @classmethod
    def begin(cls, stage: Any, context: Any, saved: dict[str, Any] | None) -> Kept:
        return cls(context.offset)


def check_inputs(
    record: Any,
    where: str,
    consumed: int | None,
    total: int | None,
    optional: set[str] | frozenset[str] = frozenset(),
) -> dict[str, Any]:
    """Refuse an ``{"inputs": n, ...}`` record (see :class:`Rule`) that is malformed or
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


def plan(stages: Sequence[Any], resume: dict[str, Any]) -> Plan:
    """The skip plan for a pass that resumes at ``resume["position"]`` (and its stages'
    records), from the stages' rules."""
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
        rule: Rule = stages[i].resume
        if rule.kind == "below":
            k = source_skip = rule.inputs(k, stages[i].config) or 0
            continue
        source_skip = 0
        if rule.kind == "seek":
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
        kind = "an integer" if high is None else f"an integer between {low} and {high}"
        msg = f"{where} must be {kind} (got {value!r})"
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
    rule: Rule = stage.resume
    return [repr(stage)] if rule.identity is None else rule.identity(stage)


def _source_identity(source: Any) -> list[str]:
    rule: Rule = source.resume
    return [source.describe()] if rule.identity is None else rule.identity(source)


def idle(source: Any) -> dict[str, Any] | None:
    """*source*'s record between passes, when its rule keeps one (``None``)."""
    rule: Rule = source.resume
    return None if rule.idle is None else rule.idle(source)


def must_hold(source: Any) -> bool:
    """Whether a state that consumed some of *source*'s items must hold its record."""
    rule: Rule = source.resume
    return rule.must_hold if isinstance(rule.must_hold, bool) else rule.must_hold(source)


def fingerprint(source: Any, stages: Sequence[Any]) -> list[str]:
    """The pipeline's identity: its source and every stage, without runtime knobs, with every
    seed shown as ``<seed>`` (seeds are compared apart: see :func:`seeds`).

    A ``parallel_map`` in order counts as the stages it runs, so states move freely between
    runs with and without workers.
    """
    source, *masked = replaced([source, *stages], itertools.repeat(MASK))
    return [*_source_identity(source), *(x for s in masked for x in _identity(s))]


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
        kept = resume.get("source", idle(source))
    elif progress.done:
        epoch, position = progress.epoch + 1, 0
        kept = progress.source.ended_record() if progress.source is not None else None
        kept = idle(source) if kept is None else kept
        records = _carried(progress)
    else:
        epoch, position = progress.epoch, progress.start + progress.delivered
        records = _recorded(stages, progress)
        kept = None
        if progress.source is not None:
            needed = plan(stages, {"position": position, "stages": records})
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
    its epoch and position (see :mod:`pipeflow.resume._seal`): ``{"seeds": ..., "stages": {key:
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
        kept = idle(source)
        return {"position": 0, "stages": {}, **({"source": kept} if kept else {})}
    position = progress.start + progress.delivered
    records = _recorded(stages, progress)
    out: dict[str, Any] = {"position": position, "stages": records}
    if progress.source is not None:
        needed = plan(stages, {"position": position, "stages": records})
        out["source"] = progress.source.after(needed.source_skip)
    out["stages"] = {str(flat_index(stages, k)): v for k, v in records.items()}
    return out


def through(stages: Sequence[Any], k: int) -> int | None:
    """The inputs of the first of *stages* that the first *k* outputs of the last took, or
    ``None`` past a stage that is not a map or a batch (it can't be told without a record)."""
    for s in reversed(stages):
        inputs = skipped(s, k)
        if inputs is None:
            return None
        k = inputs
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
        consumed = skipped(stages[i], consumed) or 0
    return records


def reread_after_unordered(stages: Sequence[Any]) -> str | None:
    """Why no state of *stages* could be taken mid-epoch, or ``None``: a stage that
    delivers out of order (an unordered ``parallel_map``) with a stage after it that a
    resumed pass replays or that seeks (it re-reads its input from the epoch's start, and
    the out-of-order stage would deliver it in another order)."""
    for i, s in enumerate(stages):
        if not s.resume.unordered:
            continue
        for later in stages[i + 1 :]:
            kind = later.resume.kind
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
