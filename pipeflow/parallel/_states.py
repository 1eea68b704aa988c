"""The workers' states, as the consumer stands: what a parallel stage records for a state.

Each reply a worker sends may carry what changed in its state since its previous reply (the
worker's copy of a stateful dataset, its replica's pass, its global generators: see
:class:`~pipeflow.parallel._worker.Snapshotter`). :class:`WorkerStates` notes, output by
output in delivery order, which worker made it and what changed; a state then holds each
worker's state as of the outputs the consumer took — not as of what the workers had got to
ahead of it — and a resumed pass starts each new worker from it (``WorkerSpec.restore``).

For a source (``parallel_source``) it also counts each worker's outputs and notes which
workers ran out, and whose turn is next in the round-robin: each worker's replica then
resumes at its own count, so no worker reads again what another one read.
"""

from __future__ import annotations

from array import array
from collections.abc import Callable
from typing import Any

from pipeflow._rngs import as_json as rngs_json

__all__ = ["MapStates", "WorkerStates", "jsonable", "merge"]

#: Changes noted between two folds into the base (see :meth:`WorkerStates.fold`).
_FOLD_EVERY = 256


def merge(base: dict[str, Any] | None, change: dict[str, Any]) -> dict[str, Any]:
    """A worker's state after *change*: generators merged one by one, the rest replaced."""
    out = dict(base or {})
    for key, value in change.items():
        out[key] = {**out.get(key, {}), **value} if key == "rng" else value
    return out


class WorkerStates:
    """What a parallel stage's workers made, and their states, output by output.

    Args:
        workers: how many workers.
        saved: ``{worker id: {"count": n, "ended": bool, "state": {...}}}`` from the state a
            resumed pass starts from (``None`` at the epoch's start).
        consumed: a function that tells how many of this pass's outputs the consumer has
            taken, when that can be told (``None`` otherwise): what it took is folded into
            each worker's base state, so the record stays small however long the pass.
    """

    __slots__ = ("base", "changes", "consumed", "ends", "folds", "owner", "workers")

    def __init__(
        self,
        workers: int,
        saved: dict[int, dict[str, Any]] | None,
        consumed: Callable[[], int | None] | None = None,
    ) -> None:
        self.workers = workers
        self.base: dict[int, dict[str, Any]] = {
            w: {
                "count": (saved or {}).get(w, {}).get("count", 0),
                "ended": (saved or {}).get(w, {}).get("ended", False),
                "state": (saved or {}).get(w, {}).get("state"),
            }
            for w in range(workers)
        }
        self.owner = array("l")  # the worker of each output of the pass not folded yet
        self.changes: list[tuple[int, int, dict[str, Any]]] = []  # (outputs, worker, change)
        self.ends: list[tuple[int, int]] = []  # (outputs before, worker)
        self.folds = 0  # outputs folded into the base
        self.consumed = consumed

    #: Every reply is noted (the counts, the turns); a map's :class:`MapStates` notes only
    #: the replies that carry a change.
    every = True

    def track(self, worker: int, seq: int, outputs: int, kind: str, change: Any) -> None:
        """A reply of *worker* (item *seq*) went out: *outputs* outputs (0 for an ``"end"``),
        then its state changed by *change*."""
        owner = self.owner
        for _ in range(outputs):
            owner.append(worker)
        done = self.folds + len(owner)
        if change is not None:
            self.changes.append((done, worker, change))
        if kind == "end":
            self.ends.append((done, worker))
        if len(self.changes) % _FOLD_EVERY == 0 and self.consumed is not None:
            self.fold()

    def fold(self) -> None:
        """Fold what the consumer took into the base (if it can be told)."""
        taken = self.consumed() if self.consumed is not None else None
        if taken is None or taken <= self.folds:
            return
        self.base = self.after(taken)
        cut = taken - self.folds
        del self.owner[:cut]
        self.changes = [c for c in self.changes if c[0] > taken]
        self.ends = [e for e in self.ends if e[0] > taken]
        self.folds = taken

    def after(self, consumed: int) -> dict[int, dict[str, Any]]:
        """Each worker's count, end and state once the consumer took *consumed* of this
        pass's outputs."""
        out = {w: dict(b) for w, b in self.base.items()}
        upto = consumed - self.folds
        for w in self.owner[: max(upto, 0)]:
            out[w]["count"] += 1
        for at, w, change in self.changes:
            if at <= consumed:
                out[w]["state"] = merge(out[w]["state"], change)
        for at, w in self.ends:
            if at <= consumed:
                out[w]["ended"] = True
        return out

    def last_worker(self, consumed: int) -> int | None:
        """The worker whose output was the *consumed*-th (``None`` before any)."""
        upto = consumed - self.folds
        if upto > 0:
            return int(self.owner[upto - 1])
        return None

    def as_json(self, consumed: int) -> dict[str, Any]:
        """:meth:`after`, keyed by strings, the generators' bytes encoded (a state is JSON)."""
        return jsonable(self.after(consumed))


def jsonable(workers: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Workers' states keyed by strings, the generators' bytes encoded (a state is JSON)."""
    out = {}
    for w, v in workers.items():
        state = v["state"]
        if state and "rng" in state:
            state = {**state, "rng": rngs_json(state["rng"])}
        out[str(w)] = {**v, "state": state}
    return out


class MapStates:
    """A map's workers' states, as of the items the consumer received: only the replies that
    carry a change are noted (by item number), so a worker whose state does not change (no
    stateful dataset, torch's generator untouched) costs the pass one test per reply.

    Args:
        workers: how many workers.
        saved: each worker's ``{"count", "ended", "state"}`` in the state a resumed pass
            starts from (``None`` at the epoch's start).
    """

    __slots__ = ("base", "changes", "consumed", "done", "workers")

    every = False

    def __init__(self, workers: int, saved: dict[int, dict[str, Any]] | None) -> None:
        self.workers = workers
        self.base = {w: (saved or {}).get(w, {}).get("state") for w in range(workers)}
        self.changes: list[tuple[int, int, dict[str, Any]]] = []  # (item, worker, change)
        self.consumed: Callable[[], Callable[[int], bool] | None] | None = None
        self.done: Callable[[int], bool] | None = None

    def track(self, worker: int, seq: int, outputs: int, kind: str, change: Any) -> None:
        """Worker *worker*'s state changed by *change* with item *seq*."""
        self.changes.append((seq, worker, change))
        if len(self.changes) % _FOLD_EVERY == 0 and self.consumed is not None:
            taken = self.consumed()  # which items the consumer has had, if it can be told
            if taken is not None:
                self.base = self.after(taken)
                self.changes = [c for c in self.changes if not taken(c[0])]

    def after(self, taken: Callable[[int], bool]) -> dict[int, Any]:
        """Each worker's state once the consumer had the items *taken* says."""
        out = dict(self.base)
        for seq, w, change in self.changes:
            if taken(seq):
                out[w] = merge(out[w], change)
        return out

    def as_json(self, taken: Callable[[int], bool]) -> dict[str, Any]:
        """:meth:`after` as a ``"workers"`` record."""
        states = self.after(taken)
        return jsonable({w: {"count": 0, "ended": False, "state": s} for w, s in states.items()})
