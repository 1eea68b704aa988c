"""What a pass tells each stage: the public :class:`Context`, and the loader's private hooks.

This module is the ground floor of the package: it imports nothing from pipeflow, so every
other module (stages, the loader, resumption, the parallel engine) can depend on it.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

__all__ = ["Context", "Hooks"]

_NO_FACTS: Mapping[str, Any] = MappingProxyType({})


@dataclass(frozen=True)
class Context:
    """What one pass of a loader tells one stage.

    A stage function gets it by declaring a keyword-only ``context`` parameter (``epoch``
    alone is enough for most stages).

    Attributes:
        epoch: the epoch of this pass.
        offset: how many of this stage's inputs the pass skipped before the first one it
            sees (a resumed pass starts mid-epoch): a stage that numbers its items counts
            from here, so the numbers do not depend on where the pass started.
        start: for a stage that skips its own outputs when a pass resumes (see
            :meth:`pipeflow.Stage.resumption`), how many it must skip; 0 otherwise.
        total: how many items this stage yields per epoch, when that is known.
        base_seed: the workers' base seed for this pass when the caller chose one (the
            DataLoader facade draws it from its ``generator``, as torch does), or a function
            that returns it; ``None`` lets parallel stages derive one from their own seed.
        facts: read-only facts that stages above this one published for those below
            (:attr:`pipeflow.Traits.publish`): ``facts["shard"] == (first, step)`` when
            a ``shard`` above numbers this stage's item ``j`` as the epoch's item
            ``first + j * step`` (``random_map`` keys its draws by it). No stage computes
            from what another published: what can be computed without running is the
            planning step's (:mod:`pipeflow.engine._plan`).
        ignoring: the exception types a later ``ignore_errors`` drops: a stage that can
            drop a part of an item (``fetch``: one failed sample of a batch) drops only that
            part, and marks it as dropped.
    """

    epoch: int
    offset: int = 0
    start: int = 0
    total: int | None = None
    base_seed: int | Callable[[], int] | None = None
    facts: Mapping[str, Any] = field(default_factory=lambda: _NO_FACTS)
    ignoring: tuple[type[BaseException], ...] = ()


class Hooks:
    """The loader's private handles for one stage in one pass (never shown to user stages).

    Attributes:
        stats: where the stage's statistics go (a :class:`pipeflow.stats.StageRecord`), or
            ``None`` when recording is off.
        resume: what a resumed pass tells a stage that delivers out of order (the numbers of
            the items it delivered past the resume point), or ``None``.
        record: what the stage records in this pass for ``state_dict()`` (the object its
            :meth:`~pipeflow.Stage.new_record` made), or ``None``.
        resources: things the stage keeps across the loader's passes (a persistent worker
            pool), by key; the loader closes them in ``close()``.
        saved: the stage's (or source's) record in the state a resumed pass starts from, or
            ``None``.
        history: a later stage reads ahead of the consumer (a parallel stage, a prefetching
            thread): a producer of items keeps a snapshot of its stateful objects after each
            item (see :mod:`pipeflow.resume._objects`).
    """

    __slots__ = ("history", "record", "resources", "resume", "saved", "stats")

    def __init__(
        self,
        stats: Any = None,
        resume: frozenset[int] | None = None,
        record: Any = None,
        resources: dict[Any, Any] | None = None,
        saved: Any = None,
        history: bool = False,
    ) -> None:
        self.stats = stats
        self.resume = resume
        self.record = record
        self.resources = {} if resources is None else resources
        self.saved = saved
        self.history = history
