"""The README's promises: the demo runs, the tour's code runs, `bench` finds its suites."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_demo_loads_every_sample_and_reports_speed() -> None:
    out = subprocess.run(
        [sys.executable, "-m", "pipeflow", "demo", "--samples", "1000", "--epochs", "2"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
        cwd=ROOT,
    ).stdout
    assert "batches per epoch: 16" in out
    assert len(re.findall(r"epoch \d: 1000 samples in", out)) == 2
    assert re.search(r"ratio\s+\d+\.\d\dx", out)


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
