"""loader.stats(): the numbers, the bottleneck, the table, the plot; and pf.progress()."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

import pipeflow as pf


def slow(x: int) -> int:
    time.sleep(0.002)
    return x


def test_counts_and_times_add_up() -> None:
    loader = pf.indices(200) | pf.batch(10) | pf.map(lambda b: [slow(i) for i in b[:2]])
    for _ in range(2):
        list(loader)
    stats = loader.stats()
    assert [s.name for s in stats.stages] == ["indices", "batch", "map"]
    assert [s.items for s in stats.stages] == [400, 40, 40]
    assert stats.passes == 2
    own = sum(s.own_seconds for s in stats.stages)
    # Fast stages are timed on a sample of their items: the sum is exact up to that estimate.
    assert own == pytest.approx(stats.stages[-1].seconds, rel=0.05)
    assert stats.consumer_wait_seconds <= stats.wall_seconds
    assert stats.stages[-1].own_seconds > 0.1  # 80 sleeps of 2 ms
    json.dumps(stats.to_dict())


def test_a_slow_single_threaded_stage_is_the_bottleneck() -> None:
    loader = pf.indices(60) | pf.map(slow) | pf.map(abs)
    list(loader)
    stats = loader.stats()
    assert stats.bottleneck == "map"
    assert "parallel_map" in stats.advice
    assert "bottleneck: map:" in str(stats)


def test_busy_workers_are_the_bottleneck() -> None:
    loader = pf.indices(80) | pf.parallel_map(slow, workers=2)
    list(loader)
    s = loader.stats()
    par = s.stages[-1]
    assert par.workers == 2
    assert par.worker_busy is not None and par.worker_busy > 0.5
    assert par.item_seconds_p50 == pytest.approx(0.002, abs=0.003)
    assert par.queue_occupancy is not None and 0 < par.queue_occupancy <= 1
    assert s.bottleneck == "parallel_map" and "more workers" in s.advice


def test_a_slow_consumer_means_the_loader_keeps_up() -> None:
    loader = pf.indices(30) | pf.batch(3)
    for _ in loader:
        time.sleep(0.01)
    stats = loader.stats()
    assert stats.bottleneck == "consumer"
    assert stats.consumer_wait_fraction < 0.1


def test_reset_stats() -> None:
    loader = pf.indices(10)
    list(loader)
    loader.reset_stats()
    assert loader.stats().stages[0].items == 0
    assert loader.stats().bottleneck == "none"


def test_plot_draws_a_png(tmp_path) -> None:
    pytest.importorskip("matplotlib")
    loader = pf.indices(2000) | pf.batch(10) | pf.map(lambda b: time.sleep(0.001) or b)
    list(loader)
    path = tmp_path / "stats.png"
    loader.stats().plot(str(path))
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_plot_without_matplotlib_says_how_to_install(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    loader = pf.indices(3)
    list(loader)
    with pytest.raises(ImportError, match=r'pip install "pipeflow\[plot\]"'):
        loader.stats().plot("x.png")


def test_stats_cost_little_on_tiny_items() -> None:
    # Not a timing test: the recorded work per item is two clock reads and a few adds, and
    # here it is checked to be counted for every item of every stage.
    loader = pf.indices(1000) | pf.map(abs) | pf.map(abs)
    assert sum(1 for _ in loader) == 1000
    assert [s.items for s in loader.stats().stages] == [1000, 1000, 1000]


# -- progress -----------------------------------------------------------------------------------
def test_progress_is_silent_when_output_is_not_a_terminal() -> None:
    code = "import pipeflow as pf; list(pf.indices(50) | pf.progress())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stderr == "" and out.stdout == ""


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
