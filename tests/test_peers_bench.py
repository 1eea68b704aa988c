"""The peers suite's own behaviour (``python -m pipeflow bench peers``): what it says of a peer
that is not installed, how it judges a row against a peer near the machine's limit, and that
its first-batch child leaves no worker behind. Its speed is measured by running it, not here.
"""

from __future__ import annotations

import math
import os
import subprocess
import time
from typing import Any

import pytest

from benchmarks import datasets as data
from benchmarks import peers, peers_first


def _tiny() -> peers.Workload:
    return peers.Workload("tiny", data.Points(512), 64, "process", 2)


def test_a_missing_peer_is_a_row_that_says_how_to_install_it(monkeypatch) -> None:
    # only torch counts as installed: the other three must be rows with a note, not errors
    monkeypatch.setattr(peers, "installed", lambda peer: peer == "torch")
    rows = peers.one(_tiny(), quick=True)
    by_peer = {row.workload.split()[0]: row for row in rows}
    assert set(by_peer) == {"torch", "nodes", "grain", "spdl"}
    assert by_peer["torch"].pipeflow > 0 and by_peer["torch"].torch > 0
    assert by_peer["torch"].met is not None
    for peer in ("nodes", "grain", "spdl"):
        assert math.isnan(by_peer[peer].torch)
        assert "not installed, skipped (pip install 'pipeflow[peers]')" in by_peer[peer].note


def test_near_the_limit_the_goal_is_five_percent_of_it(monkeypatch) -> None:
    # a peer at 93% of the limit leaves no room for 1.1x: pipeflow at 96% of it meets the goal,
    # at 90% it does not, though both read as about 1x the peer
    def rates(ours: float) -> dict[str, list[float]]:
        return {"pipeflow": [ours], "torch": [930.0], "one core": [500.0]}

    monkeypatch.setattr(peers, "installed", lambda peer: peer == "torch")
    w = _tiny()
    for ours, met in ((960.0, True), (900.0, False)):
        monkeypatch.setattr(peers, "compare", lambda make, reps, ours=ours: rates(ours))
        (row, *_) = peers.one(w, quick=True)
        assert row.met is met, (ours, row.note)
        assert row.note.startswith("limit 1,000/s")


def _stat(pid: int) -> tuple[str, int] | None:
    """A process's state letter and session, or None once it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state, _ppid, _pgrp, session = f.read().rsplit(")", 1)[1].split()[:4]
    except (OSError, ValueError):
        return None
    return state, int(session)


def _running_in(session: int) -> set[int]:
    """The processes of *session* still running (not zombies)."""
    running = set()
    for entry in filter(str.isdigit, os.listdir("/proc")):
        st = _stat(int(entry))
        if st is not None and st[0] != "Z" and st[1] == session:
            running.add(int(entry))
    return running


def test_the_first_batch_child_times_a_spawn_loader_and_leaves_nothing(monkeypatch) -> None:
    children: list[int] = []
    popen = subprocess.Popen

    def recorded(*args: Any, **kwargs: Any) -> subprocess.Popen[Any]:
        proc = popen(*args, **kwargs)
        children.append(proc.pid)
        return proc

    monkeypatch.setattr(subprocess, "Popen", recorded)
    seconds = peers_first.measure("pipeflow", "numpy", timeout=120)
    assert 0 < seconds < 120
    (child,) = children
    # the child leads a session of its own, and its warm server and its workers are in it (an
    # orphan too, its parent now init): the session is killed, and none of it may still run
    # once a killed process has had RELIABILITY.md's 2 s to finish dying (one orphan was once
    # seen still 'R' at once). Only this session: other programs' processes come and go.
    deadline = time.monotonic() + 2.0
    while (running := _running_in(child)) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not running, running


def test_a_child_that_fails_says_why() -> None:
    with pytest.raises(RuntimeError, match=r"(?s)gave no first batch: .*unknown library 'nope'"):
        peers_first.measure("nope", "numpy", timeout=60)


def test_first_batch_near_the_floor_the_goal_is_five_percent_of_it(monkeypatch) -> None:
    # SPDL at 1.05x the floor leaves no room for 1.1x sooner: pipeflow at 1.04x the floor
    # meets the goal, at 1.10x it does not; far from the floor 1.1x sooner is asked
    monkeypatch.setattr(peers, "installed", lambda peer: peer == "spdl")
    monkeypatch.setattr(peers_first, "floor", lambda shape: 1.0)
    for ours, spdl, met in ((1.04, 1.05, True), (1.10, 1.05, False), (0.40, 0.50, True)):
        times = {"pipeflow": ours, "spdl": spdl}
        monkeypatch.setattr(peers_first, "measure", lambda lib, shape, t=times: t[lib])
        rows = {row.workload.split()[0]: row for row in peers.first_batch("torch", quick=True)}
        assert rows["spdl"].met is met, (ours, spdl, rows["spdl"].note)
        assert rows["spdl"].note.startswith("floor 1.000 s")
    assert "not installed" in rows["grain"].note
