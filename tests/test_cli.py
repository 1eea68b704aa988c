"""The README's promises: the demo runs, the tour's code runs, `bench` finds its suites."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


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
    assert len(list(tmp_path.rglob("*.jpg"))) == 200


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
        exec(compile(code, "README.md", "exec"), {"__name__": "readme"})


def test_readme_opens_with_the_two_commands() -> None:
    text = (ROOT / "README.md").read_text()
    first_block = re.search(r"```bash\n(.*?)```", text, flags=re.S)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands == ["make demo", "make check"]
