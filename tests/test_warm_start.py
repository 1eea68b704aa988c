"""The warm start: spawn and forkserver workers forked from a server that imported the main
script, torch and the dataset's modules once, yet as fresh as a spawn worker.

The main checks run a script in a new interpreter (the server imports *its* main script), in
the issue's setting: the main script and the dataset's module both import torch.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
import warnings
from pathlib import Path
from typing import Any

import pytest

import pipeflow as pf
from pipeflow.parallel.pools import _warm, _zygote
from tests.conftest import children

ROOT = Path(__file__).resolve().parents[1]

DATASET = """
import os, random, sys
import numpy as np
import torch
import torch.utils.data as tud
import pipeflow as pf

COUNT = [0]   # a module global each worker mutates
INITED = []   # worker_init_fn's calls in this worker


def init(worker_id):
    INITED.append(worker_id)


class Probe:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        t, p = tud.get_worker_info(), pf.get_worker_info()
        before, COUNT[0] = COUNT[0], COUNT[0] + 1
        seen, self.mark = getattr(self, "mark", None), "set by an earlier item"
        print(f"printed by worker {t.id}", flush=True)
        return dict(
            i=i, pid=os.getpid(), ppid=os.getppid(), before=before, seen=seen,
            inited=list(INITED), env=os.environ.get("PROBE"),
            draws=[random.random(), float(np.random.rand()), float(torch.rand(1))],
            torch_info=[t.id, t.num_workers, t.seed], pf_info=p and [p.id, p.num_workers, p.seed],
        )


def square(i):
    return dict(i=i * i, pid=os.getpid(), ppid=os.getppid())
"""

MAIN = """
import json, os, sys, time
import torch
import torch.utils.data as tud

import pipeflow as pf
from warm_probe import Probe, init, square


ONE = []  # one dataset for every loader, as a script's train and validation loaders


def loader(kind, **kw):
    g = torch.Generator().manual_seed(7)
    cls = tud.DataLoader if kind == "torch" else pf.DataLoader
    return cls(ONE[0], batch_size=None, num_workers=2, generator=g, worker_init_fn=init, **kw)


def rows(kind, **kw):
    return [{k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in r.items()}
            for r in loader(kind, **kw)]


if __name__ == "__main__":
    out = {"main": os.getpid()}
    ONE.append(Probe())
    out["first"] = rows("pf", multiprocessing_context="spawn")
    os.environ["PROBE"] = "set after the server started"
    saved = os.dup(1)
    with open(sys.argv[1], "w") as f:  # the workers' stdout follows this process's
        os.dup2(f.fileno(), 1)
        out["second"] = rows("pf", multiprocessing_context="spawn")
        os.dup2(saved, 1)
    out["torch"] = rows("torch", multiprocessing_context="spawn")
    stage = pf.parallel_map(square, workers=2, backend="process", mp_context="forkserver")
    out["forkserver"] = list(pf.indices(4) | stage)
    from pipeflow.parallel.pools import _warm
    out["server"] = _warm._STATE["servers"][True]._forkserver_pid
    pf.set_warm_start(False)
    out["off"] = rows("pf", multiprocessing_context="spawn")
    print(json.dumps(out))
"""


def run_script(tmp_path: Path, main: str, *args: str, env: dict[str, str] | None = None) -> Any:
    (tmp_path / "warm_probe.py").write_text(DATASET)
    (tmp_path / "warm_main.py").write_text(textwrap.dedent(main))
    environ = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    environ.pop("PIPEFLOW_WARM_START", None)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "warm_main.py"), *args],
        cwd=tmp_path,
        env={**environ, **(env or {})},
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def gone(pids: set[int], budget: float = 2.0) -> set[int]:
    """The pids of *pids* still alive (not zombies) after up to *budget* seconds."""
    deadline = time.monotonic() + budget
    while True:
        alive = {p for p in pids if _alive(p)}
        if not alive or time.monotonic() > deadline:
            return alive
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("warm")
    out = run_script(tmp, MAIN, str(tmp / "second.out"))
    out["second_stdout"] = (tmp / "second.out").read_text()
    return out


@pytest.mark.slow
def test_later_loaders_come_from_the_warm_server(probe: Any) -> None:
    server, main = probe["server"], probe["main"]
    assert server != main
    for run in ("first", "second", "forkserver"):
        assert {r["ppid"] for r in probe[run]} == {server}, run
    assert len({r["pid"] for r in probe["second"]}) == 2
    assert not {r["pid"] for r in probe["first"]} & {r["pid"] for r in probe["second"]}


@pytest.mark.slow
def test_warm_workers_are_fresh(probe: Any) -> None:
    for run in ("first", "second"):
        by_worker: dict[int, list[Any]] = {}
        for r in probe[run]:
            by_worker.setdefault(r["pid"], []).append(r)
        for items in by_worker.values():
            # the module global as at import, then counting this worker's items only
            assert [r["before"] for r in items] == list(range(len(items)))
            # nothing of the dataset of loader 1's workers, nor of another worker
            assert items[0]["seen"] is None
            # worker_init_fn ran once, in this worker, for this loader
            assert items[0]["inited"] == [items[0]["torch_info"][0]]


@pytest.mark.slow
def test_seeds_and_worker_info_as_torch_gives(probe: Any) -> None:
    torch_rows = {r["i"]: r for r in probe["torch"]}
    for run in ("first", "second", "off"):
        for r in probe[run]:
            ref = torch_rows[r["i"]]
            assert r["draws"] == ref["draws"], (run, r["i"])
            assert r["torch_info"] == ref["torch_info"]
            assert r["pf_info"] == ref["torch_info"]


@pytest.mark.slow
def test_environment_and_stdout_are_the_main_process_s_now(probe: Any) -> None:
    assert {r["env"] for r in probe["first"]} == {None}
    assert {r["env"] for r in probe["second"]} == {"set after the server started"}
    assert "printed by worker 0" in probe["second_stdout"]
    assert "printed by worker 1" in probe["second_stdout"]


@pytest.mark.slow
def test_turned_off_gives_plain_spawn_workers(probe: Any, tmp_path: Path) -> None:
    assert {r["ppid"] for r in probe["off"]} == {probe["main"]}
    main = MAIN.replace('out["server"] = _warm._STATE["servers"][True]._forkserver_pid', "")
    out = run_script(tmp_path, main, str(tmp_path / "x.out"), env={"PIPEFLOW_WARM_START": "0"})
    for run in ("first", "second"):
        assert {r["ppid"] for r in out[run]} == {out["main"]}, run


@pytest.mark.slow
def test_nothing_left_after_exit(probe: Any) -> None:
    pids = {probe["server"]} | {r["pid"] for run in ("first", "second") for r in probe[run]}
    assert gone(pids) == set()
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"pipeflow-{probe['main']}-")]


KILLED = """
import os, sys, time
import torch
import pipeflow as pf
from warm_probe import square

if __name__ == "__main__":
    stage = pf.parallel_map(square, workers=2, backend="process", mp_context="spawn",
                            persistent=True)
    loader = pf.indices(4) | stage
    pids = {r["pid"] for r in loader} | {r["ppid"] for r in loader}
    print(" ".join(map(str, pids)), flush=True)
    time.sleep(60)
"""


@pytest.mark.slow
def test_the_server_and_its_workers_exit_when_the_main_process_is_killed(tmp_path: Path) -> None:
    (tmp_path / "warm_probe.py").write_text(DATASET)
    (tmp_path / "warm_main.py").write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(tmp_path)])}
    env.pop("PIPEFLOW_WARM_START", None)
    proc = subprocess.Popen(
        [sys.executable, str(tmp_path / "warm_main.py")],
        env=env,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        pids = {int(p) for p in proc.stdout.readline().split()}
        assert len(pids) == 3  # two workers and the server
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert gone(pids) == set()


# -- in this process ----------------------------------------------------------------------------
def double(i: int) -> int:
    return 2 * i


def server_pids() -> set[int]:
    return {s._forkserver_pid for s in _warm._STATE["servers"].values()}


def test_a_spawn_stage_in_this_process_leaves_nothing(no_leaks: None) -> None:
    stage = pf.parallel_map(double, workers=2, backend="process", mp_context="spawn")
    assert list(pf.indices(5) | stage) == [0, 2, 4, 6, 8]
    assert server_pids()
    assert all(children(pid) == set() for pid in server_pids())


async def later_double(i: int) -> tuple[int, int]:
    return 2 * i, os.getppid()


def test_coroutine_workers_start_warm_too(no_leaks: None) -> None:
    stage = pf.parallel_map(later_double, workers=2, backend="process", mp_context="spawn")
    out = list(pf.indices(4) | stage)
    assert [x for x, _ in out] == [0, 2, 4, 6]
    ppids = {ppid for _, ppid in out}
    assert len(ppids) == 1 and ppids <= server_pids()


def has_torch(i: int) -> tuple[bool, int]:
    return "torch" in sys.modules, os.getppid()


@pytest.mark.slow
def test_a_torch_free_job_is_not_served_by_a_server_with_torch() -> None:
    import functools

    torch = pytest.importorskip("torch")
    _warm._stop()
    try:  # first a job whose pickle names torch: its server preloads torch
        stage = pf.parallel_map(
            functools.partial(torch.add, other=1), workers=1, backend="process", mp_context="spawn"
        )
        assert [int(t) for t in pf.from_iterable([torch.tensor(1)]) | stage] == [2]
        with_torch = server_pids()
        # then one that needs no torch: a server of its own, and workers without torch
        stage = pf.parallel_map(has_torch, workers=2, backend="process", mp_context="spawn")
        out = list(pf.indices(4) | stage)
        assert {t for t, _ in out} == {False}
        assert {ppid for _, ppid in out} <= server_pids() - with_torch
    finally:
        _warm._stop()
        _warm.ensure_running()


def test_fork_and_threads_are_left_alone() -> None:
    import multiprocessing

    fork = multiprocessing.get_context("fork")
    assert _warm.warm_context(fork) is fork
    assert _warm.warm_context(multiprocessing.get_context("spawn")).get_start_method() == "spawn"


def test_switches(monkeypatch: pytest.MonkeyPatch) -> None:
    spawn = __import__("multiprocessing").get_context("spawn")
    monkeypatch.setenv(_warm.ENV, "0")
    try:
        assert _warm.warm_context(spawn) is spawn
        pf.set_warm_start(True)  # the function wins over the variable
        assert _warm.warm_context(spawn) is not spawn
        pf.set_warm_start(None)  # the variable again: off
        assert _warm.warm_context(spawn) is spawn
        with pytest.raises(TypeError, match="enabled must be a bool"):
            pf.set_warm_start("no")  # type: ignore[arg-type]
    finally:
        monkeypatch.undo()


def test_a_failing_server_falls_back_to_plain_spawn(monkeypatch: pytest.MonkeyPatch) -> None:
    class Broken:
        owner = os.getpid()
        _forkserver_alive_fd = _forkserver_pid = None

        def connect_to_new_process(self, fds: Any) -> Any:
            raise ConnectionRefusedError("refused")

    _warm._stop()
    monkeypatch.setattr(_zygote, "new_server", lambda modules: Broken())
    try:
        stage = pf.parallel_map(double, workers=1, backend="process", mp_context="spawn")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert list(pf.indices(3) | stage) == [0, 2, 4]
        assert any("plain spawn" in str(w.message) for w in caught)
        assert not _warm.active()
    finally:
        monkeypatch.undo()
        _warm._STATE["broken"] = False
        _warm.ensure_running()


def test_the_modules_a_pickle_names() -> None:
    import pickle

    from tests.faults import RaiseAt

    assert "tests.faults" in _warm.pickled_modules(pickle.dumps(RaiseAt(3)))
    assert _warm.pickled_modules(b"not a pickle") == set()
