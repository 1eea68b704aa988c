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

import functools
from array import array
from bisect import bisect_right
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeflow.resume.state import Form, Int, Record, Rule

__all__ = ["RESTARTS", "Clean", "Restarts", "drive", "restarting"]


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

    #: A restart point: ``{"inputs": n}`` or ``{"inputs": n, "start": m}``; at the epoch's
    #: start (``n == 0``) the *m* outputs made again are all those consumed.
    FORM = Form(
        {"inputs": Int(0, "total"), "start": Int(0, "consumed", True)},
        (
            (
                lambda v: (
                    v["consumed"] is None or v["inputs"] or v.get("start", 0) == v["consumed"]
                ),
                lambda v: (
                    f"{v['where']} restarts at the epoch's start but makes {v.get('start', 0)} "
                    f"outputs again, and {v['consumed']} were consumed"
                ),
            ),
        ),
    )

    @classmethod
    def begin(cls, stage: Any, context: Any, saved: dict[str, Any] | None) -> Restarts:
        return cls(context.offset, context.start)

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


def restarting(maker: Callable[..., Iterator[Any]]) -> Callable[..., Iterator[Any]]:
    """The stage function of a maker ``maker(items, context, stats, **config)``: its
    outputs without the first ``context.start``, its restart points noted in the pass's
    record. Use it as a decorator, so the function keeps the maker's name (and pickles)."""

    @functools.wraps(maker)
    def made(
        items: Iterable[Any],
        *,
        context: Any,
        stats: Any,
        record: Restarts | None,
        **config: Any,
    ) -> Iterator[Any]:
        return drive(maker(items, context, stats, **config), record, context.start)

    del made.__wrapped__  # its own signature: the loader gives it its record
    return made


#: The rule of a stage that resumes at its restart points (its function made by
#: :func:`restarting`): where its first *k* outputs leave it is in the pass's record.
RESTARTS = Rule.recorded(Restarts)
