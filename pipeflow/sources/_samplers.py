"""What a sampler is, in words: torch's samplers by their settings, others by class and size.

A state names its pipeline's source, and for ``from_sampler`` that is the sampler: torch's own
are described by what decides the indices they give (``RandomSampler(n=20, replacement=False,
num_samples=20)``), so that a state taken over 20 samples is refused by a loader over 21, and
a shuffled one by one in order. torch is not imported: the samplers are recognised by their
class and read by attribute.

Examples:
    >>> describe_sampler([3, 1, 2])
    '[3, 1, 2] (n=3)'
    >>> import torch.utils.data as tud
    >>> describe_sampler(tud.BatchSampler(tud.SequentialSampler(range(10)), 4, False))
    'BatchSampler(sampler=SequentialSampler(n=10), batch_size=4, drop_last=False)'
"""

from __future__ import annotations

from collections.abc import Sized
from typing import Any

__all__ = ["describe_sampler"]

#: torch's samplers, by class name: the attributes that decide the indices they give.
_TORCH = {
    "SequentialSampler": (),
    "RandomSampler": ("replacement", "num_samples", "generator"),
    "SubsetRandomSampler": ("generator",),
    "WeightedRandomSampler": ("num_samples", "replacement", "generator"),
    "BatchSampler": ("sampler", "batch_size", "drop_last"),
    "DistributedSampler": ("num_replicas", "rank", "shuffle", "seed", "drop_last"),
}


def _size(obj: Any) -> str | None:
    try:
        return str(len(obj)) if isinstance(obj, Sized) else None
    except Exception:  # a __len__ that raises: no size
        return None


def _value(key: str, value: Any) -> str:
    if key == "sampler":
        return describe_sampler(value)
    if key == "generator":  # its own generator: whether there is one (its state is saved)
        return "None" if value is None else "given"
    return repr(value)


def describe_sampler(sampler: Any) -> str:
    """*sampler* as a state's identity shows it (see the module's text)."""
    kind = type(sampler)
    name = kind.__qualname__
    if kind.__module__.startswith("torch.utils.data") and name in _TORCH:
        parts = []
        if name not in ("BatchSampler",):
            data = getattr(sampler, "data_source", getattr(sampler, "dataset", None))
            n = _size(data) if data is not None else _size(getattr(sampler, "indices", ()))
            parts.append(f"n={n}")
        parts += [f"{k}={_value(k, getattr(sampler, k, None))}" for k in _TORCH[name]]
        return f"{name}({', '.join(parts)})"
    from pipeflow.engine._stage import _short

    size = _size(sampler)
    return _short(sampler) + (f" (n={size})" if size is not None else "")
