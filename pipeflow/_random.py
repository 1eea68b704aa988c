"""Seeds: every random choice comes from one derivation of an explicit seed and its keys.

Every random stream pipeflow makes is keyed by ``(seed, stream, epoch, ...)`` through numpy's
``SeedSequence`` over the words ``[seed % 2**32, seed >> 32, stream, epoch, ...]``
(:func:`seed_words`). *stream* says what the draws are for — :data:`SHUFFLE` (a full
shuffle's order), :data:`BUFFER_SHUFFLE`, :data:`WORKERS` (the workers' base seed),
:data:`ITEM` (one item's generator, then its position), :data:`TOKEN_BATCH` and
:data:`BUCKET` (the order of the batches the sequence stages make), :data:`SHARDS` (the order
of an epoch's shards) and :data:`MIX` (which source a mix draws from) — so that two stages
given the same seed never share draws (``SeedSequence`` pads short inputs with zeros: without
the word, ``(seed, epoch)`` and ``(seed, epoch, 0)`` would be one stream). numpy generators are
``PCG64(SeedSequence(words))`` (:func:`numpy_rng`); every other generator (Python's
``random.Random``, a ``torch.Generator``, the workers' base seed) is seeded with the 64-bit
integer made of the first two words of that sequence's state (:func:`derive`). The words are
computed in pure Python, so a fresh worker need not import ``numpy.random``. pipeflow keeps
this derivation stable across its releases: a change would be announced as breaking.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, SupportsIndex

if TYPE_CHECKING:
    import numpy as np


__all__ = [
    "BUCKET",
    "BUFFER_SHUFFLE",
    "ITEM",
    "MIX",
    "SHARDS",
    "SHUFFLE",
    "TOKEN_BATCH",
    "WORKERS",
    "DrawnSeed",
    "check_seed",
    "derive",
    "fresh_seed",
    "numpy_rng",
    "seed_sequence_state",
    "seed_words",
]

_MAX_SEED = 2**64 - 1

#: What a stream is for: the first key of every stream (see the module's text).
SHUFFLE, BUFFER_SHUFFLE, WORKERS, ITEM = 1, 2, 3, 4
#: ``batch(max_tokens=..., window=...)``: the order of a window's batches, keyed by
#: ``(epoch, the window's first input)``.
TOKEN_BATCH = 5
#: ``bucket``: the order within each bucket and of the batches (keyed by the epoch, and by the
#: window's first input when it reads windows).
BUCKET = 6
#: ``shards``: the order of an epoch's shards, keyed by the epoch.
SHARDS = 7
#: ``mix``: which source gives the item at each position, keyed by the epoch (and the position).
MIX = 8


class DrawnSeed(int):
    """A seed pipeflow drew because none was given: an ``int`` whose repr says so.

    A stage's repr then reads ``seed=None, drawn 1234...``: the run can be reproduced with
    ``seed=1234...``, and a loader built with seeds prints the same text on every run.

    Examples:
        >>> DrawnSeed(42)
        None, drawn 42
        >>> DrawnSeed(42) == 42, DrawnSeed(42) + 1
        (True, 43)
    """

    __slots__ = ()

    def __repr__(self) -> str:
        return f"None, drawn {int(self)}"

    __str__ = __repr__

    def __format__(self, spec: str) -> str:
        return repr(self) if not spec else int(self).__format__(spec)

    def __reduce__(self) -> tuple[object, ...]:
        return (DrawnSeed, (int(self),))


def fresh_seed() -> DrawnSeed:
    """A new random seed, drawn once when a stage is built so that its repr reproduces it."""
    return DrawnSeed(int.from_bytes(os.urandom(8), "big") >> 1)  # secrets.randbits(63)


def check_seed(stage: str, seed: object) -> int:
    """Validate a user seed: a non-negative integer below 2**64."""
    if isinstance(seed, bool) or not isinstance(seed, SupportsIndex):
        msg = f"{stage}: seed must be an integer or None (got {seed!r})"
        raise TypeError(msg)
    try:  # a float or many-element tensor, an array: they have __index__, and refuse it
        value = seed.__index__()
    except Exception as e:
        msg = f"{stage}: seed must be an integer or None (got {type(seed).__name__}: {e})"
        raise TypeError(msg) from None
    if not 0 <= value <= _MAX_SEED:
        msg = f"{stage}: seed must be between 0 and 2**64 - 1 (got {seed!r})"
        raise ValueError(msg)
    return value


def seed_words(seed: int, *keys: int) -> list[int]:
    """The entropy words for (seed, *keys): the stable key of every random stream we make."""
    return [seed & 0xFFFFFFFF, seed >> 32, *keys]


def derive(seed: int, *keys: int) -> int:
    """The 64-bit seed of the stream keyed by *seed* and *keys*.

    Examples:
        >>> derive(0, 1) == derive(0, 1) != derive(0, 2)
        True
        >>> 0 <= derive(2**64 - 1, 7) < 2**64
        True
    """
    lo, hi = seed_sequence_state(seed_words(seed, *keys), 2)
    return lo | (hi << 32)


def numpy_rng(seed: int, *keys: int) -> np.random.Generator:
    """A numpy ``Generator`` determined by *seed* and *keys* (epoch, sample index, ...).

    Examples:
        >>> a = numpy_rng(42, 0).integers(1000, size=3)
        >>> b = numpy_rng(42, 0).integers(1000, size=3)
        >>> bool((a == b).all()), bool((a == numpy_rng(42, 1).integers(1000, size=3)).all())
        (True, False)
    """
    import numpy as np

    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(seed_words(seed, *keys))))


# -- numpy's SeedSequence, in pure Python -------------------------------------------------------
# The state words numpy's SeedSequence(entropy).generate_state(n) gives (O'Neill's seed_seq
# hash), without importing numpy.random, whose first use costs a fresh worker ~15 ms. torch
# seeds each worker's numpy with SeedSequence([worker_id, base_seed]).generate_state(4).
_MASK = 0xFFFFFFFF
_INIT_A, _MULT_A = 0x43B0D7E5, 0x931E8875
_INIT_B, _MULT_B = 0x8B51F9DD, 0x58F38DED
_MIX_L, _MIX_R = 0xCA01F9DD, 0x4973F715


def _words(value: int) -> list[int]:
    out = [value & _MASK]
    value >>= 32
    while value:
        out.append(value & _MASK)
        value >>= 32
    return out


def seed_sequence_state(entropy: list[int], n_words: int = 4) -> list[int]:
    """``numpy.random.SeedSequence(entropy).generate_state(n_words)``, computed in Python.

    Examples:
        >>> import numpy as np
        >>> seed_sequence_state([1, 2**40 + 3]) == np.random.SeedSequence(
        ...     [1, 2**40 + 3]).generate_state(4).tolist()
        True
    """
    data = [w for v in entropy for w in _words(v)]
    const = _INIT_A

    def hashmix(value: int) -> int:
        nonlocal const
        value ^= const
        const = (const * _MULT_A) & _MASK
        value = (value * const) & _MASK
        return value ^ (value >> 16)

    def mix(x: int, y: int) -> int:
        r = (x * _MIX_L - y * _MIX_R) & _MASK
        return r ^ (r >> 16)

    pool = [hashmix(data[i] if i < len(data) else 0) for i in range(4)]
    for src in range(4):
        for dst in range(4):
            if src != dst:
                pool[dst] = mix(pool[dst], hashmix(pool[src]))
    for src in range(4, len(data)):
        for dst in range(4):
            pool[dst] = mix(pool[dst], hashmix(data[src]))
    out = []
    const_b = _INIT_B
    for i in range(n_words):
        value = pool[i % 4] ^ const_b
        const_b = (const_b * _MULT_B) & _MASK
        value = (value * const_b) & _MASK
        out.append(value ^ (value >> 16))
    return out
