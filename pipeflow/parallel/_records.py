"""What the parallel stages record in a pass for ``state_dict()``, and how a state's record
is checked before a resumed pass gets it.

- :class:`MapRecord` (``parallel_map``): out of order, which items were delivered (a
  :class:`~pipeflow.state.Delivery`); in order, how many; with workers, each worker's state
  as of the outputs the consumer took (its copy of a stateful dataset, its global
  generators), restored in the new workers of a resumed pass.
- :class:`SourceRecord` (``parallel_source``): each worker's count of outputs, whether it
  ran out, its state (its replica's pass, its generators), and whose turn is next: a resumed
  pass's workers each resume their own replica where it stood.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeflow.engine._context import Context
from pipeflow.parallel._settings import MAX_WORKERS, Settings
from pipeflow.resume._check import DELIVERED, TOOK, other_workers
from pipeflow.resume._states import MapStates, WorkerStates
from pipeflow.resume.state import (
    ByWorker,
    Delivery,
    Form,
    Int,
    Nested,
    Record,
    Value,
    conform,
    flag,
    record_keys,
)

__all__ = [
    "MapRecord",
    "SourceRecord",
    "check_map_record",
    "check_rngs",
]


def _restores(saved: dict[int, dict[str, Any]] | None, workers: int) -> list[Any] | None:
    """What each new worker of a resumed pass restores: its state and its count."""
    if not saved:
        return None
    return [
        {**(saved.get(w, {}).get("state") or {}), "count": saved.get(w, {}).get("count", 0)}
        for w in range(workers)
    ]


def _replica(worker: dict[str, Any]) -> Any:
    """The record of a ``parallel_source`` worker's replica in its saved state, if any."""
    return (worker.get("state") or {}).get("replica")


def _parsed(saved: Any, workers: int) -> dict[int, dict[str, Any]] | None:
    """A checked ``"workers"`` record, keyed by worker id (``None`` when there is none)."""
    if not saved:
        return None
    return {int(w): v for w, v in saved.items() if int(w) < workers}


#: The keys of the record of a stateful dataset's ``fetch`` run without workers.
_INLINE = frozenset(("at", "object", "iterator", "early"))


class MapRecord(Record):
    """A ``parallel_map``'s record of one pass (see the module's text)."""

    __slots__ = (
        "auto_count",
        "delivery",
        "offset",
        "order",
        "owned",
        "persistent",
        "restores",
        "shared",
        "states",
        "tuner",
    )

    @classmethod
    def begin(cls, stage: Any, context: Context, saved: dict[str, Any] | None) -> MapRecord:
        """What the pass of a ``parallel_map`` *stage* delivered (out of order: which items)
        and, with workers, the workers' states as of each output (see
        :mod:`pipeflow.resume._states`)."""
        config: Settings = stage.config["settings"]
        own = config.workers == 0 or config.backend in ("process", "ray")  # not threads'
        stateful = _stateful(stage)
        shared = None
        if stateful and (config.workers == 0 or config.backend not in ("process", "ray")):
            where = "in line, in this process" if config.workers == 0 else "in threads"
            shared = (
                f"parallel_map runs its stages {where}, over a dataset with state_dict(): "
                "its state as of the items the consumer received is not tracked there, so "
                "no exact state can be taken. Use backend='process' (each worker saves and "
                "restores its own copy), or pf.fetch(dataset) without parallel_map"
            )
        return cls(config, context, saved, own and stateful, shared)

    @classmethod
    def check(
        cls, stage: Any, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """See :func:`check_map_record`."""
        settings = stage.config["settings"]
        return check_map_record(settings, record, where, consumed, total, _stateful(stage))

    def __init__(
        self,
        settings: Settings,
        context: Context,
        saved: dict[str, Any] | None,
        owned: bool = False,
        shared: str | None = None,
    ):
        """*owned*: the stages read a stateful dataset, and each worker (a process, a Ray
        actor) owns a copy, or there are no workers: a state then always names how many
        workers it was taken with (``{}``: none), even before any reported its copy's
        state, for a resumed pass with another number refuses it. *shared*: the stages
        read a stateful dataset that this process's threads share (or run in line, here),
        whose state is not the workers' to report: why no state can be taken."""
        self.offset = context.offset
        self.owned = owned
        self.shared = shared
        self.persistent = settings.persistent
        self.delivery: Delivery | None = None
        if not settings.ordered:
            extras = frozenset(saved["extras"]) if saved and "extras" in saved else frozenset()
            self.delivery = Delivery(context.offset, extras)
        self.order = self.delivery.order if self.delivery is not None else None
        # workers="auto": the count the state was taken with (where the tuner starts), and
        # the tuner of this pass (its count goes in the states taken)
        self.auto_count: int | None = (saved or {}).get("auto") if settings.auto else None
        self.tuner: Any = None
        self.states: MapStates | None = None
        self.restores: list[Any] | None = None
        if settings.workers > 0:
            base = _parsed((saved or {}).get("workers"), settings.workers)
            self.states = MapStates(settings.workers, base)
            self.restores = _restores(base, settings.workers)

    def ended_record(self) -> dict[str, Any] | None:
        """The record between this pass and the next: persistent workers' states as the pass
        left them (their generators and copies of the dataset go on into the next epoch);
        ``None`` otherwise."""
        if self.states is None or not self.persistent:
            return None
        workers = self.states.as_json(lambda seq: True)  # every item of the pass went out
        if not any(w["state"] for w in workers.values()):
            return None
        return {"inputs": 0, "workers": workers}

    def rotation(self) -> tuple[int, list[int]]:
        """Where its items' numbering starts, and no worker that ran out (a map's workers
        take items as they come)."""
        return self.offset, []

    def watch(self, consumed: Any) -> None:
        """*consumed()* tells how many of this pass's outputs the consumer has taken (or
        ``None``): the workers' states fold what it had, so the record stays small."""
        if self.states is not None:
            self.states.consumed = lambda: None if (k := consumed()) is None else self.taken(k)

    def taken(self, consumed: int) -> Any:
        """Whether item *seq* was among the first *consumed* outputs of this pass."""
        if self.delivery is None:
            end = self.offset + consumed
            return lambda seq: seq < end
        after = self.delivery.after(consumed)
        prefix, extras = after["prefix"], set(after["extras"])
        return lambda seq: seq < prefix or seq in extras

    def after(self, consumed: int) -> dict[str, Any]:
        """The stage's state once the consumer took *consumed* of this pass's outputs."""
        if self.shared is not None:
            raise ValueError(f"state_dict: {self.shared}")
        if self.delivery is not None:
            out = self.delivery.after(consumed)
        else:
            out = {"inputs": self.offset + consumed}
        if self.states is None and self.owned:
            out["workers"] = {}  # taken without workers
        if self.states is not None:
            workers = self.states.as_json(self.taken(consumed))
            if self.owned or any(w["state"] for w in workers.values()):
                out["workers"] = workers
        if self.tuner is not None:
            out["auto"] = self.tuner.count
        return out


def _stateful(stage: Any) -> bool:
    """Whether a ``parallel_map``'s stages read a stateful dataset (each process worker its
    own copy)."""
    from pipeflow.engine._stage import Stage
    from pipeflow.resume._objects import is_stateful

    fn = stage.config["fn"]
    stages = fn.stages if isinstance(fn, Stage) else ()
    return any(is_stateful(s.traits.dataset) for s in stages)


def check_map_record(
    settings: Settings,
    record: Any,
    where: str,
    consumed: int | None,
    total: int | None,
    stateful: bool = False,
) -> dict[str, Any]:
    """Refuse a record a :class:`MapRecord` could not have made (out of order:
    :data:`~pipeflow.resume._check.DELIVERED`; in order: :data:`~pipeflow.resume._check.TOOK`),
    or whose workers' states can't be given to this stage's workers; return it as the next
    pass gets it. *stateful*: the stage reads a stateful dataset (a record from another
    number of workers that owned copies of it is refused, even before they reported their
    copies' states). A stateful dataset's record from the same stages run without
    ``parallel_map`` (``fetch``'s) is refused: its state is not restored here."""
    here = settings.workers
    if isinstance(record, dict) and _INLINE.intersection(record):
        why = (
            other_workers(0, here, where)
            if here
            else f"{where} holds the state of the dataset as fetch without workers left it, and "
            "a parallel_map with workers=0 does not restore a dataset's state: resume with the "
            "stages run without parallel_map"
        )
        raise ValueError(f"load_state_dict: {why}")
    bounds = {"consumed": consumed, "total": total, "here": here, "stateful": stateful}
    delivered = isinstance(record, dict) and "prefix" in record
    out = conform(DELIVERED if delivered else TOOK, record, where, bounds)
    if "workers" in out and len(out["workers"]) != here:
        del out["workers"]  # the generators' states of another number of workers: left behind
    return out


def _counts(k: Mapping[str, Any]) -> list[int]:
    return [k["workers"][w]["count"] for w in sorted(k["workers"], key=int)]


def _all_counted(k: Mapping[str, Any]) -> bool:
    """The workers' counts add up to the source's items the position consumed; or to fewer,
    once every worker ran out (a batch after the source counts its last, short batch as a
    full one, so the position may stand past the last item)."""
    made, consumed = sum(_counts(k)), k["consumed"]
    ended = all(w["ended"] for w in k["workers"].values())
    return made == consumed or (made < consumed and ended)


def _in_turns(k: Mapping[str, Any]) -> bool:
    """Workers taking turns in order deal their items in rounds: the first ``turn`` of them
    have one more (unless one ran out)."""
    counts, turn = _counts(k), k["turn"]
    if not k["ordered"] or not counts or any(w["ended"] for w in k["workers"].values()):
        return True
    low = min(counts)
    return counts == [low + 1] * turn + [low] * (len(counts) - turn)


#: The ``replica`` of a ``parallel_source`` worker's state: where the loader it runs stood
#: (:meth:`~pipeflow.Loader.pass_record`; its stages' and source's records are that loader's
#: to check: :func:`_check_replicas`).
_REPLICA = Form(
    {"position": Int(0, "count"), "stages": Value(optional=True), "source": Value(optional=True)}
)


def _replica_at(k: Mapping[str, Any]) -> int | None:
    replica = (k["state"] or {}).get("replica")
    return None if replica is None else int(replica["position"])


#: One ``parallel_source`` worker's entry: its count of items delivered, whether its stream
#: ran out, and its state (``None``: its replica reads its count of items again): its
#: replica's record and its global generators (:func:`check_rngs`). A replica stands at the
#: worker's count; one that ran out at 0, the start of its next pass, with no stage records.
_SOURCE_WORKER = Form(
    {
        "count": Int(0),
        "ended": Value(flag),
        "state": Nested(
            Form(
                {
                    "replica": Nested(_REPLICA, nullable=True, optional=True),
                    "rng": Value(lambda v, where: check_rngs(v, where), optional=True),
                }
            ),
            nullable=True,
        ),
    },
    invariants=(
        (
            lambda k: (
                not k["ended"]
                or _replica_at(k) is None
                or (_replica_at(k) == 0 and not k["state"]["replica"].get("stages"))
            ),
            lambda k: (
                f"{k['where']}['state']['replica'] says worker {k['worker']}'s stream "
                f"stands at its item {_replica_at(k)}, but {k['where']}['ended'] says it ran out: "
                "a worker that ran out starts its next pass afresh (position 0, no stage records)"
            ),
        ),
        (
            lambda k: k["ended"] or _replica_at(k) in (None, k["count"]),
            lambda k: (
                f"{k['where']}['state']['replica']['position'] is {_replica_at(k)}, but "
                f"{k['where']}['count'] says worker {k['worker']} delivered {k['count']} "
                f"items: its replica would resume at its item {_replica_at(k)} and deliver "
                f"{k['count'] - (_replica_at(k) or 0)} of them again"
            ),
        ),
    ),
)


class SourceRecord(Record):
    """A ``parallel_source``'s record of one pass (see the module's text)."""

    #: A source delivers in the round-robin's order: no numbers to note.
    order: list[int] | None = None

    #: Each worker's entry (as many as this source has: each reads its own replica of the
    #: stream, split by ``get_worker_info()``, so the rest of the epoch depends on their
    #: number), and whose turn is next; their counts add up to the source's items consumed.
    FORM = Form(
        {"workers": ByWorker(_SOURCE_WORKER), "turn": Int(0)},
        invariants=(
            (
                lambda k: len(k["workers"]) == k["here"],
                lambda k: (
                    f"the state is from a parallel_source with {len(k['workers'])} "
                    f"workers, and this one has {k['here']}: each worker reads its own replica "
                    "of the stream (split by get_worker_info()), so the rest of the epoch depends "
                    f"on the worker count; resume with {len(k['workers'])} workers"
                ),
            ),
            (
                lambda k: k["turn"] <= max(k["here"] - 1, 0),
                lambda k: (
                    f"{k['where']}['turn'] must be between 0 and {max(k['here'] - 1, 0)} "
                    f"(got {k['turn']})"
                ),
            ),
            (
                _in_turns,
                lambda k: (
                    f"{k['where']}: counts {_counts(k)} and turn {k['turn']} can't come "
                    "from workers taking turns"
                ),
            ),
            (
                _all_counted,
                lambda k: (
                    f"{k['where']} counts {sum(_counts(k))} items delivered by its "
                    f"workers, but the state's position stands for {k['consumed']}"
                ),
            ),
        ),
    )

    __slots__ = ("ended", "persistent", "restores", "start", "states", "turn", "workers")

    @classmethod
    def check(
        cls, source: Any, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """Refuse a record this class could not have made (its :attr:`FORM`), or one from
        another number of workers (each reads its own replica of the stream, split by
        worker); each worker's replica record is checked against the loader it runs
        (:func:`_check_replicas`)."""
        settings: Settings = source.config
        workers = settings.workers
        if settings.auto and isinstance(record, dict) and isinstance(record.get("workers"), dict):
            most = MAX_WORKERS if settings.backend == "ray" else workers  # Ray: the cluster's
            workers = max(1, min(len(record["workers"]), most))  # the pass resumes with it
        here = {"consumed": consumed or 0, "here": workers, "ordered": settings.ordered}
        checked = conform(cls.FORM, record, where, here)
        _check_replicas(source.loader, checked, where)
        return dict(record)

    def __init__(self, settings: Settings, start: int, saved: dict[str, Any] | None) -> None:
        self.workers = settings.workers
        self.persistent = settings.persistent
        self.start = start  # the source's items in the epoch before this pass
        base = _parsed((saved or {}).get("workers"), self.workers)
        if base:
            # That a worker ran out is known for sure from its replica's record (its pass
            # done, at position 0). One that has none is asked again: its replica reads its
            # count of items again and finds its end (or, had it not ended, the rest).
            base = {
                w: {**v, "ended": False} if v["ended"] and not _replica(v) else v
                for w, v in base.items()
            }
        self.states = WorkerStates(self.workers, base)
        self.restores = _restores(base, self.workers)
        self.turn = (saved or {}).get("turn", 0)
        self.ended = [w for w, v in (base or {}).items() if v["ended"]]
        for w in self.ended:  # given no task this pass: what it restores is for its next one
            assert self.restores is not None
            self.restores[w]["count"] = 0  # as ended_record leaves it

    def watch(self, consumed: Any) -> None:
        """As :meth:`MapRecord.watch`."""
        self.states.consumed = consumed

    def rotation(self) -> tuple[int, list[int]]:
        """The worker whose turn is first in this pass, and the workers that ran out."""
        return self.turn, self.ended

    def after(self, needed: int) -> dict[str, Any]:
        """The record once the consumer took *needed* of the epoch's items."""
        consumed = needed - self.start
        last = self.states.last_worker(consumed)
        turn = self.turn if last is None else (last + 1) % self.workers
        return {"workers": self.states.as_json(consumed), "turn": turn}

    def ended_record(self) -> dict[str, Any] | None:
        """The record between this pass and the next: persistent workers' states (their
        replicas' objects, their generators) as the pass left them; ``None`` otherwise
        (the next pass's workers start afresh from the main process's objects)."""
        if not self.persistent:
            return None
        states = self.states
        workers = states.as_json(states.folds + len(states.owner))  # everything delivered
        for w in workers.values():
            w["count"], w["ended"] = 0, False
        if not any(w["state"] for w in workers.values()):
            return None
        return {"workers": workers, "turn": 0}


def _check_replicas(loader: Any, record: dict[str, Any], where: str) -> None:
    """Each worker's replica record, checked as a state's records are checked against the
    loader each worker runs (its form, each stage's record, the source's), and looked at
    by the stages that can tell whether their data changed since
    (:func:`pipeflow.resume._check.check_pass_record`). A worker with no record reads its
    count of items again: refused where the loader can't skip them without one."""
    from pipeflow.resume._check import check_pass_record

    for w, worker in record["workers"].items():
        place = f"{where}['workers'][{w!r}]"
        replica = (worker["state"] or {}).get("replica")
        if replica is not None:
            check_pass_record(loader.source, loader.stages, replica, f"{place}['state']['replica']")
            continue
        if not worker["count"]:
            continue
        try:
            check_pass_record(loader.source, loader.stages, {"position": worker["count"]}, place)
        except ValueError as e:
            why = str(e).removeprefix("load_state_dict: ")
            msg = (
                f"load_state_dict: {place}['state'] holds no record of where worker {w}'s "
                f"replica stood, and its loader can't skip the {worker['count']} items it "
                f"delivered without one ({why})"
            )
            raise ValueError(msg) from None


def check_rngs(saved: Any, where: str) -> None:
    """Refuse a worker's saved global generators (:func:`pipeflow.resume._rngs.capture`) that it
    could not restore: each is set on a generator of its own here, as the worker would."""
    if not isinstance(saved, dict):
        msg = f"load_state_dict: {where} must be a dict (got {type(saved).__name__})"
        raise ValueError(msg)
    record_keys(saved, where, set(), {"torch", "random", "numpy"})
    for kind, value in saved.items():
        try:
            _RESTORE[kind](value)
        except Exception as e:
            msg = (
                f"load_state_dict: {where}[{kind!r}] is not a state of {_NAMES[kind]} "
                f"({type(e).__name__}: {e})"
            )
            raise ValueError(msg) from None


def _torch_rng(value: Any) -> None:
    import base64
    import binascii

    if not isinstance(value, (str, bytes)):
        msg = f"expected base64 text, got {type(value).__name__}"
        raise TypeError(msg)
    try:
        raw = value if isinstance(value, bytes) else base64.b64decode(value, validate=True)
    except binascii.Error as e:
        raise ValueError(str(e)) from None
    import torch  # a worker that restores it imports torch: its size is torch's

    torch.Generator().set_state(torch.frombuffer(bytearray(raw), dtype=torch.uint8))


def _random_rng(value: Any) -> None:
    import random

    version, words, gauss = value
    random.Random().setstate((version, tuple(words), gauss))


def _numpy_rng(value: Any) -> None:
    import numpy as np

    name, keys, pos, has_gauss, cached = value
    np.random.RandomState().set_state(
        (name, np.array(keys, dtype=np.uint32), pos, has_gauss, cached)
    )


_RESTORE = {"torch": _torch_rng, "random": _random_rng, "numpy": _numpy_rng}
_NAMES = {
    "torch": "torch's global generator",
    "random": "Python's random module",
    "numpy": "numpy's global generator",
}
