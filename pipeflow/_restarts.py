"""Resuming a stage that holds a bounded buffer: it restarts where its buffer was last empty.

The sequence stages (``batch(max_tokens=...)``, ``bucket``, ``pack``) read a window of items,
decide what to make of it, and yield the result. At the moments their buffer is empty (a
window's start, after a flush) what they make next depends only on the items still to come:
a *restart point*. A resumed pass restarts the stage at the restart point just before the
consumer's position, re-reading at most one buffer of items, and the stage makes the outputs
it had made after that point again without yielding them (see :mod:`pipeflow.state`, the
``{"inputs": n, "start": m}`` form).

The stage's generator (the *maker*) yields its outputs and, in between, :class:`Clean`
markers saying how many of its inputs it had read at a restart point; :func:`drive` turns
them into the pass's :class:`Restarts` record and skips the first ``context.start`` outputs.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator
from typing import Any

from pipeflow._context import Context, Hooks
from pipeflow._stage import Stage
from pipeflow.state import Record, Resume, check_inputs

__all__ = ["Clean", "Restarting", "Restarts", "drive"]


class Clean:
    """A restart point, between two outputs of a maker: its buffer is empty, and *inputs*
    of the epoch's inputs to the stage were read before it."""

    __slots__ = ("inputs",)

    def __init__(self, inputs: int) -> None:
        self.inputs = inputs


class Restarts(Record):
    """A pass's restart points: for each, the stage's inputs read and outputs made before it.

    Outputs are counted from the pass's own restart (the *start* outputs a resumed pass made
    again without yielding included), so the consumer's *consumed* outputs are the first
    ``start + consumed`` made. Two ``array('q')`` of 8-byte numbers: an epoch of a million
    restart points keeps 16 MB.

    Examples:
        >>> r = Restarts(offset=100, start=2)
        >>> r.mark(130, 5)  # the buffer was empty after 30 more inputs and 5 outputs made
        >>> r.after(0), r.after(3), r.after(4)
        ({'inputs': 100, 'start': 2}, {'inputs': 130}, {'inputs': 130, 'start': 1})
    """

    __slots__ = ("inputs", "made", "start")

    def __init__(self, offset: int, start: int) -> None:
        self.inputs = array("q", [offset])
        self.made = array("q", [0])
        self.start = start

    def mark(self, inputs: int, made: int) -> None:
        """A restart point after *inputs* inputs of the epoch and *made* outputs."""
        self.inputs.append(inputs)
        self.made.append(made)

    def after(self, consumed: int) -> dict[str, Any]:
        """Where the stage restarts once the consumer took *consumed* of this pass's outputs:
        the latest restart point at or before them (the least to re-read)."""
        made = self.start + consumed
        i = bisect_right(self.made, made) - 1
        out = {"inputs": self.inputs[i]}
        if made > self.made[i]:
            out["start"] = made - self.made[i]
        return out


def drive(made: Iterator[Any], record: Restarts | None, start: int) -> Iterator[Any]:
    """The outputs of a maker, without its first *start* ones; its restart points go into
    *record*."""
    count = 0
    for out in made:
        if out.__class__ is Clean:
            if record is not None:
                record.mark(out.inputs, count)
            continue
        count += 1
        if count > start:
            yield out


class Restarting(Stage[Any, Any]):
    """A stage that resumes at its restart points. Its function is a maker:
    ``fn(items, context, stats, **config)``, yielding outputs and :class:`Clean` markers
    (*stats* is its :class:`~pipeflow.stats.StageRecord`, or ``None``)."""

    __slots__ = ()

    def apply(
        self, upstream: Iterable[Any], context: Context, hooks: Hooks | None = None
    ) -> Iterator[Any]:
        hooks = hooks or Hooks()
        made = self._fn(upstream, context, hooks.stats, **self._config)
        return drive(made, hooks.record, context.start)

    def resumption(self, k: int, context: Context | None) -> Resume:
        """Where its first *k* outputs leave it is in the pass's record (:class:`Restarts`)."""
        return Resume.recorded()

    def new_record(self, context: Context, saved: dict[str, Any] | None) -> Restarts:
        return Restarts(context.offset, context.start)

    def check_record(
        self, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """A restart point: ``{"inputs": n}`` or ``{"inputs": n, "start": m}``; at the
        epoch's start (``n == 0``) the *m* outputs made again are all those consumed."""
        checked = check_inputs(record, where, consumed, total)
        if consumed is not None and checked["inputs"] == 0 and checked.get("start", 0) != consumed:
            msg = (
                f"load_state_dict: {where} restarts at the epoch's start but makes "
                f"{checked.get('start', 0)} outputs again, and {consumed} were consumed"
            )
            raise ValueError(msg)
        return checked
