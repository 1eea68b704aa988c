"""progress.py: pf.progress() — silent off a terminal, a bar when forced, checked arguments."""

from __future__ import annotations

import subprocess
import sys

import pytest

import pipeflow as pf


@pytest.mark.slow
def test_progress_is_silent_when_output_is_not_a_terminal() -> None:
    code = "import pipeflow as pf; list(pf.indices(50) | pf.progress())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == "" and out.stdout == ""


@pytest.mark.slow
def test_forced_progress_shows_count_rate_and_total() -> None:
    code = (
        "import pipeflow as pf\n"
        "loader = pf.indices(50) | pf.batch(5) | pf.progress(unit='batch', force=True)\n"
        "loader.set_epoch(3)\n"
        "list(loader)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "epoch 3: 100%" in out.stderr
    assert "10/10" in out.stderr and "batch/s" in out.stderr


def test_progress_bad_arguments() -> None:
    with pytest.raises(ValueError, match="total must be at least 0"):
        pf.progress(total=-1)
    with pytest.raises(TypeError, match="force must be a bool"):
        pf.progress(force="yes")
