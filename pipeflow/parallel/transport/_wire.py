"""What travels between the main process and its workers: typed records, never bare tuples.

A :class:`Task` goes to a worker; a :class:`Reply` comes back (``"end"`` when a source
job raised :class:`Exhausted`). Process workers send them
pickled through a pipe (large result buffers go through shared memory, described by
:class:`Encoded`); thread workers put the same records on queues.
"""

from __future__ import annotations

import pickle
import traceback
from typing import Any, Literal, NamedTuple

from pipeflow.errors import WorkerError, _RemoteTraceback
from pipeflow.parallel.transport._segments import Segment

__all__ = [
    "Encoded",
    "Exhausted",
    "PassNote",
    "RemoteError",
    "Reply",
    "Task",
    "Trim",
    "describe_item",
    "raise_remote",
    "remote_error",
    "reply",
    "tasks",
]


class Task(NamedTuple):
    """One item for a worker.

    Attributes:
        pass_id: the pass it belongs to (a worker drops tasks of an abandoned pass).
        seq: the item's number in the pass (its position in the epoch).
        epoch: the epoch.
        item: the item itself (``None`` for a source worker: "your next item").
        freed: shared-memory segments the main process no longer uses (process workers).
    """

    pass_id: int
    seq: int
    epoch: int
    item: Any
    freed: list[int] | None = None


class Encoded(NamedTuple):
    """A result pickled by :class:`~pipeflow.parallel.transport._shm.Writer` (*piped*: its large
    buffers came through the pipe, because ``/dev/shm`` was full)."""

    data: bytes
    segment: Segment | None
    layout: list[Any]
    retired: list[int]
    piped: bool = False


class Trim(NamedTuple):
    """Sent to a kept pool's workers when a pass ends: drop every kept shared-memory segment
    (the main process dropped its mappings), so nothing stays in ``/dev/shm`` between passes.
    """

    pass_id: int


class RemoteError(NamedTuple):
    """An exception raised in a worker process, as it crosses back."""

    pickled: bytes | None  # None when the exception can't be pickled and rebuilt
    type_name: str
    text: str
    traceback: str


class Reply(NamedTuple):
    """What a worker sends back for one task (or once, if its start-up failed).

    Attributes:
        pass_id: the task's pass (``None`` for a start-up failure).
        kind: ``"ok"`` (``payload`` is the result, :class:`Encoded` from a process),
            ``"err"`` (``payload`` is the exception, in a one-item list the pool empties as
            it raises it; :class:`RemoteError` from a process),
            ``"end"`` (a source worker has no more items), or ``"init"`` (``worker_init``
            or the worker's set-up failed; ``payload`` as for ``"err"``).
        seq: the task's number.
        worker: the worker's id.
        took: nanoseconds the worker spent on the item.
        payload: as above.
        state: what changed in the worker's state for ``state_dict()`` since its previous
            reply (its dataset's or replica's state, its global generators: see
            :class:`~pipeflow.parallel.pools._worker.Snapshotter`), or ``None``.
        ended: the worker's ``time.monotonic()`` as it was done with the item, from a
            worker process that runs one item at a time: its next item starts then. Every
            process of a machine reads the same monotonic clock, so the pool learns when that
            was even if it reads the reply late (the consumer held results meanwhile); see
            ``busy_since`` in :mod:`pipeflow.parallel.pools._processes`. ``0.0`` from
            other workers: threads, whose pool sees when they take an item, event loops,
            which start each item as it arrives, and Ray actors, on machines with clocks
            of their own.
    """

    pass_id: int | None
    kind: Literal["ok", "err", "end", "init"]
    seq: int
    worker: int
    took: int = 0
    payload: Any = None
    state: Any = None
    ended: float = 0.0


class Exhausted(Exception):
    """A source job has no more items this epoch (its worker replies ``"end"``)."""


class PassNote(NamedTuple):
    """What a pass tells source workers with each task: which pass it is (*key*: a worker
    starts its replica's pass afresh when it changes), and *value*, the source's
    ``pass_note()`` in the main process (a DataPipe's shuffle seed), given to its
    ``begin_pass(value)`` in the worker."""

    value: Any
    key: int = 0


def describe_item(item: Any, seq: int) -> dict[str, Any]:
    """How an error note names an item: a sample index, a batch of them, or its position."""
    if type(item) is int:
        return {"index": item}
    if type(item) is list and all(type(i) is int for i in item[:64]):
        return {"batch": item}
    return {"item": seq}


_new = tuple.__new__


def tasks(pass_id: int, epoch: int, items: list[tuple[int, Any]]) -> list[Task]:
    """The tasks for ``(seq, item)`` pairs, built with no Python call per task."""
    return [_new(Task, (pass_id, seq, epoch, item, None)) for seq, item in items]


def reply(pass_id: int | None, kind: str, seq: int, worker: int, took: int, payload: Any) -> Reply:
    """``Reply(...)`` with every field given: the same record, without the Python
    ``__new__`` a NamedTuple's constructor runs (a reply per item, on a busy event loop)."""
    return _new(Reply, (pass_id, kind, seq, worker, took, payload, None, 0.0))


def remote_error(e: BaseException) -> RemoteError:
    """*e* as it can cross to another process: pickled when it survives a round trip."""
    text = "".join(traceback.format_exception(type(e), e, e.__traceback__))
    payload: bytes | None
    try:
        payload = pickle.dumps(e)
        pickle.loads(payload)
    except Exception:
        payload = None
    return RemoteError(payload, f"{type(e).__module__}.{type(e).__qualname__}", str(e), text)


def raise_remote(error: RemoteError, where: str | None) -> None:
    """Raise a worker's exception here, its traceback in words as the cause (and *where* it
    failed, when given, as a note); a :class:`~pipeflow.errors.WorkerError` when it did not
    pickle."""
    exc: BaseException = (
        pickle.loads(error.pickled)
        if error.pickled is not None
        else WorkerError(error.type_name, error.text)
    )
    if where is not None and hasattr(exc, "add_note"):
        exc.add_note(f"pipeflow: {where} failed")
    try:
        raise exc from _RemoteTraceback(error.traceback)
    finally:  # the traceback keeps this frame: were it to keep *exc* too, the exception
        del exc  # and everything its traceback holds (the pass, its workers) would wait for gc
