"""Loading a state: everything is checked before anything changes.

:func:`check` refuses a state that is malformed (a missing key, a wrong type, a value out of
range, another version), that comes from another pipeline (another stage, size, dataset
length), or whose seeds differ from seeds the user gave, each with a ``ValueError`` that
names the key or the setting. It returns what the loader then applies all at once: the
epoch, where the next pass starts, each record by stage position, and the seeds to adopt
(the ones this loader drew itself take the state's: see :mod:`pipeflow.resume._seeds`).

Records are checked by the stage that keeps them (:meth:`pipeflow.Stage.check_record`), with
what the position says that stage's consumer took, so a record that would skip what was not
delivered, or deliver again what was, is refused instead of giving wrong data; a stage whose
record belongs to one pass (a buffer shuffle's: an epoch and a seed) also refuses, through
``check_pass``, a record from a pass of another epoch or seed than the state's.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

from pipeflow.resume._seal import digest
from pipeflow.resume._seeds import is_workers, replaced
from pipeflow.resume.state import (
    READS,
    VERSION,
    ByWorker,
    Delivery,
    Each,
    Form,
    Int,
    Rule,
    Value,
    conform,
    fingerprint,
    flag,
    flat_index,
    integer,
    must_hold,
    plan,
    record_keys,
    seeds,
    skipped,
    taken,
)

__all__ = [
    "DELIVERED",
    "TOOK",
    "Loaded",
    "check",
    "check_loader",
    "check_pass_record",
    "check_record",
    "map_record_inline",
    "other_workers",
    "verify_data",
]


class Loaded(NamedTuple):
    """A checked state, ready to apply.

    Attributes:
        epoch: the epoch of the next pass.
        resume: ``{"position": ..., "stages": {stage position: record}}`` for the next pass
            (``"source"``: the source's record, when it keeps one).
        seeds: the seeds to give the pipeline, in :func:`pipeflow.resume._seeds.slots` order.
    """

    epoch: int
    resume: dict[str, Any]
    seeds: list[int]


def _fail(msg: str) -> ValueError:
    return ValueError(f"load_state_dict: {msg}")


def check(source: Any, stages: Sequence[Any], length: int | None, state: Any) -> Loaded:
    """Check *state* against the pipeline *source* | *stages*; see the module's text."""
    _check_form(state)
    _check_pipeline(fingerprint(source, stages), state["pipeline"])
    adopted = _check_seeds(seeds(source, stages), state["seeds"])
    _check_length(state, length)
    records = _check_records(stages, _totals(source, stages), state)
    _check_passes(source, stages, records, adopted, state["epoch"])
    if state["pipeflow_state"] != 2:  # format 2 has no digests
        _check_digests(stages, state)
    verify_data(source, stages, records)
    resume: dict[str, Any] = {"position": state["position"], "stages": records}
    skip = plan(stages, resume).source_skip
    kept = _source_record(source, state, "state['source']", skip)
    if kept is not None:
        resume["source"] = kept
        running, *_ = replaced([source, *stages], iter(adopted))
        check_pass = running.resume.check_pass  # a mix's: its loaders' records, their passes
        if check_pass is not None:
            check_pass(running, kept, "state['source']", state["epoch"])
    return Loaded(state["epoch"], resume, adopted)


def length(loader: Any) -> int | None:
    """*loader*'s outputs per epoch, or ``None`` when it has no length."""
    try:
        return len(loader)
    except TypeError:
        return None


def check_loader(loader: Any, state: Any) -> Loaded:
    """*state* checked against *loader*'s pipeline (see :func:`check`); nothing changes."""
    return check(loader.source, loader.stages, length(loader), state)


def check_pass_record(
    source: Any, stages: Sequence[Any], record: Any, where: str
) -> dict[str, Any]:
    """Check a loader's pass record (:meth:`pipeflow.Loader.pass_record`: ``{"position": p,
    "stages": {...}, "source": ...}``, nested in another's record: a ``mix``'s loaders') as
    :func:`check` checks a state's: its form, each stage's record, the source's."""
    record_keys(record, where, {"position"}, {"stages", "source"})
    position = integer(record["position"], f"{where}['position']")
    stages_record = record.get("stages", {})
    if not isinstance(stages_record, dict):
        raise _fail(f"{where}['stages'] must be a dict (got {stages_record!r})")
    state = {"position": position, "stages": stages_record}
    records = _check_records(stages, _totals(source, stages), state)
    verify_data(source, stages, records, f"{where}['stages']")
    out: dict[str, Any] = {"position": position, "stages": records}
    skip = plan(stages, out).source_skip
    kept = _source_record(source, record, f"{where}['source']", skip)
    if kept is not None:
        out["source"] = kept
    out["stages"] = {str(flat_index(stages, k)): v for k, v in records.items()}
    return out


def _text(value: Any, where: str) -> None:
    if not isinstance(value, str):
        raise _fail(f"{where} must be a string (got {value!r})")


def _mapping(value: Any, where: str) -> None:
    if not isinstance(value, dict):
        raise _fail(f"{where} must be a dict (got {value!r})")


def _length(value: Any, where: str) -> None:
    if value is not None:
        integer(value, where)


def _seed_slot(slot: Any, where: str) -> None:
    ok = isinstance(slot, list) and len(slot) == 3 and isinstance(slot[0], str)
    if not ok or not isinstance(slot[2], bool):
        raise _fail(f"{where} must be [owner, seed, drawn] (got {slot!r})")
    integer(slot[1], f"{where}[1]", 0, 2**64 - 1)


#: A loader's state, as :func:`pipeflow.resume.state.take` makes it (format 2 had no
#: ``digests``): what each field may hold; the records are their stages' to check.
_STATE = Form(
    {
        "pipeflow_state": Value(),
        "epoch": Int(0),
        "position": Int(0, sys.maxsize),
        "length": Value(_length),
        "pipeline": Each(Value(_text)),
        "seeds": Each(Value(_seed_slot)),
        "stages": Value(_mapping),
        "source": Value(optional=True),
        "digests": Value(_mapping),
    }
)
_STATE_V2 = Form({k: v for k, v in _STATE.fields.items() if k != "digests"})


def _check_form(state: Any) -> None:
    """Refuse what is not a loader state of a version this pipeflow reads, or does not
    conform to its form."""
    if not isinstance(state, dict) or "pipeflow_state" not in state:
        msg = (
            "not a pipeflow loader state (expected the dict from a loader's state_dict(), "
            f"with pipeflow_state={VERSION}; got {type(state).__name__})"
        )
        raise _fail(msg)
    version = state["pipeflow_state"]
    if isinstance(version, bool) or version not in READS:
        msg = (
            f"the state is in format {version!r}, and this pipeflow reads formats "
            f"{', '.join(map(str, READS))}: take the state again with this version"
        )
        raise _fail(msg)
    conform(_STATE if version == VERSION else _STATE_V2, state, "state", {})


def _check_digests(stages: Sequence[Any], state: dict[str, Any]) -> None:
    """Refuse seeds and records that do not match the state's digests: changed after
    ``state_dict()`` gave them, or taken from another state (see :mod:`pipeflow.resume._seal`)."""
    sums = state["digests"]
    optional = {"source"} if "source" in state else set()
    record_keys(sums, "state['digests']", {"seeds", "stages", *optional}, set())
    pipeline, epoch, position = state["pipeline"], state["epoch"], state["position"]
    if sums["seeds"] != digest("seeds", pipeline, state["seeds"]):
        msg = (
            "state['seeds'] do not match the state's digest: they were changed after "
            "state_dict() gave them, and the rest of the epoch would draw other numbers"
        )
        raise _fail(msg)
    names = {str(flat_index(stages, i)): s.name for i, s in enumerate(stages)}
    kept = sums["stages"]
    if not isinstance(kept, dict) or set(kept) != set(state["stages"]):
        msg = (
            "state['stages'] does not hold the records the state was taken with (its "
            f"digests name the stages at {sorted(kept) if isinstance(kept, dict) else kept!r}, "
            f"the records {sorted(state['stages'])})"
        )
        raise _fail(msg)
    moment = (
        "it was changed after state_dict() gave it, or it comes from another state (another "
        "pipeline, epoch or position: a record holds where its stage stood at the state's "
        "epoch and position, which are bound to it)"
    )
    for key, record in state["stages"].items():
        if kept[key] != digest("stage", pipeline, key, epoch, position, record):
            msg = (
                f"state['stages'][{key!r}] (stage {names.get(key, '?')!r}) does not match the "
                f"state's digest: {moment}"
            )
            raise _fail(msg)
    if "source" in state and sums["source"] != digest(
        "source", pipeline, epoch, position, state["source"]
    ):
        raise _fail(f"state['source'] does not match the state's digest: {moment}")


def _check_pipeline(here: list[str], there: list[str]) -> None:
    """Refuse a state whose fingerprint *there* is not this pipeline's, *here*."""
    if here == there:
        return
    for i, (a, b) in enumerate(zip(here, there)):
        if a != b:
            what = "the source" if i == 0 else f"stage {i}"
            msg = (
                f"the state is from a different pipeline: {what} is {a} here but {b} in the "
                "state (what each stage is must match: its kind, sizes and functions)"
            )
            raise _fail(msg)
    msg = (
        f"the state is from a different pipeline: {len(here) - 1} stages here, "
        f"{len(there) - 1} in the state ({' | '.join(there)})"
    )
    raise _fail(msg)


def _check_seeds(here: list[list[Any]], there: list[list[Any]]) -> list[int]:
    """The seeds the pipeline takes: the state's, where this loader drew its own; refuse a
    seed the user gave that the state's differs from. The workers' seeds of parallel stages
    (which a pipeline may have or not: see :data:`pipeflow.resume._seeds.WORKERS_SLOT`) are taken
    where the state has them for the same stages, and are never refused."""
    data_here = [slot for slot in here if not is_workers(slot[0])]
    data_there = [slot for slot in there if not is_workers(slot[0])]
    if [o for o, _, _ in data_here] != [o for o, _, _ in data_there]:
        msg = (
            f"the state's seeds belong to {[o for o, _, _ in data_there]}, this pipeline's "
            f"to {[o for o, _, _ in data_here]}"
        )
        raise _fail(msg)
    for (owner, mine, drawn), (_, theirs, _) in zip(data_here, data_there):
        if not drawn and mine != theirs:
            msg = (
                f"the state is from a different pipeline: {owner}'s seed is {mine} here but "
                f"{theirs} in the state, so the rest of the epoch would draw other numbers; "
                f"build it with seed={theirs}, or with seed=None to take the state's"
            )
            raise _fail(msg)
    workers_here = [s for s in here if is_workers(s[0])]
    workers_there = [s for s in there if is_workers(s[0])]
    same = [o for o, _, _ in workers_here] == [o for o, _, _ in workers_there]
    data = iter(theirs for _, theirs, _ in data_there)
    workers = iter(s[1] for s in (workers_there if same else workers_here))
    return [next(workers) if is_workers(owner) else next(data) for owner, _, _ in here]


def _check_length(state: dict[str, Any], length: int | None) -> None:
    """Refuse a state from a pipeline of another length, or one past the epoch's end."""
    if state["length"] != length:
        msg = (
            f"the state is from a pipeline of another length: {length} outputs per epoch "
            f"here, {state['length']} in the state (another dataset size, batch size or "
            "drop_last?)"
        )
        raise _fail(msg)
    if length is not None and state["position"] > length:
        msg = (
            f"the state's position {state['position']} lies past the end of the epoch "
            f"({length} outputs per epoch)"
        )
        raise _fail(msg)


def _check_records(
    stages: Sequence[Any], totals: list[int | None], state: dict[str, Any]
) -> dict[int, Any]:
    """Each stage's record, checked by the stage (told how many of its outputs the position
    says were consumed, and its inputs per epoch), keyed by the stage's position."""
    by_flat = {flat_index(stages, i): i for i in range(len(stages))}
    records: dict[int, Any] = {}
    for key, record in state["stages"].items():
        flat = int(key) if isinstance(key, str) and key.isdigit() else None
        if flat is None or flat not in by_flat:
            msg = f"state['stages'] names a stage at {key!r}, which this pipeline does not have"
            raise _fail(msg)
        records[by_flat[flat]] = record
    out: dict[int, Any] = {}
    k: int = state["position"]  # outputs of stage i consumed, from the last stage up
    for i in range(len(stages) - 1, -1, -1):
        where = f"state['stages'][{str(flat_index(stages, i))!r}] (stage {stages[i].name!r})"
        if i in records:
            out[i] = check_record(stages[i], records[i], where, k, totals[i])
            k = taken(out[i])  # what it took of its inputs
        else:
            if stages[i].resume.kind == "recorded" and k > 0:  # the rest can't be told
                msg = (
                    f"{where} is missing: the stage keeps a record, and {k} of its outputs "
                    "were consumed"
                )
                raise _fail(msg)
            k = skipped(stages[i], k) or 0  # replayed from the start
    return out


def _state(value: Any, where: str) -> None:
    if value is not None and not isinstance(value, dict):
        raise ValueError(f"load_state_dict: {where} must be a dict or None")


def check_record(
    stage: Any, record: Any, where: str, consumed: int | None, total: int | None
) -> dict[str, Any]:
    """Refuse a *record* for *stage* that its rule's record class could not have made (a
    ``ValueError`` naming *where* and the key); return it as the next pass gets it.
    *consumed*: how many of the stage's outputs the state's position says were consumed,
    *total*: its inputs per epoch (``None`` where unknown). A map takes the record of a
    ``parallel_map`` in order that ran it with workers (how many items it took; its
    workers' generators are left behind); a stage that keeps no record refuses any other."""
    rule: Rule = stage.resume
    if rule.record is not None:
        return rule.record.check(stage, record, where, consumed, total)
    if rule.per == "same" and isinstance(record, dict) and "inputs" in record:
        return map_record_inline(record, where, consumed, total)
    msg = f"load_state_dict: {where} holds a record, but this stage keeps none"
    raise ValueError(msg)


def _source_record(source: Any, holder: dict[str, Any], where: str, skip: int) -> Any:
    """The source's record in *holder* (a state, or a loader's pass record nested in
    another's), checked; ``None`` when it holds none, refused where *skip* of the source's
    items were consumed and its rule says a state must then hold its record."""
    if "source" in holder:
        return check_source(source, holder["source"], where, skip)
    if skip and must_hold(source):
        msg = (
            f"{where} is missing: {source.name} keeps a record, and {skip} of its items were "
            "consumed"
        )
        raise _fail(msg)
    return None


def check_source(source: Any, record: Any, where: str, consumed: int) -> dict[str, Any]:
    """Refuse a *record* for *source* that its rule's record class could not have made,
    told how many of its items the state consumed; return it as the next pass gets it. A
    source that keeps no record refuses any."""
    rule: Rule = source.resume
    if rule.record is None:
        msg = f"load_state_dict: {where} holds a record, but {source.name} keeps none"
        raise ValueError(msg)
    return rule.record.check(source, record, where, consumed, None)


def verify_data(
    source: Any, stages: Sequence[Any], records: dict[int, Any], where: str = "state['stages']"
) -> None:
    """Refuse checked records whose data changed since the state was taken: each stage that
    can tell (a reader: the shard it stopped in, :mod:`pipeflow.sources.readers._versions`)
    looks."""
    for i, record in records.items():
        verify = stages[i].resume.verify
        if verify is not None and isinstance(record, dict):
            verify(stages[i], record, f"{where}[{str(flat_index(stages, i))!r}]", source)


def _check_passes(
    source: Any, stages: Sequence[Any], records: dict[int, Any], adopted: list[int], epoch: int
) -> None:
    """Refuse a checked record that belongs to another pass than the one the state resumes
    (a buffer shuffle's, from another epoch or seed): the stages that keep such records say
    so through their rule's ``check_pass``, as they will run (with *adopted*)."""
    if not any(stages[i].resume.check_pass is not None for i in records):
        return
    _, *running = replaced([source, *stages], iter(adopted))
    for i, record in records.items():
        check_pass = running[i].resume.check_pass
        if check_pass is not None:
            where = f"state['stages'][{str(flat_index(stages, i))!r}] (stage {stages[i].name!r})"
            check_pass(running[i], record, where, epoch)


def _totals(source: Any, stages: Sequence[Any]) -> list[int | None]:
    """Each stage's inputs per epoch, where known."""
    out: list[int | None] = []
    n = source.length()
    for s in stages:
        out.append(n)
        n = None if n is None else s.length(n)
    return out


# -- the workers' states in a parallel stage's record (see pipeflow.resume._states) --------
#: What a worker's state holds that is the user's (a dataset's, a replica's): it cannot be
#: given to another number of workers. The generators' states can be left behind.
_USERS = ("dataset", "replica")


#: One worker's entry in a ``"workers"`` record (:meth:`WorkerStates.as_json`): how many
#: items it delivered, whether its stream ran out, and its state (``None``: nothing to give).
_WORKER = Form({"count": Int(0), "ended": Value(flag), "state": Value(_state)})


def _same_workers(k: Mapping[str, Any]) -> bool:
    """Workers' states of the user's objects come from as many workers as this stage has
    (``here``; any record from as many, where the stage reads a stateful dataset whose
    copies the workers own: ``stateful``). ``{}``: a record from a run without workers."""
    workers = k.get("workers")
    if workers is None or len(workers) == k["here"]:
        return True
    users = any(key in (w["state"] or {}) for w in workers.values() for key in _USERS)
    return not (k["stateful"] or users)


def other_workers(taken: int, here: int, where: str) -> str:
    """What a refusal says of a state taken with *taken* workers, for a stage with *here*."""
    return (
        f"{where}: the state was taken with {taken} workers, and this loader has {here}: the "
        f"dataset's state belongs to each worker's copy; resume with num_workers={taken} "
        f"(pf.DataLoader) or workers={taken} (parallel_map)"
    )


_SAME_WORKERS = (
    _same_workers,
    lambda k: other_workers(len(k["workers"]), k["here"], k["where"]),
)

#: A map's record in order (an in-order ``parallel_map``'s): how many items it took, at most
#: the outputs the state's position consumed, and its workers' states. Checked with the
#: bounds ``consumed``, ``total``, ``here`` (this stage's workers: 0 in line) and ``stateful``.
#: ``workers="auto"``: the count its tuner used when the state was taken (any count gives
#: the same items: it only says where a resumed run's tuner starts).
_AUTO = Int(1, 4096, optional=True)
TOOK = Form(
    {"inputs": Int(0, "total"), "workers": ByWorker(_WORKER, optional=True), "auto": _AUTO},
    (
        (
            lambda k: k["consumed"] is None or k["inputs"] <= k["consumed"],
            lambda k: (
                f"{k['where']} says {k['inputs']} items were delivered, but the state's "
                f"position says {k['consumed']} outputs were consumed"
            ),
        ),
        _SAME_WORKERS,
    ),
)
#: An out-of-order map's record (a :class:`~pipeflow.state.Delivery`), and its workers'.
DELIVERED = Form(
    {**Delivery.FORM.fields, "workers": ByWorker(_WORKER, optional=True), "auto": _AUTO},
    (*Delivery.FORM.invariants, _SAME_WORKERS),
)


def map_record_inline(
    record: Any, where: str, consumed: int | None, total: int | None, stateful: bool = False
) -> dict[str, Any]:
    """A ``parallel_map``'s record in order, for the same stages run in line: how many items
    it took (:data:`TOOK`; refused when it holds the workers' copies of the user's objects,
    or when the stages read a stateful dataset, *stateful*, whose copies the workers had)."""
    bounds = {"consumed": consumed, "total": total, "here": 0, "stateful": stateful}
    return {"inputs": conform(TOOK, record, where, bounds)["inputs"]}
