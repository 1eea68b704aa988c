"""Shuffling: a full permutation per epoch, or a bounded buffer for streams."""

from __future__ import annotations

import itertools
import random
from collections.abc import Iterable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow._context import Context
from pipeflow._permutation import Permutation, Permuted
from pipeflow._random import BUFFER_SHUFFLE, check_seed, derive, fresh_seed
from pipeflow._stage import Stage
from pipeflow.state import Resume

__all__ = ["shuffle"]

T = TypeVar("T")


def shuffle(
    *, seed: int | None = None, buffer_size: int | None = None, generator: str = "numpy"
) -> Stage[T, T]:
    """Shuffle the items of every epoch, reproducibly from ``(seed, epoch)``.

    Without *buffer_size* the stage yields a random permutation of the whole (finite) epoch:
    put it right after an index source. Over ``indices(n)`` it computes the index at each
    position on its own, in constant memory (a ``shard`` after it computes only its share);
    over other items it reads the epoch first, then yields it in the same order.
    With *buffer_size* it keeps at most that many items and yields a random one of them for
    every item read — the bounded-memory shuffle for streams; its randomness is local.

    Args:
        seed: the seed; ``None`` draws one when the stage is built and keeps it (it is in the
            repr), so a run can always be reproduced.
        buffer_size: bound on the items held, or ``None`` for a full permutation.
        generator: ``"numpy"`` (a keyed bijection computed per position, keyed through
            ``SeedSequence([seed, SHUFFLE, epoch])``: see :mod:`pipeflow._permutation`; over
            ``indices(n)`` it reads nothing and starts at once), or ``"torch"``:
            ``torch.randperm(n, generator=torch.Generator().manual_seed(seed + epoch))``,
            the permutation ``DistributedSampler(seed=seed)`` draws, so
            ``indices(n) | shuffle(seed=s, generator="torch") | shard()`` gives every rank the
            indices ``DistributedSampler`` gives it. Full permutations only.

    Raises:
        TypeError: if *seed* or *buffer_size* is not an integer.
        ValueError: if *seed* is negative, *buffer_size* < 1, or *generator* is unknown.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.indices(6) | pf.shuffle(seed=7)
        >>> first, second = list(loader), list(loader)
        >>> sorted(first) == sorted(second) == [0, 1, 2, 3, 4, 5], first != second
        (True, True)
        >>> loader.set_epoch(0)
        >>> list(loader) == first
        True
    """
    seed = fresh_seed() if seed is None else check_seed("shuffle", seed)
    if generator not in ("numpy", "torch"):
        msg = f"shuffle: generator must be 'numpy' or 'torch' (got {generator!r})"
        raise ValueError(msg)
    if generator == "torch":
        if buffer_size is not None:
            msg = "shuffle: generator='torch' draws full permutations; drop buffer_size"
            raise ValueError(msg)
        if seed >= 2**63:
            msg = f"shuffle: a torch generator's seed must be below 2**63 (got {seed})"
            raise ValueError(msg)
        config = {"seed": seed, "generator": "torch"}
        return _FullShuffle(_permute_torch, "shuffle", config, length="same")
    if buffer_size is None:
        return _FullShuffle(_permute, "shuffle", {"seed": seed}, length="same")
    buffer_size = _checks.optional_integer("shuffle", "buffer_size", buffer_size, low=1)
    return Stage(
        _buffer_shuffle, "shuffle", {"seed": seed, "buffer_size": buffer_size}, length="same"
    )


class _FullShuffle(Stage[T, T]):
    """A full shuffle: it starts anywhere in its epoch, and over positions it tells the next
    stage which permutation of them it yields (so a ``shard`` computes its own share)."""

    __slots__ = ()

    def resumption(self, k: int, context: Context | None) -> Resume:
        """Seek: the permutation (drawn, or computed per position) starts at output *k*."""
        return Resume.seek()

    def context_after(self, context: Context) -> Context:
        """Over positions, publish ``facts["input"]``: the next stage reads this permutation."""
        if context.positions is None or self._config.get("generator") == "torch":
            return context
        fact = Permuted(context.positions, self._config["seed"], context.epoch)
        return replace(context, facts={**context.facts, "input": fact})


def _permute(items: Iterable[T], seed: int, *, context: Context) -> Iterator[T]:
    # Nothing is computed at iter(), as every stage reads nothing before it is asked (the
    # generator inside the chain starts at the first next()); then the items flow at C speed.
    return itertools.chain.from_iterable(_draw(items, seed, context))


def _draw(items: Iterable[T], seed: int, context: Context) -> Iterator[Iterable[Any]]:
    if context.positions is not None:  # the items are 0..n-1: compute them, read nothing
        yield Permutation(context.positions, seed, context.epoch).stream(context.start)
        return
    pool = list(items)
    order = Permutation(len(pool), seed, context.epoch).stream(context.start)
    yield map(pool.__getitem__, order)


def _permute_torch(
    items: Iterable[T], seed: int, generator: str, *, context: Context
) -> Iterator[T]:
    return itertools.chain.from_iterable(_draw_torch(items, seed, context))


def _draw_torch(items: Iterable[T], seed: int, context: Context) -> Iterator[Iterable[Any]]:
    import torch

    pool = list(items) if context.positions is None else None  # positions: the order is all
    g = torch.Generator()
    g.manual_seed(seed + context.epoch)  # DistributedSampler's draw
    n = len(pool) if pool is not None else context.positions or 0
    tail = torch.randperm(n, generator=g)[context.start :].tolist()
    yield tail if pool is None else map(pool.__getitem__, tail)


def _buffer_shuffle(items: Iterable[T], seed: int, buffer_size: int, *, epoch: int) -> Iterator[T]:
    rng = random.Random(derive(seed, BUFFER_SHUFFLE, epoch))
    buf: list[T] = []
    randrange = rng.randrange
    for item in items:
        if len(buf) < buffer_size:
            buf.append(item)
            continue
        j = randrange(buffer_size)
        out, buf[j] = buf[j], item
        yield out
    rng.shuffle(buf)
    yield from buf
