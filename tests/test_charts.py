"""benchmarks/charts.py: a JSON file of benchmark rows becomes a bar chart that names them."""

from __future__ import annotations

import doctest
import html
import json
import sys
import types
from pathlib import Path

import pytest

pytest.importorskip("matplotlib")

from benchmarks import charts
from benchmarks._harness import Row

ROOT = Path(__file__).resolve().parent.parent

ROWS = [
    {"workload": "no workers, __getitem__", "unit": "samples/s", "better": "higher",
     "pipeflow": 861878, "torch": 346612, "ratio": 2.49, "goal": ">= 3x"},
    {"workload": "first batch: fork & <2> workers", "unit": "seconds", "better": "lower",
     "pipeflow": 0.015, "torch": 0.033, "goal": "<= 0.5x"},
    {"workload": "resume at 90% of an epoch", "unit": "of epoch", "better": "lower",
     "pipeflow": 0.0, "torch": 0.9, "goal": "pipeflow < 0.05"},
]  # fmt: skip


def names_in(svg: Path) -> str:
    """The SVG's text: matplotlib writes each string it draws as a comment beside its paths."""
    return html.unescape(svg.read_text(encoding="utf-8"))


def test_a_json_file_becomes_an_svg_beside_it_naming_every_row(tmp_path: Path) -> None:
    path = tmp_path / "suite.json"
    path.write_text(json.dumps({"title": "a suite", "rows": ROWS}))
    assert charts.main([str(path)]) == 0
    text = names_in(tmp_path / "suite.svg")
    for row in ROWS:
        assert row["workload"] in text
    for shown in ("a suite", "2.49x", "0.45x", "0x", "higher is better", "lower is better"):
        assert shown in text


def test_peers_are_grouped_with_the_range_of_their_runs(tmp_path: Path) -> None:
    rows = [
        {"workload": "tiny samples", "peer": peer, "ratio": runs, "goal": ">= 1.1x"}
        for peer, runs in [("torch", [5.49, 4.88]), ("Grain", [8.43, 7.22])]
    ]
    path = tmp_path / "peers.json"
    path.write_text(json.dumps(rows))  # a bare list of rows is a file too
    out = tmp_path / "peers.png"
    assert charts.main([str(path), "--out", str(out)]) == 0
    assert out.read_bytes().startswith(b"\x89PNG")
    bars = charts.load(path)[1]
    assert [b.peer for b in bars] == ["torch", "Grain"]
    assert bars[0].ratio == pytest.approx((5.49 + 4.88) / 2)
    assert all(b.met for b in bars)


def test_bars_read_goals_as_the_harness_does() -> None:
    got = {b.workload: b for b in map(charts.bar, ROWS)}
    getitem = got["no workers, __getitem__"]
    assert (getitem.ratio, getitem.goal, getitem.met) == (2.49, 3.0, False)
    assert getitem.colour == charts.AHEAD
    assert got["first batch: fork & <2> workers"].colour == charts.AHEAD  # 0.45x of a time
    assert charts.bar({**ROWS[0], "ratio": 1.0}).colour == charts.EVEN
    resume = got["resume at 90% of an epoch"]  # "pipeflow < 0.05" of torch's 0.9
    assert resume.goal == pytest.approx(0.05 / 0.9)
    assert resume.met
    assert charts.bar({**ROWS[0], "goal": "overhead < 5%", "met": True}).met
    assert charts.bar({**ROWS[0], "goal": "overhead < 5%"}).met is None
    runs = charts.bar(
        {"workload": "w", "ratio": [1.11, 0.62], "goal": "<= 0.91x", "better": "lower"}
    )
    assert runs.met is False  # met in one run, not in the other


def test_goal_ratio_and_labels() -> None:
    assert charts.goal_ratio(">= 3x") == 3.0
    assert charts.goal_ratio("pipeflow < 0.05", torch=0.5) == pytest.approx(0.1)
    assert charts.goal_ratio("cost < 2%") is None
    assert [charts.label(x) for x in (69.94, 2.486, 0.0022, 0.0)] == [
        "69.9x",
        "2.49x",
        "0.002x",
        "0x",
    ]


def test_docstring_examples() -> None:
    assert doctest.testmod(charts).failed == 0


def test_a_row_without_a_ratio_is_left_out(tmp_path: Path) -> None:
    path = tmp_path / "zero.json"
    path.write_text(json.dumps([{**ROWS[0], "torch": 0, "ratio": None}, ROWS[1]]))
    assert charts.main([str(path)]) == 0
    text = names_in(tmp_path / "zero.svg")
    assert ROWS[1]["workload"] in text
    assert ROWS[0]["workload"] not in text


def test_run_saves_the_rows_of_suites_then_draws_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    suite = types.ModuleType("benchmarks._fake_suite")
    quick_seen: list[bool] = []

    def run(quick: bool) -> list[Row]:
        quick_seen.append(quick)
        return [
            Row("  same, indented", "samples/s", 2.0, 1.0, ">= 1.5x", note="a note"),
            Row("time", "seconds", 1.0, 2.0, "overhead < 5%", higher_is_better=False, met=True),
        ]

    suite.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks._fake_suite", suite)
    monkeypatch.setenv("PYTHONPATH", "")  # the suites' set-up adds the checkout to it
    monkeypatch.setattr(sys, "path", list(sys.path))
    path = tmp_path / "mine.json"
    assert charts.main([str(path), "--run", "_fake_suite", "--quick"]) == 0
    assert quick_seen == [True]
    saved = json.loads(path.read_text())
    assert saved["title"] == "python -m pipeflow bench _fake_suite"
    assert saved["rows"] == [
        {"workload": "same, indented", "unit": "samples/s", "better": "higher",
         "pipeflow": 2.0, "torch": 1.0, "ratio": 2.0, "goal": ">= 1.5x", "note": "a note"},
        {"workload": "time", "unit": "seconds", "better": "lower", "pipeflow": 1.0,
         "torch": 2.0, "ratio": 0.5, "goal": "overhead < 5%", "met": True},
    ]  # fmt: skip
    assert "same, indented" in names_in(tmp_path / "mine.svg")


@pytest.mark.parametrize("name", ["default", "peers", "sequences", "shards", "ray"])
def test_the_docs_charts_come_from_their_json(name: str) -> None:
    """Every chart on the performance page has its JSON beside it, and the page shows it."""
    folder = ROOT / "docs" / "performance"
    assert (folder / f"{name}.svg").is_file()
    assert charts.load(folder / f"{name}.json")[1]
    page = (ROOT / "docs" / "performance.md").read_text(encoding="utf-8")
    assert f"(performance/{name}.svg)" in page
