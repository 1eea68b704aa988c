"""Timing helpers: interleaved repetitions, medians, and the table every benchmark prints."""

from __future__ import annotations

import argparse
import math
import re
import statistics
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
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
    """``"met"``, ``"not met"``, or ``"?"`` (not checked) for *row*'s goal; ``""`` if none.
    A ``*`` follows when the verdict is :func:`unsure`."""
    if not row.target:
        return ""
    text = {True: "met", False: "not met", None: "?"}[goal_met(row)]
    return text + "*" if unsure(row) else text


def unsure(row: Row) -> bool:
    """Whether *row*'s verdict would flip between its best and its worst repetition (pipeflow's
    best against torch's worst, and the other way round): the goal lies within the run's own
    spread, so one run does not settle it.

    Examples:
        >>> row = Row("w", "s", 0.5, 1.0, "<= 0.5x", higher_is_better=False,
        ...           samples={"pipeflow": [0.45, 0.5, 0.6], "torch": [1.0, 1.0, 1.0]})
        >>> unsure(row), unsure(Row("w", "s", 0.2, 1.0, "<= 0.5x", higher_is_better=False))
        (True, False)
    """
    pf, ref = row.samples.get("pipeflow"), row.samples.get("torch")
    if row.met is not None or not pf or not ref or goal_met(row) is None:
        return False
    good, bad = (max, min) if row.higher_is_better else (min, max)
    best = replace(row, pipeflow=good(pf), torch=bad(ref))
    worst = replace(row, pipeflow=bad(pf), torch=good(ref))
    return goal_met(best) != goal_met(worst)


def better_than_torch(row: Row) -> bool | None:
    """Whether pipeflow's median beat torch's (``None``: no torch value to compare)."""
    if not row.torch or math.isnan(row.ratio):
        return None
    return row.ratio > 1 if row.higher_is_better else row.ratio < 1


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


def table(rows: list[Row], quick: bool = False) -> str:
    """A plain-text table: medians, which way is better, ratio, whether the goal was met, the
    goal; then a tally and a one-line reading (see :func:`reading`; *quick*: of a short run)."""
    w = max([44, *(len(r.workload) for r in rows)])
    head = (
        f"{'workload':<{w}} {'unit':<10} {'better:':<7} {'pipeflow':>12} {'torch':>12} "
        f"{'ratio':>7}  {'goal':<8}  target"
    )
    lines = [head, "-" * len(head)]
    for r in rows:
        lines.append(
            f"{r.workload:<{w}} {r.unit:<10} {'higher' if r.higher_is_better else 'lower':<7} "
            f"{fmt(r.pipeflow):>12} {fmt(r.torch):>12} {r.ratio:>6.2f}x  {mark(r):<8}  {r.target}"
        )
        if r.note:
            lines.append(f"{'':<{w}} {r.note}")
    lines.append(summary(rows))
    lines.append(reading(rows, quick))
    return "\n".join(lines)


def summary(rows: list[Row]) -> str:
    """One line: how many goals were met, missed, and not checked."""
    marks = [mark(r).rstrip("*") for r in rows if r.target]
    text = f"goals: {marks.count('met')} of {len(marks)} met"
    if marks.count("not met"):
        text += f", {marks.count('not met')} not met"
    if marks.count("?"):
        text += f", {marks.count('?')} not checked (?)"
    if any(unsure(r) for r in rows):
        text += "; * within this run's spread (best vs worst repetition): one run can't say"
    return text


def reading(rows: list[Row], quick: bool = False) -> str:
    """One line a user can act on, with the two things the table measured kept apart: in how
    many rows pipeflow did better than torch (by the row's ``better:`` direction), and which
    rows fell short of their goal (a row can do better than torch and still miss a goal of
    ``>= 3x``), those that one run can't settle apart; then what to run to be sure."""
    wins = [better_than_torch(r) for r in rows]
    compared = [w for w in wins if w is not None]
    text = f"reading: better than torch in {compared.count(True)} of {len(compared)} rows"
    missed = [r for r in rows if r.target and goal_met(r) is False]
    if not missed:
        return text + "; every goal checked was met"
    firm = [r.workload.strip() for r in missed if not unsure(r)]
    loose = [r.workload.strip() for r in missed if unsure(r)]
    if firm:
        text += f"; {_rows(len(firm))} short of {'its' if len(firm) == 1 else 'their'} goal: "
        text += ", ".join(map(repr, firm))
    if loose:
        more = "more " if firm else ""
        text += f"; {_rows(len(loose), more)} short of the goal within this run's spread (*): "
        text += ", ".join(map(repr, loose))
    if quick:
        return text + (
            ". A --quick run is short and noisy: rerun a suite in full (python -m pipeflow "
            "bench SUITE) before reading much into a miss"
        )
    return text + (". Those marked * may pass on a rerun" if loose else "")


def _rows(n: int, more: str = "") -> str:
    return f"{n} {more}row" if n == 1 else f"{n} {more}rows"


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
        quick = parser.parse_args(argv).quick
        print(table(run(quick), quick))
        return 0

    return main
