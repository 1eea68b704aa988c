"""Errors and the notes pipeflow adds to exceptions raised by user code.

pipeflow never swaps the type of an exception raised by your code: it adds a PEP 678 note that
names the stage, the item or sample indices, and the epoch, and lets it propagate.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Sequence
from typing import Any

__all__ = [
    "PipeflowError",
    "ShardReadError",
    "SplitTwiceError",
    "StageStuckError",
    "StreamNotSplitError",
    "WorkerDiedError",
    "WorkerError",
    "WorkerTimeoutError",
    "annotate",
    "describe_indices",
]

_PREFIX = "pipeflow: stage "


class PipeflowError(RuntimeError):
    """Base class of the errors pipeflow raises itself (not re-raised user errors)."""


class WorkerError(PipeflowError):
    """A worker raised an exception that could not be rebuilt in the main process.

    Attributes:
        type_name: the qualified name of the original exception type.
    """

    def __init__(self, type_name: str, text: str) -> None:
        super().__init__(f"{type_name}: {text}")
        self.type_name = type_name

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.type_name, str(self).partition(": ")[2]))


class _EndsThePass:
    """What a pass that ended on this error did not deliver (set by the parallel stage).

    Attributes:
        undelivered: the sample indices (or, for items that are not indices, the item
            numbers) that were sent to the workers and never delivered.
        unsent_from: the number of the first item of the pass that was never sent (every
            later one was lost too), or ``None`` when every item had been sent.
    """

    undelivered: tuple[Any, ...] = ()
    unsent_from: int | None = None
    fix: str = ""  # the message's last sentence, what to do: kept last when more is added


class WorkerDiedError(_EndsThePass, PipeflowError):
    """A worker process ended without being asked to (killed, crashed, ``os._exit``).

    The message names the stage, the worker, its pid, the exit code or signal, the sample
    indices it held, and every item of the pass that was not delivered. A worker's death is
    not a bad sample: :func:`pipeflow.ignore_errors` never drops this error. With
    ``parallel_map(..., restarts=n)`` a dead worker's items go to a new worker instead, up to
    *n* times an epoch; this error comes when that budget is spent, or when one sample killed
    two workers in a row (a "poison" sample, named in the message).

    A Ray actor (``backend="ray"``) that dies, or whose node does, is named the same way,
    with its node.

    Attributes:
        pid: the worker's process id, when known.
        exitcode: its exit code (negative: the signal that killed it), when known.
        node: a Ray actor's node id (``backend="ray"``), when known; else ``None``.
        undelivered: the sample indices (or item numbers) sent to the workers and never
            delivered: the dead worker's and every other one's.
        unsent_from: the number of the first item of the pass never sent (the rest of the
            epoch was lost too), or ``None``.
        worker: the dead worker's number in its stage, when known. For a
            :func:`~pipeflow.parallel_source`, a note says where that worker stood in its
            stream (the shard and sample its reader had delivered up to).
    """

    node: str | None = None
    worker: int | None = None

    def __init__(self, text: str, *, pid: int | None = None, exitcode: int | None = None) -> None:
        super().__init__(text)
        self.pid = pid
        self.exitcode = exitcode

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild_died, (str(self), self.pid, self.exitcode), self.__dict__)


def _rebuild_died(text: str, pid: int | None, exitcode: int | None) -> WorkerDiedError:
    return WorkerDiedError(text, pid=pid, exitcode=exitcode)


class WorkerTimeoutError(_EndsThePass, PipeflowError, TimeoutError):
    """A worker held an item for the stage's ``timeout`` without finishing it (or, while
    items waited, no worker began one within it).

    The message names the stage, the timeout, the items in flight (with the worker and pid
    that held each) and every item of the pass that was not delivered. The pass ends, its
    workers are stopped at once (a persistent pool is not kept), and
    :func:`pipeflow.ignore_errors` never drops this error.
    """


class StageStuckError(PipeflowError):
    """A stage raised again and again without yielding an item, while its failures waited for
    the next stage (which does not take failures) to ask for an item: an iterator that raises
    on every ``next()`` would otherwise hold the pass forever. The pass ends after the failures
    it raised; :func:`pipeflow.ignore_errors` never drops this error."""


class ShardReadError(PipeflowError):
    """A shard could not be read (it does not exist, it is truncated or malformed, or the
    store failed past the retries or the timeout): the message names the shard, the byte
    offset, and how many of its samples were delivered before it (the last by its key).

    A reader delivers every complete sample before the damage, yields this error once in the
    place of the shard's unread samples, and goes on with the next shard: ``next()`` raises it
    at its turn like any failed item, and :func:`~pipeflow.ignore_errors` drops and counts it
    like one (its log line and statistics name it), so the epoch is never silently short.
    """


class SplitTwiceError(PipeflowError):
    """A stream that was split by worker already would be split by worker again, which would
    keep a fraction of what each worker reads and lose the rest of the epoch: a source in a
    :func:`~pipeflow.parallel_source` worker that splits itself (it read
    ``get_worker_info().num_workers``) followed by :func:`~pipeflow.shard`. The message says
    what to write instead; :func:`pipeflow.ignore_errors` never drops this error."""


class StreamNotSplitError(PipeflowError):
    """A torch ``IterableDataset`` read by :func:`~pipeflow.parallel_source` thread workers
    did not split its stream by worker: torch's ``get_worker_info()`` answers ``None`` in a
    thread, so each thread would read the whole stream and the epoch would hold every item
    once per worker. Raised with the first item of the replica's pass, which then ends;
    :func:`pipeflow.ignore_errors` never drops it."""


class _RemoteTraceback(Exception):
    """The traceback of an exception raised in a worker process, as text (for ``__cause__``)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self.text = text

    def __str__(self) -> str:
        return self.text


def describe_indices(indices: Sequence[Any], limit: int = 16) -> str:
    """A short text for a list of sample indices.

    Examples:
        >>> describe_indices([3, 4, 5])
        '[3, 4, 5]'
        >>> describe_indices(list(range(40)), limit=4)
        '[0, 1, 2, 3, ... (40 in all)]'
    """
    if len(indices) <= limit:
        return repr(list(indices))
    head = ", ".join(repr(i) for i in indices[:limit])
    return f"[{head}, ... ({len(indices)} in all)]"


def is_annotated(exc: BaseException) -> bool:
    """Whether a pipeflow stage already named itself in *exc*'s notes."""
    return any(n.startswith(_PREFIX) for n in getattr(exc, "__notes__", ()))


def annotate(
    exc: BaseException,
    stage: str,
    epoch: int,
    *,
    item: int | None = None,
    index: Any = None,
    batch: Sequence[Any] | None = None,
    extra: str = "",
) -> None:
    """Add ``pipeflow: stage '<stage>' failed on ...`` to *exc*, once (the innermost stage wins).

    Examples:
        >>> e = KeyError("x")
        >>> annotate(e, "fetch", 0, index=7, batch=[6, 7])
        >>> e.__notes__
        ["pipeflow: stage 'fetch' failed on sample index 7 (batch [6, 7], epoch 0)"]
        >>> annotate(e, "collate", 0, item=3)  # already named: left alone
        >>> len(e.__notes__)
        1
    """
    if is_annotated(exc) or isinstance(exc, PipeflowError):
        return  # named already, or one of ours: those say where they come from
    where: list[str] = []
    if index is not None:
        what = f"sample index {index!r}"
        if batch is not None:
            where.append(f"batch {describe_indices(batch)}")
    elif batch is not None:
        what = f"the batch of sample indices {describe_indices(batch)}"
    elif item is not None:
        what = f"item {item}"
    else:
        what = "start-up"
    where.append(f"epoch {epoch}")
    where.extend(_worker_words())
    note = f"{_PREFIX}{stage!r} failed on {what} ({', '.join(where)})"
    if extra:
        note = f"{note}: {extra}"
    _add_note(exc, note)


def _worker_words() -> list[str]:
    from pipeflow.worker_info import current_info

    info = current_info()
    if info is None:
        return []
    kind = {"thread": "thread worker", "ray": "ray actor"}.get(info.backend, "worker")
    words = [f"{kind} {info.id} of {info.num_workers}", f"pid {info.pid}"]
    return [*words, f"node {info.node}"] if info.node else words


def _add_note(exc: BaseException, note: str) -> None:
    if sys.version_info >= (3, 11):
        exc.add_note(note)
    else:  # pragma: no cover - Python 3.10
        notes = list(getattr(exc, "__notes__", []))
        notes.append(note)
        with contextlib.suppress(AttributeError):
            exc.__notes__ = notes  # type: ignore[attr-defined]
