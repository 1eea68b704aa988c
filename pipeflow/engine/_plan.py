"""The planning step: what a loader computes instead of running, decided before a pass.

Some stages need not read their input: over the indices ``0 .. n - 1`` of ``indices(n)``, a
full ``shuffle`` is a permutation that gives the index at any position in O(1)
(:mod:`pipeflow.engine._permutation`), a ``shard`` keeps every ``world_size``-th position, and a
``batch`` cuts the positions into lists. Before each pass the loader asks its source and
then each stage in turn to describe its output (:meth:`~pipeflow.Source.computed`,
:meth:`~pipeflow.Stage.computed`); the longest prefix that answers becomes one
:class:`Computed` source, which yields the last stage's items straight from that
description: ``indices(50_000) | shuffle(seed=0) | batch(64)`` yields each batch as a list
slice of a permutation block, and nothing passes through the stages above ``batch``.

The plan is visible: ``repr(loader)`` ends with a ``# computed:`` line, ``loader.plan()``
returns it, and ``stats()`` has one row for the computed source (``indices → shuffle →
batch (computed)``) that counts the items it yielded. Every other row counts what really
passed its stage.

One more rewrite keeps a parallel stage right after ``indices(n)`` cheap: it reads the
source's ``range`` iterator directly, in runs (:attr:`~pipeflow.Traits.reads_in_runs`), and
the source's row counts what it took, from what the iterator has left.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any

from pipeflow.engine._context import Context
from pipeflow.engine._memo import segments
from pipeflow.engine._permutation import Permutation
from pipeflow.engine._stage import Source, Stage, computed
from pipeflow.resume.state import Rule

__all__ = ["Batches", "Computed", "PassPlan", "Positions", "plan"]

_BLOCK = 65536  # positions cut into batches at a time


@dataclass(frozen=True)
class Positions:
    """The indices ``0 .. n - 1`` of an epoch: in order, or a full shuffle's permutation of
    them; all of them, or the share of one ``shard``.

    Attributes:
        n: how many indices.
        seed: the full shuffle's seed, or ``None`` (in order).
        generator: the shuffle's generator: ``"numpy"`` (a keyed bijection, O(1) per
            position) or ``"torch"`` (``torch.randperm``, as ``DistributedSampler`` draws).
        share: for a ``shard``, a function that returns ``(rank, world_size, worker,
            workers)`` when the pass starts (a rank's share is split again between the
            ``workers`` of a ``parallel_source``, unpadded); ``None`` keeps every position.
        drop_last: the shard drops its incomplete last round (else pads it from the start).
    """

    n: int
    seed: int | None = None
    generator: str = "numpy"
    share: Callable[[], tuple[int, int, int, int]] | None = None
    drop_last: bool = False

    def shuffled(self, seed: int, generator: str) -> Positions | None:
        """The positions after a full shuffle (``None`` when already shuffled or sharded)."""
        if self.seed is not None or self.share is not None:
            return None
        return replace(self, seed=seed, generator=generator)

    def sharded(
        self, share: Callable[[], tuple[int, int, int, int]], drop_last: bool
    ) -> Positions | None:
        """One rank's share of the positions (``None`` when already sharded)."""
        if self.share is not None:
            return None
        return replace(self, share=share, drop_last=drop_last)

    def span(self, start: int) -> tuple[int, int, int]:
        """``(first, stop, step)``: the positions of this pass from its item *start* on.
        Positions from ``n`` on wrap around (a shard's padding)."""
        if self.share is None:
            return min(start, self.n), self.n, 1
        r, w, k, m = self.share()  # rank r of w; worker k of the m that split its share
        count = self.n // w if self.drop_last else -(-self.n // w)  # the rank's, padded
        first, stop, step = r + k * w, r + count * w, w * m
        return min(first + start * step, stop), stop, step

    def items(self, epoch: int, start: int) -> Iterator[int]:
        """The indices from item *start* of the pass on (a plain ``range`` iterator when in
        order and unsharded: it knows what it has left)."""
        if self.seed is None and self.share is None:
            return iter(range(min(start, self.n), self.n))
        return itertools.chain.from_iterable(self.blocks(epoch, start))

    def blocks(self, epoch: int, start: int) -> Iterator[Sequence[int]]:
        """The indices from item *start* of the pass on, in blocks of up to 65536."""
        first, stop, step = self.span(start)
        n = self.n
        if self.seed is None:
            for a in range(first, stop, _BLOCK * step):
                block = range(a, min(a + _BLOCK * step, stop), step)
                yield block if block.stop <= n else [p % n for p in block]
        elif self.generator == "torch":
            order = _torch_permutation(n, self.seed + epoch)
            for a in range(first, stop, _BLOCK * step):
                yield [order[p % n] for p in range(a, min(a + _BLOCK * step, stop), step)]
        elif first < stop:
            yield from map(_tolist, Permutation(n, self.seed, epoch).blocks(first, stop, step))


@dataclass(frozen=True)
class Batches:
    """Lists of *size* consecutive items of *positions*, as ``batch`` cuts them."""

    positions: Positions
    size: int
    drop_last: bool

    def items(self, epoch: int, start: int) -> Iterator[list[int]]:
        """The batches from batch *start* of the pass on (the first ones are full)."""
        return cut(self.positions.blocks(epoch, start * self.size), self.size, self.drop_last)


def cut(blocks: Iterator[Sequence[int]], size: int, drop_last: bool) -> Iterator[list[int]]:
    """Cut a stream of blocks into lists of *size*, a list slice each."""
    rest: list[int] = []
    for block in blocks:
        xs = rest + list(block) if rest else list(block)
        end = len(xs) - len(xs) % size
        for i in range(0, end, size):
            yield xs[i : i + size]
        rest = xs[end:]
    if rest and not drop_last:
        yield rest


class Computed(Source[Any]):
    """A source and the stages after it that the loader computes, as one source.

    Its items are the last computed stage's, made from *described* (a :class:`Positions`
    or :class:`Batches`); it starts anywhere in them at once (a resumed pass).
    """

    resume = Rule.seek()

    def __init__(
        self, source: Source[Any], stages: tuple[Stage[Any, Any], ...], described: Any
    ) -> None:
        self.source = source
        self.stages = stages
        self.described = described
        self.name = " → ".join([source.name, *(s.name for s in stages)]) + " (computed)"

    def iterate(self, context: Context) -> Iterator[Any]:
        return self.described.items(context.epoch, context.start)  # type: ignore[no-any-return]

    def length(self) -> int | None:
        n = self.source.length()
        for s in self.stages:
            n = None if n is None else s.length(n)
        return n

    def describe(self) -> str:
        return " → ".join([self.source.describe(), *(repr(s) for s in self.stages)])

    def close(self) -> None:
        self.source.close()


@dataclass(frozen=True)
class PassPlan:
    """What a loader's passes run: a source (maybe :class:`Computed`) and the other stages.

    Attributes:
        source: the source the pass iterates.
        stages: the stages that run on items, in order.
        fused: how many of the loader's stages *source* computes (0: none).
        direct: the first stage reads the source's iterator itself, unwatched (a parallel
            stage after ``indices(n)``); the source's row counts what it took.
    """

    source: Source[Any]
    stages: tuple[Stage[Any, Any], ...]
    fused: int = 0
    direct: bool = False

    def names(self) -> list[str]:
        """The rows of ``stats()``: the source's name, then each stage's."""
        return [self.source.name, *(s.name for s in self.stages)]

    def note(self) -> str:
        """One line on what the plan changed, for the loader's repr ("" when nothing)."""
        if self.fused:
            return f"computed as one source: {self.source.name.removesuffix(' (computed)')}"
        if self.direct:
            return f"{self.stages[0].name} reads {self.source.name} directly, in runs"
        return ""

    def __str__(self) -> str:
        lines = [f"source: {self.source.describe()}"]
        lines += [f"stage: {s!r}" for s in self.stages]
        if self.fused:
            lines.append(f"({self.fused} of the loader's stages computed by the source)")
        if self.direct:
            lines.append(f"({self.stages[0].name} reads the source directly, in runs)")
        return "\n".join(lines)


def plan(source: Source[Any], stages: tuple[Stage[Any, Any], ...]) -> PassPlan:
    """The plan for *source* and *stages*: the longest prefix that computes, as one source."""
    described = source.computed()
    fused = 0
    while described is not None and fused < len(stages):
        after = computed(stages[fused], described)
        if after is None:
            break
        described, fused = after, fused + 1
    rest = stages[fused:]
    direct = (
        bool(rest)
        and rest[0].traits.reads_in_runs
        and isinstance(described, Positions)
        and described.seed is None
        and described.share is None
        and 0 not in segments(rest).values()  # a cache's keys pass through its decider
    )
    if fused:
        source = Computed(source, stages[:fused], described)
    return PassPlan(source, rest, fused, direct)


def _tolist(block: Any) -> list[int]:
    return block.tolist()  # type: ignore[no-any-return]


def _torch_permutation(n: int, seed: int) -> list[int]:
    import torch

    g = torch.Generator()
    g.manual_seed(seed)  # DistributedSampler's draw: seed + epoch
    order: list[int] = torch.randperm(n, generator=g).tolist()
    return order
