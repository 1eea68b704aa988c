"""Timing helpers: interleaved repetitions, medians, and the table every benchmark prints."""

from __future__ import annotations

import argparse
import math
import re
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
    #: Whether the goal was met, for a goal that :func:`goal_met` can't read from ``target``.
    met: bool | None = None

    @property
    def ratio(self) -> float:
        """pipeflow / torch (higher is better for rates; lower for times and memory)."""
        return self.pipeflow / self.torch if self.torch else float("nan")


_GOAL = re.compile(r"(?P<who>pipeflow\s+)?(?P<op>>=|<=|<|>)\s*(?P<num>[\d.]+)\s*(?P<unit>x|%)?")
_OPS: dict[str, Callable[[float, float], bool]] = {
    ">=": lambda a, b: a >= b,
    "<=": lambda a, b: a <= b,
    ">": lambda a, b: a > b,
    "<": lambda a, b: a < b,
}


def goal_met(row: Row) -> bool | None:
    """Whether *row* met its goal: ``row.met`` if set, else read from ``row.target``.

    ``">= 3x"`` and ``"<= 0.5x"`` compare the ratio; ``"pipeflow < 0.05"`` compares pipeflow's
    own value. ``None``: no goal, a goal in another form, or no ratio (torch measured 0).

    Examples:
        >>> goal_met(Row("w", "samples/s", 34.3, 10.0, ">= 10x"))  # 3.43x
        False
        >>> goal_met(Row("w", "seconds", 0.4, 1.0, "<= 0.5x", higher_is_better=False))
        True
        >>> goal_met(Row("w", "fraction", 0.01, 0.5, "pipeflow < 0.05"))
        True
        >>> goal_met(Row("w", "samples/s", 1.0, 1.0, "overhead < 5%")) is None
        True
    """
    if row.met is not None:
        return row.met
    m = _GOAL.fullmatch(row.target.strip())
    if m is None:
        return None
    limit = float(m["num"]) / (100 if m["unit"] == "%" else 1)
    if m["who"]:
        value = row.pipeflow
    elif m["unit"] == "x":
        value = row.ratio
    else:
        return None
    if math.isnan(value):
        return None
    return _OPS[m["op"]](value, limit)


def mark(row: Row) -> str:
    """``"met"``, ``"NOT MET"``, or ``"?"`` (not checked) for *row*'s goal; ``""`` if none."""
    if not row.target:
        return ""
    return {True: "met", False: "NOT MET", None: "?"}[goal_met(row)]


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
    """A plain-text table: medians, ratio, whether the goal was met, the goal; then a tally."""
    head = (
        f"{'workload':<44} {'unit':<10} {'pipeflow':>12} {'torch':>12} {'ratio':>7}  "
        f"{'goal':<7}  target"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.workload:<44} {r.unit:<10} {fmt(r.pipeflow):>12} {fmt(r.torch):>12} "
            f"{r.ratio:>6.2f}x  {mark(r):<7}  {r.target}"
        )
        if r.note:
            lines.append(f"{'':<44} {r.note}")
    lines.append(summary(rows))
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """One line: how many goals were met, missed, and not checked."""
    marks = [mark(r) for r in rows if r.target]
    text = f"goals: {marks.count('met')} of {len(marks)} met"
    if marks.count("NOT MET"):
        text += f", {marks.count('NOT MET')} NOT MET"
    if marks.count("?"):
        text += f", {marks.count('?')} not checked (?)"
    return text


def fmt(x: float) -> str:
    if x >= 1000:
        return f"{x:,.0f}"
    if x >= 10:
        return f"{x:.1f}"
    return f"{x:.3f}"


def cli(doc: str | None, run: Callable[[bool], list[Row]]) -> Callable[[list[str] | None], int]:
    """The ``main`` of a suite whose only option is ``--quick``: run it, print its table."""

    def main(argv: list[str] | None = None) -> int:
        parser = argparse.ArgumentParser(description=doc)
        parser.add_argument("--quick", action="store_true")
        print(table(run(parser.parse_args(argv).quick)))
        return 0

    return main
