"""A seeded permutation of ``range(n)`` computed per position, in constant memory.

``Permutation(n, seed, epoch)`` is a bijection of ``[0, n)``: ``permute(p)`` tells which index
comes at position ``p`` of the epoch, for any positions, in O(1) each, without drawing the
other ``n - 1``. So a shuffled epoch of a billion samples starts at once, a rank computes only
its own positions, and a resumed pass jumps to its position.

The algorithm, a Feistel network on mixed radix:

- Let ``b`` be the number of bits of ``n - 1`` (at least 2), ``m = 2**(b // 2)`` and
  ``c = ceil(n / m)``. A position ``x`` is the pair ``(hi, lo) = divmod(x, m)``, a point of
  ``[0, c) x [0, m)``, a domain of ``c * m`` positions: at least ``n``, fewer than ``n + m``.
- ``rounds(b)`` rounds update one half from the other, in turn: ``lo = (lo + G(hi)) % m``
  (``G``: the top ``b // 2`` bits of a keyed hash), then ``hi = (hi + H(lo)) % c`` (``H``: a
  keyed hash scaled to ``[0, c)``). Each round is undone by subtracting, so the whole is a
  bijection of ``[0, c * m)``. Adding rather than XOR-ing matters: an XOR round is always an
  even permutation, so a network of them never draws half of all orders (the odd ones).
- A result ``>= n`` (a chance below ``m / n``, about ``1 / sqrt(n)``) is encrypted again until
  it falls in range (cycle walking): that keeps a bijection of ``[0, n)``.
- The keyed hash is ``t = (v ^ k) * C1; t ^= t >> W/2; t *= C2`` on ``W``-bit words
  (``W`` = 32 when ``b <= 32``, else 64), of which the top bits are kept (a multiplication
  carries every input bit up): ``G`` takes its top ``b // 2`` bits, ``H`` takes
  ``(t * c) >> W`` (computed on 64 bits: the top 32 bits of ``t`` when ``W`` = 64).

All of it is numpy arithmetic on whole blocks of positions, a few nanoseconds each.

Rounds: 8 (each half updated four times), or 12 when ``b <= 10`` (``n <= 1024``): a round
function of a few bits takes more rounds to mix (with 8, ``n = 5`` shows a 6 % bias over
20,000 seeds; with 12 none), and small epochs cost nothing anyway.

Keys: the round keys are the ``W``-bit words
``numpy.random.SeedSequence(seed_words(seed, SHUFFLE, epoch)).generate_state(rounds, uint32
or uint64)``, the one derivation of every random stream of pipeflow (:mod:`pipeflow._random`;
:func:`round_keys` computes them in Python, as numpy would). They do not depend on ``n``
(a small domain uses the first 12 words of that sequence, a larger one the first 8).

Stability: the rounds, the constants, the split and the key derivation are fixed; the orders
they give are pinned by golden tests (``tests/test_permutation.py``). Changing any of them
changes every shuffled epoch and would be announced as a breaking change.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import chain
from typing import Any

import numpy as np
import numpy.typing as npt

from pipeflow._random import SHUFFLE, seed_sequence_state, seed_words

__all__ = ["ROUNDS", "SMALL_ROUNDS", "Permutation", "round_keys", "rounds"]

#: Feistel rounds (half-updates): each half is updated four times.
ROUNDS = 8
#: Feistel rounds for a domain of at most ``SMALL_BITS`` bits (``n <= 1024``).
SMALL_ROUNDS, SMALL_BITS = 12, 10
# Odd multipliers with well-spread bits: those of Wellons' lowbias32 and of SplitMix64.
_WORDS: dict[int, tuple[type[np.unsignedinteger[Any]], int, int]] = {
    32: (np.uint32, 0x7FEB352D, 0x846CA68B),
    64: (np.uint64, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB),
}
_FIRST_BLOCK = 1 << 10  # the first block is small, so the first index comes at once
_BLOCK = 1 << 16  # then blocks of this many positions
_SCALAR = 32  # this many positions or fewer go through Python integers, not numpy
_SHIFT32 = np.uint64(32)

Array = npt.NDArray[Any]


def rounds(bits: int) -> int:
    """How many rounds a domain of *bits* bits gets."""
    return SMALL_ROUNDS if bits <= SMALL_BITS else ROUNDS


def round_keys(seed: int, epoch: int, word: int, count: int = ROUNDS) -> list[int]:
    """The *count* round keys of *word* bits for ``(seed, epoch)``.

    ``SeedSequence(seed_words(seed, SHUFFLE, epoch)).generate_state(count, uint32 or
    uint64)``, computed in Python (numpy.random's first use would cost milliseconds).

    Examples:
        >>> import numpy as np
        >>> sequence = np.random.SeedSequence(seed_words(7, SHUFFLE, 3))
        >>> round_keys(7, 3, 64) == sequence.generate_state(ROUNDS, np.uint64).tolist()
        True
    """
    state = seed_sequence_state(seed_words(seed, SHUFFLE, epoch), count * word // 32)
    if word == 32:
        return state
    return [state[i] | state[i + 1] << 32 for i in range(0, len(state), 2)]


class Permutation:
    """The permutation of ``range(n)`` for ``(seed, epoch)``.

    Examples:
        >>> p = Permutation(10, seed=42, epoch=0)
        >>> order = list(p.stream())
        >>> sorted(order) == list(range(10))
        True
        >>> p.permute([0, 1, 2]).tolist() == order[:3]
        True
        >>> list(p.stream(start=1, step=3)) == order[1::3]
        True
    """

    __slots__ = (
        "_c",
        "_const",
        "_dtype",
        "_keys",
        "_lo_bits",
        "_lo_mask",
        "_scalars",
        "_word",
        "epoch",
        "n",
        "seed",
    )

    def __init__(self, n: int, seed: int, epoch: int = 0) -> None:
        if not (0 <= n <= 2**63 and 0 <= seed < 2**64 and epoch >= 0):
            msg = f"need 0 <= n <= 2**63, 0 <= seed < 2**64, epoch >= 0 (got {n}, {seed}, {epoch})"
            raise ValueError(msg)
        self.n = n
        self.seed = seed
        self.epoch = epoch
        bits = max((n - 1).bit_length(), 2)
        self._word = 32 if bits <= 32 else 64
        dtype, c1, c2 = _WORDS[self._word]
        self._dtype = dtype
        self._const = (dtype(c1), dtype(c2), dtype(self._word // 2))
        lo_bits = bits // 2
        self._lo_bits = dtype(lo_bits)
        self._lo_mask = dtype((1 << lo_bits) - 1)
        self._c = -(-n // (1 << lo_bits))
        words = round_keys(seed, epoch, self._word, rounds(bits))
        self._keys = [dtype(k) for k in words]
        self._scalars = (self._word, c1, c2, lo_bits, words)

    def __repr__(self) -> str:
        return f"Permutation(n={self.n}, seed={self.seed}, epoch={self.epoch})"

    def __len__(self) -> int:
        return self.n

    def permute(self, positions: npt.ArrayLike) -> npt.NDArray[np.int64]:
        """The indices at *positions* (each in ``[0, n)``), as a new ``int64`` array.

        Raises:
            TypeError: if *positions* are not integers.
            IndexError: if a position is out of range.
        """
        a = np.asarray(positions)
        if a.dtype.kind not in "iu":
            msg = f"positions must be integers (got an array of {a.dtype})"
            raise TypeError(msg)
        if a.size and ((a.dtype.kind == "i" and a.min() < 0) or int(a.max()) >= self.n):
            msg = f"positions must lie in [0, {self.n})"
            raise IndexError(msg)
        return self._permute(a.reshape(-1).astype(self._dtype)).astype(np.int64)

    def _permute(self, x: Array) -> Array:
        """:meth:`permute` of in-range positions of the word's dtype."""
        if self.n <= 1:
            return x
        if x.size <= _SCALAR:
            return np.array([self.index(v) for v in x.tolist()], self._dtype)
        last = self._dtype(self.n - 1)
        x = self._encrypt(x)
        walk = np.flatnonzero(x > last)
        while walk.size > _SCALAR:  # cycle walking: encrypt what fell outside [0, n) again
            y = self._encrypt(x[walk])
            x[walk] = y
            walk = walk[y > last]
        for i in walk.tolist():  # the last few, in Python, where numpy's calls cost more
            x[i] = self.index(int(x[i]))
        return x

    def index(self, position: int) -> int:
        """The index at one *position*, in Python integers (the same network, one at a time).

        It also walks on from a result in ``[n, c * m)``, as the cycle walking does.
        """
        word, c1, c2, lo_bits, keys = self._scalars
        full, half, lo_mask, c = (1 << word) - 1, word // 2, (1 << lo_bits) - 1, self._c
        x = position
        while True:
            hi, lo = x >> lo_bits, x & lo_mask
            for i, key in enumerate(keys):
                t = ((hi if i % 2 == 0 else lo) ^ key) * c1 & full
                t = (t ^ (t >> half)) * c2 & full
                if i % 2 == 0:
                    lo = (lo + (t >> (word - lo_bits))) & lo_mask
                else:
                    hi += ((t >> (word - 32)) * c) >> 32
                    hi = hi - c if hi >= c else hi
            x = hi << lo_bits | lo
            if x < self.n:
                return x

    def _encrypt(self, x: Array) -> Array:
        """One pass of the network over ``[0, c * m)`` (*x* is left as it is)."""
        c1, c2, half = self._const
        lo_bits = self._lo_bits
        lo: Array = x & self._lo_mask
        hi: Array = x >> lo_bits
        t, u = np.empty_like(x), np.empty_like(x)
        wide = t if self._word == 64 else np.empty(x.shape, np.uint64)
        c = self._dtype(self._c)
        top = self._dtype(self._word) - lo_bits
        for i, key in enumerate(self._keys):
            np.bitwise_xor(hi if i % 2 == 0 else lo, key, out=t)
            np.multiply(t, c1, out=t)
            np.right_shift(t, half, out=u)
            t ^= u
            np.multiply(t, c2, out=t)
            if i % 2 == 0:  # lo = (lo + G(hi)) % m, G(hi): the top bits of the hash
                t >>= top
                lo += t
                lo &= self._lo_mask
                continue
            if self._word == 64:  # hi = (hi + H(lo)) % c, H(lo) = (hash * c) >> W
                t >>= _SHIFT32
            np.multiply(t, np.uint64(self._c), out=wide)
            wide >>= _SHIFT32
            np.add(hi, wide, out=hi, casting="unsafe")
            np.subtract(hi, c, out=u)  # wraps around below c: the minimum is hi % c
            np.minimum(hi, u, out=hi)
        hi <<= lo_bits
        hi |= lo
        return hi

    def blocks(
        self, start: int = 0, stop: int | None = None, step: int = 1
    ) -> Iterator[npt.NDArray[np.int64]]:
        """The indices at positions ``start, start + step, ...`` below *stop*, in blocks.

        *stop* defaults to ``n``; positions from ``n`` on wrap around to the epoch's start
        (``p % n``), as padding the shares of ranks does. Blocks hold up to 65536 indices;
        when there are more, the first ones are small (1024, then 4x more each), so the first
        index comes in microseconds.

        Raises:
            ValueError: if *start* < 0 or *step* < 1, or positions wrap around an empty range.
        """
        if start < 0 or step < 1:
            msg = f"need start >= 0 and step >= 1 (got start={start}, step={step})"
            raise ValueError(msg)
        stop = self.n if stop is None else stop
        if stop > self.n == 0 and start < stop:
            msg = "positions past the end can't wrap around an empty permutation"
            raise ValueError(msg)
        return self._blocks(start, stop, step)

    def _blocks(self, start: int, stop: int, step: int) -> Iterator[npt.NDArray[np.int64]]:
        # Small first blocks bring the first indices at once (growing 4x up to _BLOCK); an
        # order that fits in one block is computed in one go (fewer numpy calls).
        size = _BLOCK if -(-(stop - start) // step) <= _BLOCK else _FIRST_BLOCK
        dtype = np.uint64 if stop > 2**32 else self._dtype
        while start < stop:
            count = min(size, -(-(stop - start) // step))
            end = start + count * step
            positions = np.arange(start, end, step, dtype=dtype)
            if end > self.n:
                positions %= dtype(self.n)
            yield self._permute(positions.astype(self._dtype, copy=False)).astype(np.int64)
            start, size = end, min(4 * size, _BLOCK)  # 1024, 4096, 16384, 65536, ...

    def stream(self, start: int = 0, stop: int | None = None, step: int = 1) -> Iterator[int]:
        """The indices of :meth:`blocks`, one Python ``int`` at a time.

        Each block becomes a list once, and the lists are chained in C: streaming costs a few
        nanoseconds per index on top of computing it.
        """
        return chain.from_iterable(map(_tolist, self.blocks(start, stop, step)))


def _tolist(block: npt.NDArray[np.int64]) -> list[int]:
    return block.tolist()  # type: ignore[no-any-return]
