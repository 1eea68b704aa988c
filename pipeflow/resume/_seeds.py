"""The seeds of a pipeline: found in order, and replaced, so that a state can carry them.

Every random choice in a pipeline comes from a seed in some stage's configuration (a
``shuffle``'s, a ``random_map``'s, a parallel stage's workers' seed), nested or not (a stage
inside ``parallel_map``, a loader inside ``parallel_source``). A seed the user gave is part of
what the pipeline *is*; a seed pipeflow drew because none was given
(:class:`~pipeflow._random.DrawnSeed`) is not: a freshly built loader of the same code draws
another. So a state lists every seed (:func:`slots`), a loader that loads it adopts the drawn
ones (:func:`replaced`), and its identity is compared with every seed masked (:data:`MASK`).

The walk is generic over configuration values: a value under the key ``"seed"`` is a seed;
a :class:`Seeded` object (a stage, a loader, a source, a parallel stage's settings) is
walked into through its ``seed_slots()`` / ``with_seeds()``; anything else is left alone.

Examples:
    >>> import pipeflow as pf
    >>> loader = pf.indices(4) | pf.shuffle(seed=3) | pf.random_map(lambda x, rng: x, seed=5)
    >>> [(name, int(seed)) for name, seed in slots(loader.stages)]
    [('shuffle', 3), ('random_map', 5)]
    >>> [repr(s) for s in replaced(loader.stages, iter([7, 8]))][0]
    'shuffle(seed=7)'
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any

__all__ = [
    "MASK",
    "WORKERS_SLOT",
    "Seeded",
    "Slot",
    "config_slots",
    "config_with_seeds",
    "is_workers",
    "replaced",
    "slots",
]

#: ``(owner's name, seed)``: one seed of a pipeline, in the order of :func:`slots`.
Slot = tuple[str, int]


class Seeded:
    """What may hold seeds (a stage, a source, a loader, a parallel stage's settings): it
    lists them, and makes a copy of itself with others. None, by default."""

    __slots__ = ()

    def seed_slots(self) -> list[Slot]:
        """Every seed it holds, nested ones included, in order."""
        return []

    def with_seeds(self, seeds: Iterator[int]) -> Any:
        """Itself with its seeds taken in order from *seeds* (as :meth:`seed_slots` lists
        them); itself when none changes."""
        return self


#: The end of the name of a parallel stage's workers' seed (``"parallel_map workers"``): it seeds
#: the workers' global generators, so it is adopted where the state has one for the same
#: stage, but a pipeline with or without workers (or with its parallel stage in line) is the
#: same pipeline, so it is not part of what must match.
WORKERS_SLOT = " workers"


def is_workers(owner: str) -> bool:
    """Whether a slot named *owner* is a parallel stage's workers' seed."""
    return owner.endswith(WORKERS_SLOT)


class _Masked(int):
    """The seed shown in a pipeline's identity: every seed compares as this one."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<seed>"

    __str__ = __repr__


#: What stands for every seed when identities are compared (seeds are compared apart).
MASK = _Masked(0)


def _is_seed(key: str, value: Any) -> bool:
    return key == "seed" and isinstance(value, int) and not isinstance(value, bool)


def config_slots(owner: str, config: Mapping[str, Any]) -> list[Slot]:
    """The seeds in a stage's *config*, in order (nested stages and loaders walked into)."""
    out: list[Slot] = []
    for key, value in config.items():
        if _is_seed(key, value):
            out.append((owner, value))
        elif isinstance(value, Seeded):  # a parallel stage's settings: its workers' seed
            out.extend(
                (owner + WORKERS_SLOT if name == WORKERS_SLOT else name, seed)
                for name, seed in value.seed_slots()
            )
    return out


def config_with_seeds(config: Mapping[str, Any], seeds: Iterator[int]) -> dict[str, Any]:
    """*config* with its seeds taken in order from *seeds* (as :func:`config_slots` lists)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        if _is_seed(key, value):
            out[key] = next(seeds)
        elif isinstance(value, Seeded):
            out[key] = value.with_seeds(seeds)
        else:
            out[key] = value
    return out


def slots(parts: Sequence[Any]) -> list[Slot]:
    """Every seed of *parts* (a source and stages, or stages), in order."""
    return [slot for part in parts for slot in part.seed_slots()]


def replaced(parts: Sequence[Any], seeds: Iterator[int]) -> list[Any]:
    """*parts* with their seeds taken in order from *seeds*."""
    return [part.with_seeds(seeds) for part in parts]
