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

from typing import Any

from pipeflow._context import Context
from pipeflow._state_check import check_workers, same_workers
from pipeflow.parallel._settings import Settings
from pipeflow.parallel._states import MapStates, WorkerStates
from pipeflow.state import Delivery, check_inputs, integer, record_keys

__all__ = [
    "MapRecord",
    "SourceRecord",
    "check_map_record",
    "check_source_record",
]


def _restores(saved: dict[int, dict[str, Any]] | None, workers: int) -> list[Any] | None:
    """What each new worker of a resumed pass restores: its state and its count."""
    if not saved:
        return None
    return [
        {**(saved.get(w, {}).get("state") or {}), "count": saved.get(w, {}).get("count", 0)}
        for w in range(workers)
    ]


def _parsed(saved: Any, workers: int) -> dict[int, dict[str, Any]] | None:
    """A checked ``"workers"`` record, keyed by worker id (``None`` when there is none)."""
    if not saved:
        return None
    return {int(w): v for w, v in saved.items() if int(w) < workers}


class MapRecord:
    """A ``parallel_map``'s record of one pass (see the module's text)."""

    __slots__ = ("delivery", "offset", "order", "persistent", "restores", "states")

    def __init__(self, settings: Settings, context: Context, saved: dict[str, Any] | None):
        self.offset = context.offset
        self.persistent = settings.persistent
        self.delivery: Delivery | None = None
        if not settings.ordered:
            extras = frozenset(saved["extras"]) if saved and "extras" in saved else frozenset()
            self.delivery = Delivery(context.offset, extras)
        self.order = self.delivery.order if self.delivery is not None else None
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
        if self.delivery is not None:
            out = self.delivery.after(consumed)
        else:
            out = {"inputs": self.offset + consumed}
        if self.states is not None:
            workers = self.states.as_json(self.taken(consumed))
            if any(w["state"] for w in workers.values()):
                out["workers"] = workers
        return out


def check_map_record(
    settings: Settings, record: Any, where: str, consumed: int | None, total: int | None
) -> dict[str, Any]:
    """Refuse a record a :class:`MapRecord` could not have made, or whose workers' states
    can't be given to this stage's workers; return it as the next pass gets it."""
    if isinstance(record, dict) and "prefix" in record:
        record_keys(record, where, {"prefix", "extras"}, {"workers"})
        out = Delivery.check(
            {"prefix": record["prefix"], "extras": record["extras"]}, where, consumed, total
        )
    else:
        fields = {"workers", "at", "object", "iterator"}
        out = check_inputs(record, where, None, total, fields)
        if consumed is not None and out["inputs"] > consumed:
            msg = (
                f"load_state_dict: {where} says {out['inputs']} items were delivered, but "
                f"the state's position says {consumed} outputs were consumed"
            )
            raise ValueError(msg)
        if out.get("object") is not None:  # a dataset's state, from a run without workers
            msg = (
                f"load_state_dict: {where} holds the state of the dataset as a run without "
                f"workers left it, and this parallel_map has {settings.workers}: one state "
                "can't be given to several copies of the dataset; resume with num_workers=0"
            )
            raise ValueError(msg)
        out = {"inputs": out["inputs"]}
    if "workers" in record:
        workers = check_workers(record["workers"], f"{where}['workers']", None)
        same_workers(workers, settings.workers, where)
        if len(workers) == settings.workers:
            out["workers"] = record["workers"]
    return out


class SourceRecord:
    """A ``parallel_source``'s record of one pass (see the module's text)."""

    __slots__ = ("ended", "persistent", "restores", "start", "states", "turn", "workers")

    def __init__(self, settings: Settings, start: int, saved: dict[str, Any] | None) -> None:
        self.workers = settings.workers
        self.persistent = settings.persistent
        self.start = start  # the source's items in the epoch before this pass
        base = _parsed((saved or {}).get("workers"), self.workers)
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


def check_source_record(settings: Settings, record: Any, position: int) -> dict[str, Any]:
    """Refuse a record a :class:`SourceRecord` could not have made, or one from another
    number of workers (each reads its own replica of the stream, split by worker)."""
    where = "state['source']"
    record_keys(record, where, {"workers", "turn"}, set())
    workers = check_workers(record["workers"], f"{where}['workers']", None)
    if len(workers) != settings.workers:
        msg = (
            f"load_state_dict: the state is from a parallel_source with {len(workers)} "
            f"workers, and this one has {settings.workers}: each worker reads its own replica "
            "of the stream (split by get_worker_info()), so the rest of the epoch depends on "
            f"the worker count; resume with {len(workers)} workers"
        )
        raise ValueError(msg)
    turn = integer(record["turn"], f"{where}['turn']", 0, max(settings.workers - 1, 0))
    counts = [workers[w]["count"] for w in sorted(workers)]
    if settings.ordered and not any(w["ended"] for w in workers.values()) and counts:
        low = min(counts)  # dealt in rounds: the first `turn` workers have one more
        if counts != [low + 1] * turn + [low] * (len(counts) - turn):
            msg = (
                f"load_state_dict: {where}: counts {counts} and turn {turn} can't come from "
                "workers taking turns"
            )
            raise ValueError(msg)
    if sum(w["count"] for w in workers.values()) != position:
        msg = (
            f"load_state_dict: {where} counts {sum(w['count'] for w in workers.values())} "
            f"items delivered by its workers, but the state's position stands for {position}"
        )
        raise ValueError(msg)
    return dict(record)
