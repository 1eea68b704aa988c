"""One steady-state batch of a process ``parallel_map`` runs in at most 12 pipeflow files.

The count is ``tools/trace_files.py``'s (main process and workers together, traced at run
time); issue 22 asks that the engine's part of it stay a handful of files a reader can name.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

TOOL = Path(__file__).resolve().parents[1] / "tools" / "trace_files.py"


def test_one_batch_runs_in_at_most_12_files() -> None:
    args = [sys.executable, str(TOOL), "--batches", "6", "--warmup", "4", "--max", "12"]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    found = re.search(r"^files: (\d+)", done.stdout, re.MULTILINE)
    assert found is not None, done.stdout + done.stderr
    assert int(found.group(1)) <= 12, done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert "pipeflow/parallel/_run.py" in done.stdout  # the trace saw the engine at all
