"""``ignore_errors``: drop the items whose production failed, within a budget, counting each."""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any, TypeGuard, TypeVar

from pipeflow import _checks
from pipeflow.engine._context import Context
from pipeflow.engine._failure import Failure
from pipeflow.engine._stage import Stage, Traits
from pipeflow.errors import (
    PipeflowError,
    SplitTwiceError,
    StageStuckError,
    StreamNotSplitError,
    WorkerDiedError,
    WorkerTimeoutError,
    _add_note,
    describe_indices,
)
from pipeflow.resume.state import Drops, Rule

if TYPE_CHECKING:
    from pipeflow.stats import StageRecord

__all__ = ["ErrorBudgetExceeded", "ignore_errors"]

T = TypeVar("T")
log = logging.getLogger("pipeflow")

#: Sample indices kept per stage for the statistics.
_KEEP_INDICES = 1000
#: Without a known epoch length, a fraction is enforced once this many items were seen.
_MIN_SEEN = 100


class ErrorBudgetExceeded(PipeflowError):
    """More items failed than ``ignore_errors`` may drop; the last failure is its cause."""


def is_ignore_errors(value: Any) -> TypeGuard[Stage[Any, Any]]:
    """Whether *value* is a stage :func:`ignore_errors` made."""
    return isinstance(value, Stage) and value.name == "ignore_errors" and bool(value.traits.drops)


#: What its first *k* outputs took of its inputs is in the pass's record (:class:`Drops`).
_IGNORE = Rule.recorded(Drops)


def ignore_errors(
    *,
    exceptions: type[BaseException] | tuple[type[BaseException], ...] = Exception,
    max_count: int | None = None,
    max_fraction: float | None = None,
) -> Stage[T, T]:
    """Drop the items whose production raised one of *exceptions* upstream, and go on.

    By default a failed item is raised in the consumer at its turn, and the next ``next()``
    goes on (as torch's ``DataLoader`` does). Put ``ignore_errors()`` after the stages whose
    failures it should drop: those items are left out, counted in ``loader.stats()``
    (``ignored errors: 2 (sample indices 3, 8)``) and logged once per epoch on the
    ``"pipeflow"`` logger, when the pass ends or is closed (a pass left open until the
    interpreter exits is not logged then: ``stats()`` keeps the count). Other exceptions
    pass through unchanged. Where ``fetch`` reads a batch sample by sample (a dataset
    without ``__getitems__``), only the failed samples are dropped and the batch goes on
    shorter; a ``__getitems__`` that raises costs its batch.

    An error that ended its stage's stream is never dropped: a generator that raised (a
    source's iterator, a generator stage), a worker that died
    (:class:`~pipeflow.WorkerDiedError`) or timed out. The items after it were never made,
    so dropping it would shorten the epoch without a word; it is raised at its turn, with a
    note saying why.

    Args:
        exceptions: the exception types to drop (an exception class or a tuple of them).
        max_count: drop at most this many items per epoch; one more raises
            :class:`ErrorBudgetExceeded`. ``None``: no limit.
        max_fraction: drop at most this fraction of the epoch's items (of the items seen so
            far, once 100 were, when the epoch's length is unknown). ``None``: no limit.

    Raises:
        TypeError, ValueError: for a bad argument, when the stage is built.

    Examples:
        >>> import pipeflow as pf
        >>> def load(i):
        ...     if i in (3, 8):
        ...         raise OSError(f"corrupt file {i}")
        ...     return i
        ...
        >>> loader = pf.indices(10) | pf.map(load) | pf.ignore_errors(max_count=5)
        >>> list(loader)
        [0, 1, 2, 4, 5, 6, 7, 9]
        >>> [s.ignored_errors for s in loader.stats().stages]
        [0, 0, 2]
    """
    kinds = exceptions if isinstance(exceptions, tuple) else (exceptions,)
    if not kinds or not all(isinstance(k, type) and issubclass(k, BaseException) for k in kinds):
        msg = (
            "ignore_errors: exceptions must be an exception class or a tuple of them "
            f"(got {exceptions!r})"
        )
        raise TypeError(msg)
    max_count = _checks.optional_integer("ignore_errors", "max_count", max_count, low=0)
    if max_fraction is not None:
        if isinstance(max_fraction, bool) or not isinstance(max_fraction, (int, float)):
            msg = f"ignore_errors: max_fraction must be a number or None (got {max_fraction!r})"
            raise TypeError(msg)
        if not 0 <= max_fraction <= 1:
            msg = f"ignore_errors: max_fraction must be between 0 and 1 (got {max_fraction!r})"
            raise ValueError(msg)
        max_fraction = float(max_fraction)
    config = {"exceptions": kinds, "max_count": max_count, "max_fraction": max_fraction}
    # len() counts the items before any is dropped (a batch that loses samples is still
    # one batch; an item dropped whole makes the epoch shorter than len() says).
    traits = Traits(failures="pass", drops=kinds)
    return Stage(_ignore, "ignore_errors", config, length="same", resume=_IGNORE, traits=traits)


def _ignore(
    items: Iterable[Any],
    exceptions: tuple[type[BaseException], ...],
    max_count: int | None,
    max_fraction: float | None,
    *,
    context: Context,
    stats: StageRecord | None,
    record: Drops | None,
) -> Iterator[Any]:
    drops = record
    total = context.total  # this stage's items per epoch (its inputs, less what it drops)
    limit = _limit(max_count, max_fraction, total)
    dropped: list[Failure] = []
    earlier = drops.earlier if drops is not None else 0  # dropped before a resumed pass
    seen, yielded = context.offset, 0
    try:
        for item in items:
            seen += 1
            if item.__class__ is not Failure or not isinstance(item.error, exceptions):
                yielded += 1
                yield item
                continue
            if item.ends or isinstance(item.error, _NEVER_DROPPED):
                _never_dropped(item)  # the items after it were never made: raised, not dropped
                yielded += 1
                yield item
                continue
            dropped.append(item)
            _count(item, yielded, stats, drops)
            spent = earlier + len(dropped)
            over = limit is not None and spent > limit
            if max_fraction is not None and total is None and seen >= _MIN_SEEN:
                over = over or spent > max_fraction * seen
            if over:
                error = _over_budget(dropped, earlier, seen, (max_count, max_fraction, total))
                raise error from item.error
        spent = earlier + len(dropped)
        if max_fraction is not None and total is None and spent > max_fraction * seen:
            raise _over_budget(dropped, earlier, seen, (max_count, max_fraction, total))
    finally:
        # A pass left open until the interpreter exits (kept by a reference cycle, a global)
        # is closed during shutdown, after everything the program printed: a line then would
        # stand alone at the end, tied to no epoch the reader can see, and the logging
        # handlers may be closed already. stats() still has the count.
        if dropped and not sys.is_finalizing():
            _log(dropped, context.epoch)


#: Errors that end a pass (or a stage's stream) wherever they come from: a dead worker, a
#: timeout, a stuck stage, a stream split twice. Dropping one would shorten the epoch without a
#: word. (A ShardReadError is dropped and counted like a failed sample: the reader goes on with
#: the next shard, and the error names the samples of its shard that were delivered.)
_NEVER_DROPPED = (
    StageStuckError,
    SplitTwiceError,
    StreamNotSplitError,
    WorkerDiedError,
    WorkerTimeoutError,
)


def _never_dropped(item: Failure) -> None:
    """Say in *item*'s error why ``ignore_errors`` let it through (once)."""
    note = (
        "pipeflow: ignore_errors does not drop this error: it ended its stage's stream, so "
        "the items after it were never made (see the reliability page of the docs)"
    )
    if note not in getattr(item.error, "__notes__", ()):
        _add_note(item.error, note)


def _limit(max_count: int | None, max_fraction: float | None, total: int | None) -> int | None:
    """The most items an epoch of *total* items may drop (``None``: no fixed limit)."""
    if max_fraction is None or total is None:
        return max_count
    fraction_limit = int(max_fraction * total)
    return fraction_limit if max_count is None else min(max_count, fraction_limit)


def _count(item: Failure, yielded: int, stats: StageRecord | None, drops: Drops | None) -> None:
    """Note a dropped *item* in the stage's statistics and the pass's record of drops."""
    if drops is not None:
        drops.every.append(yielded)
        if not item.dropped:  # a sample dropped from its batch came in addition to the
            drops.before.append(yielded)  # batch, not in its place
    if stats is not None:
        stats.ignored += 1
        room = _KEEP_INDICES - len(stats.ignored_indices)
        stats.ignored_indices.extend(item.indices[: max(room, 0)])


def _over_budget(
    dropped: list[Failure],
    earlier: int,
    seen: int,
    budget_of: tuple[int | None, float | None, int | None],
) -> ErrorBudgetExceeded:
    max_count, max_fraction, total = budget_of
    budget = []
    if max_count is not None:
        budget.append(f"max_count={max_count}")
    if max_fraction is not None:
        of = f"{total} items" if total is not None else f"{seen} items seen"
        budget.append(f"max_fraction={max_fraction} of {of}")
    indices = [i for f in dropped for i in f.indices]
    where = f" (sample indices {describe_indices(indices)})" if indices else ""
    count = earlier + len(dropped)
    items = "item" if count == 1 else "items"
    before = f", {earlier} of them before the pass resumed" if earlier else ""
    msg = (
        f"ignore_errors: {count} {items} failed this epoch{where}{before}, over the budget "
        f"({', '.join(budget)}); the last error is the cause"
    )
    return ErrorBudgetExceeded(msg)


def _log(dropped: list[Failure], epoch: int) -> None:
    indices = [i for f in dropped for i in f.indices]
    where = f" (sample indices {describe_indices(indices)})" if indices else ""
    first = dropped[0].error
    log.warning(
        "pipeflow: ignore_errors dropped %d failed %s in epoch %d%s; the first: %s: %s",
        len(dropped),
        "item" if len(dropped) == 1 else "items",
        epoch,
        where,
        type(first).__name__,
        first,
    )
