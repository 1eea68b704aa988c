"""A failed item, travelling as a value: how one bad sample does not end the epoch.

A generator that raised is finished, so an exception cannot travel through a chain of
generators and leave it running. pipeflow turns it into a :class:`Failure` where it happens
(the stage's watcher catches it, or the stage itself marks the failed sample), carries the
failure down the chain in the failed item's place — past the stages, which never see it —
and raises it in the consumer, at that item's ``next()``. The following ``next()`` goes on.
``pf.ignore_errors`` drops failures instead, within a budget.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["ENDED", "Failure", "WithDropped", "ended"]


class Failure:
    """An item whose production raised *error* (annotated with the stage and indices).

    Attributes:
        error: the exception, with its traceback and pipeflow's note.
        indices: the sample indices the item stood for, when known (else ``()``).
        dropped: the item's batch went on without it (a sample dropped by ``fetch`` for a
            later ``ignore_errors``): the failure is only counted, never raised.
        ends: the error ended its stage's stream (a generator that raised is finished; a
            parallel stage whose worker died or timed out): the items after it were never
            made, so ``ignore_errors`` must not drop it (the epoch would be silently short).
    """

    __slots__ = ("dropped", "ends", "error", "indices")

    def __init__(
        self,
        error: BaseException,
        indices: Sequence[Any] = (),
        dropped: bool = False,
        ends: bool = False,
    ):
        self.error = error
        self.indices = tuple(indices)
        self.dropped = dropped
        self.ends = ends

    def __repr__(self) -> str:
        what = f" at sample indices {list(self.indices)}" if self.indices else ""
        return f"Failure({type(self.error).__name__}{what})"

    def __reduce__(self) -> tuple[Any, ...]:
        return (Failure, (_sendable(self.error), self.indices, self.dropped, self.ends))


#: The attribute that marks an exception raised from a :class:`Failure` whose error ended
#: its stream, so that a pass that runs inside a worker (``parallel_source``) tells the main
#: process (an exception's attributes travel with its pickle).
ENDED = "_pipeflow_ended_stream"


def ended(error: BaseException) -> bool:
    """Whether *error* ended the stream of the stage it came from (see :data:`ENDED`)."""
    return bool(getattr(error, ENDED, False))


def _sendable(error: BaseException) -> BaseException:
    """*error*, or a :class:`~pipeflow.WorkerError` with its text where it doesn't pickle."""
    import pickle

    try:
        pickle.loads(pickle.dumps(error))
    except Exception:
        from pipeflow.errors import WorkerError

        return WorkerError(f"{type(error).__module__}.{type(error).__qualname__}", str(error))
    return error


class WithDropped:
    """A worker's result whose batch went on without some failed samples (``fetch`` dropped
    them for a later ``ignore_errors``): the result, then those failures, to be counted."""

    __slots__ = ("dropped", "value")

    def __init__(self, value: Any, dropped: list[Failure]) -> None:
        self.value = value
        self.dropped = dropped

    def __reduce__(self) -> tuple[Any, ...]:
        return (WithDropped, (self.value, self.dropped))
