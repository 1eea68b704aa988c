"""Timing helpers: interleaved repetitions, medians, and the table every benchmark prints."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Row:
    """One workload's result: pipeflow's and torch's medians, and their ratio."""

    workload: str
    unit: str
    pipeflow: float
    torch: float
    target: str = ""
    note: str = ""
    higher_is_better: bool = True
    samples: dict[str, list[float]] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """pipeflow / torch (higher is better for rates; lower for times and memory)."""
        return self.pipeflow / self.torch if self.torch else float("nan")


def count(batch: Any) -> int:
    """How many samples a batch holds (the length of its first tensor)."""
    while isinstance(batch, (list, tuple, dict)):
        batch = next(iter(batch.values())) if isinstance(batch, dict) else batch[0]
    return len(batch)


def epoch_rate(loader: Iterable[Any], nbytes: int = 0) -> tuple[float, float]:
    """Samples per second (and MB/s when *nbytes* per sample is given) over one epoch."""
    start = time.perf_counter()
    n = 0
    for batch in loader:
        n += count(batch)
    elapsed = time.perf_counter() - start
    return n / elapsed, n * nbytes / elapsed / 1e6


def compare(
    make: dict[str, Callable[[], Any]],
    reps: int,
    *,
    warmup: int = 1,
    nbytes: int = 0,
) -> dict[str, list[float]]:
    """Time each loader *reps* times, alternating which goes first; return every rate.

    Each ``make[name]()`` builds a loader once; its epochs are the repetitions (so persistent
    workers stay warm, as in training).
    """
    loaders = {name: fn() for name, fn in make.items()}
    rates: dict[str, list[float]] = {name: [] for name in loaders}
    for _ in range(warmup):
        for loader in loaders.values():
            epoch_rate(loader)
    names = list(loaders)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else reversed(names):
            sps, mbs = epoch_rate(loaders[name], nbytes)
            rates[name].append(mbs if nbytes else sps)
    for loader in loaders.values():
        close = getattr(loader, "close", None) or getattr(
            getattr(loader, "pipeline", lambda: None)(), "close", None
        )
        if close is not None:
            close()
    return rates


def median(xs: list[float]) -> float:
    return statistics.median(xs) if xs else float("nan")


def table(rows: list[Row]) -> str:
    """A plain-text table: medians, ratio, target."""
    head = f"{'workload':<44} {'unit':<10} {'pipeflow':>12} {'torch':>12} {'ratio':>7}  target"
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.workload:<44} {r.unit:<10} {fmt(r.pipeflow):>12} {fmt(r.torch):>12} "
            f"{r.ratio:>6.2f}x  {r.target}"
        )
        if r.note:
            lines.append(f"{'':<44} {r.note}")
    return "\n".join(lines)


def fmt(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3f}"
