"""stages/progress.py: pf.progress() — silent off a terminal, a bar when forced, checked arguments."""

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


LOGS_DURING_A_BAR = """
import logging, sys
import pipeflow as pf
{setup}

def load(i):
    if i == 3:
        raise OSError("cut short")
    return i

loader = pf.indices(6) | pf.map(load) | pf.ignore_errors() | pf.progress(unit="batch", force=True)
print(list(loader))
logging.getLogger("pipeflow").warning("after the bar")
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    "setup",
    ["", "logging.basicConfig(format='%(levelname)s %(message)s')"],
    ids=["no logging configured", "basicConfig"],
)
def test_a_warning_during_a_bar_is_written_above_it_not_over_it(setup: str) -> None:
    """Issue 27: `13/13 [00:03<00:00, 2.51batch/s]pipeflow: ignore_errors dropped 1 ...` -
    the warning went onto the bar's line. Now the bar's line is cleared first, the warning
    has a line of its own, and the handlers are as they were after the bar."""
    code = LOGS_DURING_A_BAR.format(setup=setup)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, check=True)
    assert out.stdout == b"[0, 1, 2, 4, 5]\n"
    stderr = out.stderr.decode()  # as written: "\r" kept
    prefix = "WARNING " if setup else ""
    warning = f"{prefix}pipeflow: ignore_errors dropped 1 failed item in epoch 0"
    before, found, after = stderr.partition(warning)
    assert found, stderr
    cleared = before.rsplit("\r", 2)  # the bar's line, then "\r", blanks over it, "\r"
    assert len(cleared) == 3 and cleared[1].strip() == "" and cleared[2] == "", repr(before)
    assert "batch/s]" in cleared[0]
    assert after.split("\n", 1)[0].endswith("OSError: cut short")  # a line of its own
    assert stderr.endswith(f"\n{prefix}after the bar\n")  # handlers as before, after the bar


def test_the_handlers_are_given_back_when_the_bar_ends() -> None:
    import logging

    root = logging.getLogger()
    handler = logging.StreamHandler(sys.stderr)
    root.addHandler(handler)
    last_resort = logging.lastResort
    try:
        it = iter(pf.indices(3) | pf.progress(force=True))
        next(it)
        assert handler.stream is not sys.stderr and logging.lastResort is not last_resort
        list(it)
        assert handler.stream is sys.stderr and logging.lastResort is last_resort
    finally:
        root.removeHandler(handler)
