"""The workers' states, as the consumer stands: what a parallel stage records for a state.

Each reply a worker sends may carry what changed in its state since its previous reply (the
worker's copy of a stateful dataset, its replica's pass, its global generators: see
:class:`~pipeflow.parallel.pools._worker.Snapshotter`). :class:`WorkerStates` notes, output by
output in delivery order, which worker made it and what changed; a state then holds each
worker's state as of the outputs the consumer took — not as of what the workers had got to
ahead of it — and a resumed pass starts each new worker from it (``WorkerSpec.restore``).

For a source (``parallel_source``) it also counts each worker's outputs and notes which
workers ran out, and whose turn is next in the round-robin: each worker's replica then
resumes at its own count, so no worker reads again what another one read.

A process worker sends the states of its objects (its dataset's, its replica's) as
:class:`Packed` bytes (:func:`pack`): a state changes with every reply, but only the one at
the consumer's position when ``state_dict()`` is called is ever read, so the main process
unpickles only that one (:meth:`WorkerStates.after`), not one a reply. Tensors in them are
pickled as their storage's bytes (:func:`dumps`), not through ``torch.save`` (a few
microseconds a tensor instead of hundreds).
"""

from __future__ import annotations

import copyreg
import io
import pickle
import sys
from array import array
from collections.abc import Callable
from typing import Any

from pipeflow.resume._rngs import as_json as rngs_json

__all__ = ["MapStates", "Packed", "WorkerStates", "dumps", "jsonable", "merge", "pack", "unpacked"]

#: Changes noted between two folds into the base (see :meth:`WorkerStates.fold`).
_FOLD_EVERY = 256


# -- a worker's states on their way: pickled at once, unpickled when a state reads them ------
class Packed:
    """A value a worker pickled (:func:`dumps`), unpickled the first time it is read
    (:meth:`value`): the state a reply carries is read only by the ``state_dict()`` taken at
    that reply, if any.

    Examples:
        >>> p = Packed(dumps({"i": 3}))
        >>> p.value(), p.value() is p.value()
        ({'i': 3}, True)
    """

    __slots__ = ("_value", "data")

    def __init__(self, data: bytes) -> None:
        self.data: bytes | None = data
        self._value: Any = None

    def value(self) -> Any:
        if self.data is not None:
            self._value, self.data = pickle.loads(self.data), None
        return self._value

    def __reduce__(self) -> Any:
        # a value already read goes as itself (it is read in one process only, in practice)
        data = self.data if self.data is not None else dumps(self._value)
        return Packed, (data,)


def pack(state: dict[str, Any]) -> dict[str, Any]:
    """A worker's *state* (a :class:`~pipeflow.parallel.pools._worker.Snapshotter` change) with the
    states of its objects pickled now, as :class:`Packed`: what it is at this reply, whatever
    the objects do next. The generators' (``"rng"``: merged generator by generator) stay as
    they are (bytes already)."""
    return {k: v if k == "rng" or v is None else Packed(dumps(v)) for k, v in state.items()}


def unpacked(state: dict[str, Any] | None) -> dict[str, Any] | None:
    """*state* with its :class:`Packed` values read."""
    if not state or not any(v.__class__ is Packed for v in state.values()):
        return state
    return {k: v.value() if v.__class__ is Packed else v for k, v in state.items()}


def dumps(value: Any) -> bytes:
    """``pickle.dumps(value)``, its plain CPU tensors pickled as their storage's bytes (each
    storage once, so tensors that share one still do once loaded) rather than through
    ``torch.save`` as torch pickles them, which costs ~0.3 ms a tensor; any other tensor
    (one that needs grad, a subclass, on another device, quantized, sparse, named,
    conjugated, with attributes of its own) is pickled as torch does."""
    torch = sys.modules.get("torch")
    if torch is None:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    try:
        import numpy  # noqa: F401 - a storage's bytes are read through numpy
    except ImportError:
        return pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    out = io.BytesIO()
    pickler = pickle.Pickler(out, protocol=pickle.HIGHEST_PROTOCOL)
    table = copyreg.dispatch_table.copy()
    table[torch.Tensor] = _TensorReducer(torch).reduce  # exact type: subclasses are not
    pickler.dispatch_table = table
    pickler.dump(value)
    return out.getvalue()


class _TensorReducer:
    """Reduces the plain CPU tensors of one pickle, each storage to one :class:`_Storage`."""

    __slots__ = ("named", "storages", "strided", "torch", "u8")

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.strided = torch.strided
        self.named = hasattr(torch.Tensor, "names")  # named tensors (gone from recent torch)
        self.u8 = torch.empty(0, dtype=torch.uint8)
        self.storages: dict[tuple[int, int], _Storage] = {}

    def reduce(self, t: Any) -> Any:
        if (
            t.layout is not self.strided
            or not t.is_cpu
            or t.requires_grad
            or t.is_quantized
            or t.is_nested
            or t.is_conj()
            or t.is_neg()
            or t.__dict__
            or (self.named and any(t.names))
        ):
            return t.__reduce_ex__(pickle.HIGHEST_PROTOCOL)
        storage = t.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes())
        ref = self.storages.get(key)
        if ref is None:
            data = self.u8.new_empty(0).set_(storage).numpy().tobytes()
            ref = self.storages[key] = _Storage(data)
        dtype = str(t.dtype).removeprefix("torch.")
        return _rebuild_tensor, (ref, dtype, t.storage_offset(), tuple(t.shape), t.stride())


class _Storage:
    """A tensor storage's bytes in a pickle: pickled once however many tensors use it (the
    pickle's memo), loaded as one storage."""

    __slots__ = ("data",)

    def __init__(self, data: bytes) -> None:
        self.data = data

    def __reduce__(self) -> Any:
        return _load_storage, (self.data,)


def _load_storage(data: bytes) -> Any:
    import torch

    if not data:
        return torch.empty(0, dtype=torch.uint8).untyped_storage()
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).untyped_storage()


def _rebuild_tensor(
    storage: Any, dtype: str, offset: int, shape: tuple[int, ...], stride: tuple[int, ...]
) -> Any:
    import torch

    return torch.empty(0, dtype=getattr(torch, dtype)).set_(storage, offset, shape, stride)


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
        self.base = self._after(taken)
        cut = taken - self.folds
        del self.owner[:cut]
        self.changes = [c for c in self.changes if c[0] > taken]
        self.ends = [e for e in self.ends if e[0] > taken]
        self.folds = taken

    def after(self, consumed: int) -> dict[int, dict[str, Any]]:
        """Each worker's count, end and state once the consumer took *consumed* of this
        pass's outputs."""
        out = self._after(consumed)
        for v in out.values():
            v["state"] = unpacked(v["state"])
        return out

    def _after(self, consumed: int) -> dict[int, dict[str, Any]]:
        """:meth:`after`, the states still :class:`Packed` (read only where a state is
        taken)."""
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
        """The worker whose output was the *consumed*-th (``None`` before any; the last one's
        past the last output: a batch after the source counts its last, short batch as a
        full one)."""
        upto = min(consumed - self.folds, len(self.owner))
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
        state = unpacked(v["state"])
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
                self.base = self._after(taken)
                self.changes = [c for c in self.changes if not taken(c[0])]

    def after(self, taken: Callable[[int], bool]) -> dict[int, Any]:
        """Each worker's state once the consumer had the items *taken* says."""
        return {w: unpacked(s) for w, s in self._after(taken).items()}

    def _after(self, taken: Callable[[int], bool]) -> dict[int, Any]:
        """:meth:`after`, the states still :class:`Packed`."""
        out = dict(self.base)
        for seq, w, change in self.changes:
            if taken(seq):
                out[w] = merge(out[w], change)
        return out

    def as_json(self, taken: Callable[[int], bool]) -> dict[str, Any]:
        """:meth:`after` as a ``"workers"`` record."""
        states = self.after(taken)
        return jsonable({w: {"count": 0, "ended": False, "state": s} for w, s in states.items()})
