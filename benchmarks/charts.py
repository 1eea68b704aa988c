"""Charts of benchmark results: per suite, a horizontal bar chart of pipeflow / torch ratios.

Draw the chart of a JSON file of rows (an SVG beside it, of the same name)::

    python -m benchmarks.charts docs/performance/default.json
    python -m benchmarks.charts rows.json --out rows.png      # or a PNG, elsewhere

or run suites first and save their rows to the JSON file, then draw it (this runs the
benchmarks: minutes)::

    python -m benchmarks.charts new.json --run throughput composed --quick

The JSON holds ``{"title": ..., "rows": [...]}`` or just the list of rows. A row::

    {"workload": "no workers, __getitem__", "unit": "samples/s", "better": "higher",
     "pipeflow": 861878, "torch": 346612, "ratio": 2.49, "goal": ">= 3x"}

- ``torch``: the other side's value, the harness's 'torch' column; ``peer`` names that side
  where it is not torch's DataLoader (``"Grain"``, ``"WebDataset"``).
- ``ratio``: pipeflow / torch as printed (computed when left out), or a list, one per run:
  the bar shows their median and a line their range.
- ``goal``: the harness's target (``">= 3x"``, ``"<= 0.5x"``, ``"pipeflow < 0.05"``), drawn
  as a diamond: filled where met. ``met`` overrides the verdict the harness reads from the
  goal (as ``Row.met`` does), for goals in other forms (``"overhead < 5%"``).
- ``better``: ``"higher"`` or ``"lower"``; rows of each kind are drawn in their own panel.
- ``unit`` and ``note`` are kept with the numbers; the chart does not show them.

Where one workload is measured against several peers (the peers suite), its bars form a
group, one colour per peer; otherwise a bar's colour says whether pipeflow did better.
Text is drawn as paths with matplotlib's own font, so the image needs no font to show.
"""

from __future__ import annotations

import argparse
import importlib
import json
import math
import re
import statistics
import sys
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks._harness import Row, goal_met

AHEAD, BEHIND, EVEN = "#3b73b9", "#e07b39", "#8c8c8c"  # pipeflow better, worse, the same
#: One colour per peer in grouped charts (Okabe and Ito's palette: readable by the
#: colour-blind), in the order the peers first appear.
PEER_COLOURS = ["#0072b2", "#009e73", "#e69f00", "#cc79a7", "#56b4e9", "#d55e00"]
WIDTH_IN = 7.0  # inches: 672 CSS pixels, about the width of the docs' text column
LABEL_CHARS = 34  # a workload's name wraps at this width
PLOT_PT = 0.6 * WIDTH_IN * 72  # about how wide the plot is, in points, beside the names
_GOAL = re.compile(r"(?P<who>pipeflow\s+)?(?P<op>>=|<=|<|>)\s*(?P<num>[\d.]+)\s*(?P<unit>x|%)?")


@dataclass(frozen=True)
class Bar:
    """One bar: pipeflow's ratio to one peer on one workload, and the goal as a ratio."""

    workload: str
    peer: str
    ratios: tuple[float, ...]  # one per run
    higher_is_better: bool
    goal: float | None  # where the goal sits on the ratio axis (None: not a ratio)
    met: bool | None  # None: no goal, or one that can't be checked

    @property
    def ratio(self) -> float:
        return statistics.median(self.ratios)

    @property
    def colour(self) -> str:
        """Blue where pipeflow did better, orange where worse, grey at 1x."""
        if self.ratio == 1:
            return EVEN
        return AHEAD if (self.ratio > 1) == self.higher_is_better else BEHIND


def goal_ratio(goal: str, torch: float | None = None) -> float | None:
    """Where *goal* sits on the ratio axis, or None for a goal in another form.

    Examples:
        >>> goal_ratio(">= 3x"), goal_ratio("<= 0.5x")
        (3.0, 0.5)
        >>> goal_ratio("pipeflow < 0.05", torch=0.5)  # pipeflow < 0.05 where torch is 0.5
        0.1
        >>> goal_ratio("overhead < 5%") is None, goal_ratio("pipeflow < 0.05") is None
        (True, True)
    """
    m = _GOAL.fullmatch(goal.strip())
    if m is None:
        return None
    if m["who"]:
        return float(m["num"]) / torch if torch else None
    return float(m["num"]) if m["unit"] == "x" else None


def bar(row: dict[str, Any]) -> Bar:
    """The :class:`Bar` of one JSON row (see the module's docstring for its keys)."""
    workload, unit, goal = row["workload"].strip(), row.get("unit", ""), row.get("goal", "")
    higher = row.get("better", "higher") == "higher"
    pf, torch = row.get("pipeflow"), row.get("torch")
    given = row.get("ratio")
    if given is None:
        given = pf / torch if pf is not None and torch else math.nan
    ratios = tuple(float(r) for r in (given if isinstance(given, list) else [given]))
    met = row.get("met")
    if met is None and goal:
        if pf is not None and torch is not None and len(ratios) == 1:
            runs = [Row(workload, unit, pf, torch, goal, higher_is_better=higher)]
        else:  # ratios alone: a goal on the ratio can still be checked
            runs = [Row(workload, unit, r, 1.0, goal, higher_is_better=higher) for r in ratios]
        verdicts = [goal_met(r) for r in runs]
        met = None if None in verdicts else all(verdicts)
    return Bar(workload, row.get("peer", "torch"), ratios, higher, goal_ratio(goal, torch), met)


def load(path: Path) -> tuple[dict[str, str], list[Bar]]:
    """The bars of a JSON file of rows, and its ``title`` and ``xlabel`` (the x axis's
    label, where the default does not fit)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    if isinstance(data, list):
        data = {"rows": data}
    text = {key: data.get(key, "") for key in ("title", "xlabel")}
    return text, [bar(r) for r in data["rows"]]


def to_json(rows: Iterable[Row]) -> list[dict[str, Any]]:
    """The harness's rows (what a suite's ``run(quick)`` returns) as JSON rows."""
    out = []
    for r in rows:
        row: dict[str, Any] = {
            "workload": r.workload.strip(),
            "unit": r.unit,
            "better": "higher" if r.higher_is_better else "lower",
            "pipeflow": r.pipeflow,
            "torch": r.torch,
            "ratio": None if math.isnan(r.ratio) else round(r.ratio, 4),
            "goal": r.target,
        }
        if r.met is not None:
            row["met"] = r.met
        if r.note:
            row["note"] = r.note
        out.append(row)
    return out


def run_suites(names: list[str], quick: bool) -> list[dict[str, Any]]:
    """Run the suites ``benchmarks.<name>`` as ``python -m pipeflow bench`` does; their rows."""
    from pipeflow.__main__ import _bench_setup

    _bench_setup(Path(__file__).resolve().parent.parent)
    rows: list[dict[str, Any]] = []
    for name in names:
        rows += to_json(importlib.import_module(f"benchmarks.{name}").run(quick))
    return rows


def label(x: float) -> str:
    """A ratio as the tables print it.

    Examples:
        >>> [label(x) for x in (69.94, 2.486, 0.0022, 0.0)]
        ['69.9x', '2.49x', '0.002x', '0x']
    """
    if x == 0:
        return "0x"
    if x >= 10:
        return f"{x:.1f}x"
    return f"{x:.2f}x" if x >= 0.01 else f"{x:.1g}x"


def _text(b: Bar) -> str:
    return ", ".join(label(r) for r in b.ratios)


def _limits(bars: list[Bar]) -> tuple[float, float]:
    """The x range of a panel: every ratio, goal and 1x, and room for the labels beside the
    bars on either side."""
    xs = [x for b in bars for x in (*b.ratios, b.goal) if x is not None and x > 0]
    lo, hi = math.log10(min([1.0, *xs])), math.log10(max([1.0, *xs]))
    # What share of the plot's width (about 60% of the figure) the longest label takes.
    share = {
        side: max([(len(_text(b)) * 5.2 + 12) / PLOT_PT for b in bars if _right(b) == side] or [0])
        for side in (False, True)
    }
    left, right = max(share[False], 0.04), max(share[True], 0.04)
    span = max(hi - lo, 0.3) / (1 - left - right)
    return 10 ** (lo - left * span), 10 ** (hi + right * span)


def _right(b: Bar) -> bool:
    """Whether the bar's label goes to its right (the bar ends right of 1x)."""
    return max(b.ratios) >= 1


def _ticks(lo: float, hi: float) -> list[float]:
    decades = math.log10(hi / lo)
    steps = (1, 1.5, 2, 3, 5, 7) if decades <= 1.2 else (1, 2, 5) if decades <= 2.6 else (1,)
    ks = range(math.floor(math.log10(lo)), math.ceil(math.log10(hi)) + 1)
    return [s * 10.0**k for k in ks for s in steps if lo <= s * 10.0**k <= hi]


def _label_at(b: Bar, text: str, right: bool, lo: float, hi: float) -> float:
    """Where a bar's label starts: past the bar's end, and past its goal's diamond where
    the label would cover it."""
    end = max(max(b.ratios) if right else min(b.ratios), lo)
    if b.goal is None:
        return end
    # The label's width and the diamond's, in decades.
    per_pt = math.log10(hi / lo) / PLOT_PT
    wide, diamond = (len(text) * 5.2 + 10) * per_pt, 5 * per_pt
    gap = math.log10(b.goal / end) if right else math.log10(end / b.goal)
    if -diamond < gap < wide:
        return b.goal * 10 ** (diamond if right else -diamond)
    return end


def _slots(bars: list[Bar], grouped: bool) -> list[tuple[str, list[Bar]]]:
    """The bars of a panel by workload (in order), one per group when *grouped*."""
    if not grouped:
        return [(b.workload, [b]) for b in bars]
    groups: dict[str, list[Bar]] = {}
    for b in bars:
        groups.setdefault(b.workload, []).append(b)
    return list(groups.items())


def _xlabel(bars: list[Bar], grouped: bool) -> str:
    """``pipeflow / torch (log scale)``, naming the peer most rows have."""
    peers = [b.peer for b in bars]
    common = max(peers, key=peers.count)
    if grouped:
        return "pipeflow / each peer (log scale)"
    if len(set(peers)) > 1:
        return f"pipeflow / {common}, or the row's peer (log scale)"
    return f"pipeflow / {common} (log scale)"


def draw(title: str, bars: list[Bar], out: Path, xlabel: str = "") -> Path:
    """Draw *bars* into *out* (``.svg`` or ``.png``); return *out*. *xlabel* replaces
    the x axis's label, which otherwise names the peer most bars have."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    plt.rcParams.update({"font.size": 10, "svg.fonttype": "path", "svg.hashsalt": "pipeflow"})
    bars = [b for b in bars if not any(math.isnan(r) for r in b.ratios)]  # torch measured 0
    by_workload: dict[str, set[str]] = {}
    for b in bars:
        by_workload.setdefault(b.workload, set()).add(b.peer)
    grouped = any(len(peers) > 1 for peers in by_workload.values())
    peers = list(dict.fromkeys(b.peer for b in bars))
    colour = dict(zip(peers, PEER_COLOURS * len(peers)))
    panels = [
        (higher, _slots([b for b in bars if b.higher_is_better == higher], grouped))
        for higher in (True, False)
        if any(b.higher_is_better == higher for b in bars)
    ]
    step, gap = (0.19, 0.25) if grouped else (0.29, 0.0)  # inches per bar, between groups
    heights = [
        sum(max(len(g) * step + gap, 0.17 * len(textwrap.wrap(w, LABEL_CHARS)) + 0.1) for w, g in s)
        for _, s in panels
    ]
    fig, axes = plt.subplots(
        len(panels),
        1,
        figsize=(WIDTH_IN, sum(heights) + 0.75 * len(panels) + 0.9),
        height_ratios=heights,
        layout="constrained",
        squeeze=False,
    )
    for ax, (higher, slots) in zip(axes[:, 0], panels):
        _panel(ax, slots, higher, step, gap, colour if grouped else None)
    axes[-1, 0].set_xlabel(xlabel or _xlabel(bars, grouped))
    if title:
        title = "\n".join(textwrap.wrap(title, 72))
        fig.suptitle(title, x=0.01, ha="left", fontsize=11, fontweight="bold")
    _legend(fig, colour if grouped else None)
    fig.patch.set_facecolor("white")  # readable on the docs' dark theme too
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, facecolor="white", metadata={"Date": None} if out.suffix == ".svg" else {})
    plt.close(fig)
    return out


def _legend(fig: Any, colour: dict[str, str] | None) -> None:
    """The legend under the panels: the bars' colours (by peer where *colour* is given),
    and the goal's two diamonds."""
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles: list[Any] = (
        [Patch(color=c, label=f"vs {peer}") for peer, c in colour.items()]
        if colour
        else [Patch(color=c, label=name) for c, name in ((AHEAD, "better"), (BEHIND, "worse"))]
    )
    diamond: dict[str, Any] = {"marker": "D", "linestyle": "", "ms": 6, "mec": "black"}
    handles += [
        Line2D([], [], markerfacecolor="black", label="goal, met", **diamond),
        Line2D([], [], markerfacecolor="white", label="goal, not met", **diamond),
    ]
    fig.legend(handles=handles, loc="outside lower center", ncols=min(len(handles), 4))


def _panel(
    ax: Any,
    slots: list[tuple[str, list[Bar]]],
    higher: bool,
    step: float,
    gap: float,
    colour: dict[str, str] | None,
) -> None:
    """One panel: the bars of one direction, by workload; *colour*: by peer (grouped)."""
    lo, hi = _limits([b for _, group in slots for b in group])
    ax.set_xscale("log")
    ax.set_xlim(lo, hi)
    ticks = _ticks(lo, hi)
    ax.set_xticks(ticks, [f"{t:g}x" for t in ticks])
    ax.minorticks_off()
    ax.axvline(1.0, color="0.15", linewidth=1.2, zorder=1)
    ax.grid(axis="x", color="0.88", linewidth=0.8, zorder=0)
    y, centres, names = 0.0, [], []
    for workload, group in slots:
        name = "\n".join(textwrap.wrap(workload, LABEL_CHARS))
        height = max(len(group) * step + gap, 0.17 * name.count("\n") + 0.27)
        top = y + (height - len(group) * step) / 2
        for k, b in enumerate(group):
            fill = colour[b.peer] if colour else b.colour
            _bar(ax, b, top + (k + 0.5) * step, step, (lo, hi), fill, small=colour is not None)
        centres.append(y + height / 2)
        names.append(name)
        y += height
    ax.set_ylim(y, 0)
    ax.set_yticks(centres, names, fontsize=9)
    ax.tick_params(axis="y", length=0)
    for side in ("top", "right", "left"):
        ax.spines[side].set_visible(False)
    title = "higher is better" if higher else "lower is better"
    ax.set_title(title, loc="left", fontsize=9.5, style="italic")


def _bar(
    ax: Any, b: Bar, y: float, step: float, limits: tuple[float, float], fill: str, small: bool
) -> None:
    """One bar from 1x to its ratio (the median of its runs), the runs' range, its label and
    its goal's diamond."""
    lo, hi = limits
    end = max(b.ratio, lo)  # a ratio of 0 runs to the plot's edge
    ax.barh(y, end - 1.0, left=1.0, height=step * 0.78, color=fill, zorder=2)
    ax.plot([end], [y], "|", color=fill, markersize=step * 40, zorder=2)  # a ratio near 1
    if len(b.ratios) > 1:
        ax.hlines(y, min(b.ratios), max(b.ratios), color="black", linewidth=1.2, zorder=3)
    text, right = _text(b), _right(b)
    inside = not right and min(b.ratios) <= lo  # no room left of the bar: write on it
    ax.annotate(
        text,
        (lo if inside else _label_at(b, text, right, lo, hi), y),
        xytext=(4 if right or inside else -4, 0),
        textcoords="offset points",
        ha="left" if right or inside else "right",
        va="center",
        fontsize=8.5 if small else 9,
        color="white" if inside else "black",
        zorder=5,
    )
    if b.goal is not None:
        face = "black" if b.met else "white"
        ax.plot([b.goal], [y], "D", ms=6, mfc=face, mec="black", zorder=4)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Draw a bar chart of pipeflow / torch ratios from a JSON file of rows."
    )
    parser.add_argument("json", nargs="+", type=Path, help="JSON files of rows")
    parser.add_argument("--out", type=Path, help="the image (.svg or .png); one JSON file only")
    parser.add_argument(
        "--run", nargs="+", metavar="SUITE", help="run these suites and save their rows first"
    )
    parser.add_argument("--quick", action="store_true", help="with --run: a short run")
    parser.add_argument("--title", help="with --run: the chart's title")
    args = parser.parse_args(argv)
    if (args.out or args.run) and len(args.json) > 1:
        parser.error("--out and --run take one JSON file")
    if args.run:
        rows = run_suites(args.run, args.quick)
        doc = {"title": args.title or f"python -m pipeflow bench {' '.join(args.run)}"}
        args.json[0].write_text(json.dumps({**doc, "rows": rows}, indent=1) + "\n")
    for path in args.json:
        text, bars = load(path)
        print(draw(text["title"], bars, args.out or path.with_suffix(".svg"), text["xlabel"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
