"""The README's promises: the demo runs, the tour's code runs, `bench` finds its suites."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_demo_trains_and_reports_stats(tmp_path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeflow",
            "demo",
            "--images",
            "200",
            "--epochs",
            "1",
            "--workers",
            "1",
            "--cache",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
        cwd=ROOT,
    ).stdout
    assert "160 training and 40 held-out images, 4 classes" in out
    assert re.search(r"epoch 0: train loss \d+\.\d+, held-out accuracy \d+\.\d%", out)
    assert "bottleneck:" in out and "parallel_map" in out
    assert "\n  indices(160)\n  | shuffle(seed=0)\n  | batch(size=64" in out  # a stage a line
    assert "own s: " in out  # the columns' legend
    assert max(len(line) for line in out.splitlines() if line.startswith("  ")) <= 100
    assert len(list(tmp_path.rglob("*.jpg"))) == 200


@pytest.mark.slow
def test_demo_reads_a_folder_of_class_directories(tmp_path) -> None:
    from PIL import Image

    for name in ("cats", "dogs"):
        (tmp_path / name).mkdir()
        for i in range(6):
            Image.new("RGB", (40, 30), (i * 40, 0, 0)).save(tmp_path / name / f"{i}.png")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pipeflow",
            "demo",
            "--data-dir",
            str(tmp_path),
            "--epochs",
            "1",
            "--workers",
            "0",
            "--batch-size",
            "4",
        ],
        capture_output=True,
        text=True,
        check=True,
        timeout=180,
        cwd=ROOT,
    ).stdout
    assert "10 training and 2 held-out images, 2 classes: cats, dogs" in out


def test_readme_tour_runs() -> None:
    text = (ROOT / "README.md").read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    for code in blocks:
        exec(compile(code, "README.md", "exec"), {"__name__": "__main__"})


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make check"]


def test_bench_table_marks_every_goal_met_or_not() -> None:
    from benchmarks._harness import Row, table

    rows = [
        Row("batched", "samples/s", 34.3, 10.0, ">= 10x"),  # 3.43x: must not read as a pass
        Row("plain", "samples/s", 40.0, 10.0, ">= 3x"),
        Row("startup", "seconds", 0.6, 1.0, "<= 0.5x", higher_is_better=False),
        Row("resume", "fraction", 0.01, 0.4, "pipeflow < 0.05", higher_is_better=False),
        Row("stats", "samples/s", 99.0, 90.0, "overhead < 5%", met=True),
        Row("odd", "samples/s", 1.0, 1.0, "about the same"),
    ]
    lines = table(rows).splitlines()
    marks = {
        line.split()[0]: line for line in lines[2:] if line.split()[0] in {r.workload for r in rows}
    }
    assert "3.43x  not met   >= 10x" in marks["batched"]
    assert "4.00x  met       >= 3x" in marks["plain"]
    assert "not met   <= 0.5x" in marks["startup"]
    assert "met       pipeflow < 0.05" in marks["resume"]
    assert "met       overhead < 5%" in marks["stats"]
    assert "?         about the same" in marks["odd"]
    assert lines[-2] == "goals: 3 of 6 met, 2 not met, 1 not checked (?)"


def test_bench_table_says_which_way_is_better_and_what_to_conclude() -> None:
    from benchmarks._harness import Row, table

    rows = [
        Row("fast", "samples/s", 30.0, 10.0, ">= 2x"),
        Row("start", "seconds", 0.5, 1.0, "<= 0.2x", higher_is_better=False),
        # the goal lies between this run's best and worst repetitions: one run can't say
        Row(
            "fork",
            "seconds",
            0.54,
            1.0,
            "<= 0.5x",
            higher_is_better=False,
            samples={"pipeflow": [0.47, 0.54, 0.6], "torch": [1.0, 1.0, 1.0]},
        ),
    ]
    lines = table(rows, quick=True).splitlines()
    assert lines[0].split()[:3] == ["workload", "unit", "better:"]
    better = {line.split()[0]: line.split()[2] for line in lines[2:5]}
    assert better == {"fast": "higher", "start": "lower", "fork": "lower"}
    assert "not met*" in lines[4]
    assert lines[-2].endswith(
        "; * within this run's spread (best vs worst repetition): one run can't say"
    )
    assert lines[-1] == (
        "reading: better than torch in 3 of 3 rows; 1 row short of its goal: 'start'; 1 more "
        "row short of the goal within this run's spread (*): 'fork'. A --quick run is short "
        "and noisy: rerun a suite in full (python -m pipeflow bench SUITE) before reading much "
        "into a miss"
    )
    met = table(rows[:1]).splitlines()[-1]
    assert met == "reading: better than torch in 1 of 1 rows; every goal checked was met"


def test_bench_outside_a_checkout_says_how_to_get_the_benchmarks(tmp_path: Path) -> None:
    import shutil

    shutil.copytree(ROOT / "pipeflow", tmp_path / "pipeflow")  # an installed copy: no benchmarks/
    done = subprocess.run(
        [sys.executable, "-m", "pipeflow", "bench", "--quick"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path)},
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    assert done.stderr.startswith(
        "python -m pipeflow bench runs the benchmarks/ folder of pipeflow's source, which is "
        f"not\ninstalled with the package (this pipeflow is at {tmp_path / 'pipeflow'})."
    )
    assert "get the source and run the command from its folder" in done.stderr
    assert "pip install -e ." in done.stderr


def test_bench_says_when_each_suite_starts_and_how_long_it_took(monkeypatch, capsys) -> None:
    import types

    import pipeflow.__main__ as cli
    from benchmarks._harness import Row

    suite = types.ModuleType("benchmarks.tiny")
    suite.run = lambda quick: [Row("tiny", "samples/s", 2.0, 1.0, ">= 1x")]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "benchmarks.tiny", suite)
    assert cli.main(["bench", "--quick", "tiny", "tiny"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert re.fullmatch(r"\[1/2\] tiny \.\.\. 1 rows in \d+ s", out[0])
    assert re.fullmatch(r"\[2/2\] tiny \.\.\. 1 rows in \d+ s", out[1])
    assert re.fullmatch(r"all suites: \d+ s", out[2])
    assert out[-1].startswith("reading: better than torch in 2 of 2 rows")


def test_readme_tour_uses_what_it_defines() -> None:
    import ast

    text = (ROOT / "README.md").read_text()
    tour = re.search(r"```python\n(.*?)```", text.split("## A short tour", 1)[1], flags=re.S)
    assert tour is not None
    tree = ast.parse(tour[1])
    defined = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
    called = {
        n.func.id
        for n in ast.walk(tree)
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)
    }
    assert defined and defined <= called, f"defined, never used: {defined - called}"


@pytest.mark.slow
def test_help_is_plain_text_with_defaults() -> None:
    def help_of(*args: str) -> str:
        return subprocess.run(
            [sys.executable, "-m", "pipeflow", *args, "--help"],
            capture_output=True,
            text=True,
            check=True,
            cwd=ROOT,
        ).stdout

    top = help_of()
    assert "``" not in top and "python -m pipeflow demo" in top
    demo = help_of("demo")
    options = re.findall(r"^  (--[\w-]+)", demo, flags=re.M)
    assert options == [
        "--data-dir",
        "--images",
        "--epochs",
        "--workers",
        "--backend",
        "--batch-size",
        "--image-size",
        "--seed",
        "--cache",
        "--progress",
    ]
    # every option says its default (argparse wraps the help text: join the lines first)
    text = " ".join(demo.split())
    for option in options:
        described = text.split(option, 2)[-1].split(" --", 1)[0]
        assert "default" in described, option
