"""Shuffling: a full permutation per epoch, or a bounded buffer for streams."""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow._random import BUFFER_SHUFFLE, check_seed, derive, fresh_seed
from pipeflow.engine._context import Context
from pipeflow.engine._permutation import Permutation
from pipeflow.engine._plan import Positions
from pipeflow.engine._stage import Stage, Traits
from pipeflow.resume.state import Form, Int, Record, Rule

__all__ = ["shuffle"]

T = TypeVar("T")


def shuffle(
    *, seed: int | None = None, buffer_size: int | None = None, generator: str = "numpy"
) -> Stage[T, T]:
    """Shuffle the items of every epoch, reproducibly from ``(seed, epoch)``.

    Without *buffer_size* the stage yields a random permutation of the whole (finite) epoch:
    put it right after an index source. Over ``indices(n)`` the loader computes the index at
    each position instead (the planning step, :mod:`pipeflow.engine._plan`), in constant memory (a
    ``shard`` after it computes only its share); over other items it reads the epoch first,
    then yields it in that order.
    With *buffer_size* it keeps at most that many items and yields a random one of them for
    every item read — the bounded-memory shuffle for streams; its randomness is local.

    Args:
        seed: the seed; ``None`` draws one when the stage is built and keeps it (it is in the
            repr), so a run can always be reproduced.
        buffer_size: bound on the items held, or ``None`` for a full permutation.
        generator: ``"numpy"`` (a keyed bijection computed per position, keyed through
            ``SeedSequence([seed, SHUFFLE, epoch])``: see :mod:`pipeflow.engine._permutation`; over
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
        return Stage(_permute_torch, "shuffle", config, length="same", resume=_SEEK, traits=_FULL)
    if buffer_size is None:
        config = {"seed": seed}
        return Stage(_permute, "shuffle", config, length="same", resume=_SEEK, traits=_FULL)
    buffer_size = _checks.optional_integer("shuffle", "buffer_size", buffer_size, low=1)
    config = {"seed": seed, "buffer_size": buffer_size}
    return Stage(_buffer_shuffle, "shuffle", config, length="same", resume=_BUFFER)


def _computed(upstream: Any, seed: int, generator: str = "numpy") -> Positions | None:
    """Over positions: the same positions, permuted from ``(seed, epoch)``."""
    if not isinstance(upstream, Positions):
        return None
    return upstream.shuffled(seed, generator)


#: A full shuffle starts anywhere in its epoch; over positions the planning step computes it
#: (see :mod:`pipeflow.engine._plan`).
_FULL = Traits(compute=_computed)


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


def _check_pass(stage: Stage[Any, Any], record: dict[str, Any], where: str, epoch: int) -> None:
    """Refuse a (checked) record from a pass of another epoch or seed than the pass the
    state resumes, epoch *epoch* of *stage* (its seeds as the state gives them): its buffer
    would be refilled with other inputs, and the rest of the epoch would repeat some items
    and lose others."""
    _same_pass(record, int(stage.config["seed"]), epoch, f"load_state_dict: {where}")


def replay(
    seed: int, size: int, epoch: int, made: int, read: int
) -> tuple[random.Random, list[int], bool]:
    """The buffer after *made* outputs from *read* inputs: the generator, the input number
    in each slot (in slot order; the rest of the drain, in order, once drained), and whether
    it drained (the input ended at *read*: *made* is past ``read - size``)."""
    rng = random.Random(derive(seed, BUFFER_SHUFFLE, epoch))
    nums = list(range(min(read, size)))
    steady = max(read - size, 0)
    randrange = rng.randrange
    for s in range(min(made, steady)):
        nums[randrange(size)] = size + s
    if made <= steady:
        return rng, nums, False
    rng.shuffle(nums)
    return rng, nums[made - steady :], True


class Buffer(Record):
    """A buffer shuffle's record of one pass: snapshots of its buffer (the input number in
    each slot) every *size* outputs, so :meth:`after` replays at most that many draws.

    A state holds ``{"inputs": n, "made": t, "read": r, "epoch": e, "seed": s}``: *t*
    outputs made from *r* inputs in the pass of epoch *e* with seed *s* (a record from
    another pass is refused at load), and *n*, the input the buffer's oldest item came
    from. A resumed pass replays the *t* draws from ``(seed, epoch)`` to know which input
    sits in which slot, reads the inputs from *n* to *r* again (the upstream restarts at
    *n*), keeps the ones in the buffer, and goes on: exactly the uninterrupted order, from
    positions only, re-reading the buffer's span (about ``size * ln(size)`` inputs) instead
    of the epoch."""

    __slots__ = ("epoch", "first", "saved", "seed", "size", "snaps")

    #: ``{"inputs": n, "made": t, "read": r, "epoch": e, "seed": s}``: *t* outputs made from
    #: *r* inputs (as many as consumed, or all there were), *n* at most *t* (every input
    #: before the buffer's oldest item went out); which pass it is from, *e* and *s*, is
    #: checked by :func:`_check_pass`.
    FORM = Form(
        {
            "inputs": Int(0),
            "made": Int(0, "consumed"),
            "read": Int(0, "total"),
            "epoch": Int(0),
            "seed": Int(0, 2**64 - 1),
        },
        (
            # a batch after it counts its last, short batch as full: past the end is the end
            (
                lambda v: (
                    v["consumed"] is None or v["made"] == v["consumed"] or v["made"] == v["read"]
                ),
                lambda v: (
                    f"{v['where']} made {v['made']} outputs, the position says {v['consumed']}"
                ),
            ),
            (
                lambda v: (
                    max(v["read"] - v["stage"].config["buffer_size"], 0) <= v["made"] <= v["read"]
                ),
                lambda v: (
                    f"{v['where']}: a buffer of {v['stage'].config['buffer_size']} can't make "
                    f"{v['made']} outputs from {v['read']} inputs"
                ),
            ),
            (
                lambda v: v["inputs"] <= v["made"],
                lambda v: (
                    f"{v['where']}['inputs'] must be at most {v['made']}, the outputs made "
                    f"(got {v['inputs']})"
                ),
            ),
        ),
    )

    @classmethod
    def begin(cls, stage: Any, context: Context, saved: dict[str, Any] | None) -> Buffer:
        c = stage.config
        return cls(c["buffer_size"], c["seed"], context.epoch, saved)

    def __init__(self, size: int, seed: int, epoch: int, saved: dict[str, Any] | None) -> None:
        self.size, self.seed, self.epoch, self.saved = size, seed, epoch, saved
        self.snaps: deque[tuple[int, int, Any, list[int], bool]] = deque(maxlen=8)
        self.first = dict(saved) if saved else _record([], 0, 0, seed, epoch)

    def snap(
        self, made: int, read: int, rng: random.Random, nums: list[int], drained: bool
    ) -> None:
        """The buffer after *made* outputs from *read* inputs."""
        self.snaps.append((made, read, rng.getstate(), list(nums), drained))

    def after(self, consumed: int) -> dict[str, Any]:
        """The record once the consumer took *consumed* outputs of the epoch."""
        best = None
        for snap in self.snaps:  # the latest one at or before *consumed*
            if snap[0] <= consumed:
                best = snap
        if best is None and consumed == self.first["made"]:  # the pass has made nothing
            return dict(self.first)
        if best is None:  # older than the snapshots kept: replay from the epoch's start
            read = consumed + self.size
            _, nums, _ = replay(self.seed, self.size, self.epoch, consumed, read)
            return _record(nums, consumed, read, self.seed, self.epoch)
        made, read, state, nums, drained = best
        if drained:  # the drain's order is known: what the consumer had not taken
            # (a batch after it counts its last, short batch as full: past the end is the end)
            consumed = min(consumed, made + len(nums))
            return _record(nums[consumed - made :], consumed, read, self.seed, self.epoch)
        nums = list(nums)
        rng = random.Random()
        rng.setstate(state)
        for _ in range(consumed - made):  # (a drain comes after the last steady snapshot)
            while len(nums) < self.size:  # filling: reads without a draw
                nums.append(read)
                read += 1
            nums[rng.randrange(self.size)] = read
            read += 1
        return _record(nums, consumed, read, self.seed, self.epoch)


#: A full shuffle seeks: the permutation starts at output *k*.
_SEEK = Rule.seek()
#: A buffer shuffle: resumed exactly by a deterministic refill (see :class:`Buffer`).
_BUFFER = Rule.recorded(Buffer, check_pass=_check_pass)


def _record(nums: list[int], made: int, read: int, seed: int, epoch: int) -> dict[str, Any]:
    inputs = min(nums, default=read)
    return {"inputs": inputs, "made": made, "read": read, "epoch": epoch, "seed": int(seed)}


def _buffer_shuffle(
    items: Iterable[T], seed: int, buffer_size: int, *, context: Context, record: Buffer | None
) -> Iterator[T]:
    saved = None if record is None else record.saved
    size = buffer_size
    if saved:  # resumed: refill the buffer from the inputs since its oldest item
        _same_pass(saved, seed, context.epoch, "shuffle: the state's record")
        made, read = saved["made"], saved["read"]
        rng, nums, drained = replay(seed, size, context.epoch, made, read)
        if min(nums, default=read) != context.offset:
            msg = (
                f"shuffle: the state's record says the buffer's oldest item is input "
                f"{context.offset}, but {made} outputs from {read} inputs in epoch "
                f"{context.epoch} leave input {min(nums, default=read)}: the record is not this "
                "stage's"
            )
            raise ValueError(msg)
        it = iter(items)
        slot = {x: i for i, x in enumerate(nums)}
        buf: list[Any] = [None] * len(nums)
        for n in range(context.offset, read):
            item = next(it)
            if n in slot:
                buf[slot[n]] = item
    else:
        rng = random.Random(derive(seed, BUFFER_SHUFFLE, context.epoch))
        it, made, read, drained, buf, nums = iter(items), 0, 0, False, [], []
    if not drained:
        yield from _steady(it, rng, buf, nums, made, read, size, record)
    else:
        yield from buf


def _same_pass(saved: dict[str, Any], seed: int, epoch: int, where: str) -> None:
    """Refuse the record of another pass than epoch *epoch* with *seed*, naming it *where*:
    at load (:func:`_check_pass`), and again as a resumed pass starts, for a loader nested in
    another's record (a mix's, a worker's replica's), which a load checks only in its form."""
    if (saved["epoch"], saved["seed"]) != (epoch, int(seed)):
        msg = (
            f"{where} is the buffer of a pass of epoch {saved['epoch']} with seed "
            f"{saved['seed']}, but the state resumes epoch {epoch} with seed {int(seed)}: the "
            "record is from another state; take the state again"
        )
        raise ValueError(msg)


def _steady(
    it: Iterator[T],
    rng: random.Random,
    buf: list[Any],
    nums: list[int],
    made: int,
    read: int,
    size: int,
    record: Buffer | None,
) -> Iterator[T]:
    randrange = rng.randrange
    if record is not None:
        record.snap(made, read, rng, nums, False)
    for item in it:
        if len(buf) < size:
            buf.append(item)
            nums.append(read)
            read += 1
            continue
        j = randrange(size)
        out, buf[j] = buf[j], item
        nums[j] = read
        read += 1
        made += 1
        if record is not None and made % size == 0:
            record.snap(made, read, rng, nums, False)
        yield out
    order = list(range(len(buf)))
    rng.shuffle(order)
    if record is not None:
        record.snap(made, read, rng, [nums[i] for i in order], True)
    for i in order:
        yield buf[i]
