"""Seeds: every random choice comes from an explicit seed folded with the epoch (and index)."""

from __future__ import annotations

import secrets
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


__all__ = ["check_seed", "fresh_seed", "numpy_rng", "seed_words"]

_MAX_SEED = 2**64 - 1


def fresh_seed() -> int:
    """A new random seed, drawn once when a stage is built so that its repr reproduces it."""
    return secrets.randbits(63)


def check_seed(stage: str, seed: object) -> int:
    """Validate a user seed: a non-negative integer below 2**64."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):
        msg = f"{stage}: seed must be an integer or None (got {seed!r})"
        raise TypeError(msg)
    seed = seed.__index__()  # type: ignore[attr-defined]
    if not 0 <= seed <= _MAX_SEED:
        msg = f"{stage}: seed must be between 0 and 2**64 - 1 (got {seed!r})"
        raise ValueError(msg)
    return seed


def seed_words(seed: int, *keys: int) -> list[int]:
    """The entropy words for (seed, *keys): the stable key of every random stream we make."""
    return [seed & 0xFFFFFFFF, seed >> 32, *keys]


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
