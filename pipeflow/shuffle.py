"""Shuffling: a full permutation per epoch, or a bounded buffer for streams."""

from __future__ import annotations

import random
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow._context import Context
from pipeflow._permutation import Permutation
from pipeflow._plan import Positions
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
    put it right after an index source. Over ``indices(n)`` the loader computes the index at
    each position instead (the planning step, :mod:`pipeflow._plan`), in constant memory (a
    ``shard`` after it computes only its share); over other items it reads the epoch first,
    then yields it in that order.
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
    _checks.one_of("shuffle", "generator", generator, ("numpy", "torch"))
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
    """A full shuffle: it starts anywhere in its epoch; over positions the planning step
    computes it (see :mod:`pipeflow._plan`)."""

    __slots__ = ()

    def resumption(self, k: int, context: Context | None) -> Resume:
        """Seek: the permutation starts at output *k*."""
        return Resume.seek()

    def computed(self, upstream: Any) -> Positions | None:
        """Over positions: the same positions, permuted from ``(seed, epoch)``."""
        if not isinstance(upstream, Positions):
            return None
        return upstream.shuffled(self._config["seed"], self._config.get("generator", "numpy"))


def _permute(items: Iterable[T], seed: int, *, context: Context) -> Iterator[T]:
    """The epoch's items, read first, then yielded in a permutation from ``(seed, epoch)``."""
    pool = list(items)
    order = Permutation(len(pool), seed, context.epoch).stream(context.start)
    yield from map(pool.__getitem__, order)


def _permute_torch(
    items: Iterable[T], seed: int, generator: str, *, context: Context
) -> Iterator[T]:
    """As :func:`_permute`, in ``torch.randperm``'s order (``DistributedSampler``'s draw)."""
    import torch

    pool = list(items)
    g = torch.Generator()
    g.manual_seed(seed + context.epoch)
    tail = torch.randperm(len(pool), generator=g)[context.start :].tolist()
    yield from map(pool.__getitem__, tail)


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
