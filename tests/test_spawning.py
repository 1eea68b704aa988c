"""Where worker processes can't start (issue 27): the messages say what to write instead.

Real scripts in real processes, each under a timeout: a process loader iterated inside a
process worker, and a script that starts spawn (or forkserver) workers at its top level,
without the ``if __name__ == "__main__":`` guard.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from pipeflow._spawning import Start, death_hint, guarded

ROOT = Path(__file__).resolve().parents[1]


def run_script(tmp_path: Path, code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(code), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        cwd=tmp_path,
        check=False,
    )


NESTED = """
    import pipeflow as pf


    def inner(i):
        return sum(pf.indices(4) | pf.parallel_map(abs, workers=2, backend="process"))


    if __name__ == "__main__":
        outer = pf.indices(2) | pf.parallel_map(inner, workers=2, backend="process")
        try:
            list(outer)
        except pf.PipeflowError as e:
            print(type(e).__name__, e)
"""


@pytest.mark.slow
def test_a_process_loader_inside_a_process_worker_says_use_threads(tmp_path: Path) -> None:
    done = run_script(tmp_path, NESTED, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "daemonic" not in done.stdout
    assert done.stdout.startswith(
        "PipeflowError parallel stage 'parallel_map' can't start worker processes here: this "
        "process is itself a worker process ('pipeflow-parallel_map-"
    )
    assert "Give the inner stage backend='thread' (or workers=0)" in done.stdout
    fixed = NESTED.replace('abs, workers=2, backend="process"', 'abs, workers=2, backend="thread"')
    assert run_script(tmp_path, fixed, timeout=60).stdout == ""  # the fix works: no error


UNGUARDED = """
    import multiprocessing
    multiprocessing.set_start_method({method!r}, force=True)
    import pipeflow as pf
    pf.set_warm_start({warm})

    loader = pf.indices(4) | pf.parallel_map(abs, workers=2, backend="process")
    print(list(loader))
"""


@pytest.mark.slow
@pytest.mark.parametrize(
    ("method", "warm"),
    [("spawn", True), ("spawn", False), ("forkserver", True)],
    ids=["spawn", "spawn-cold", "forkserver"],
)
def test_workers_started_without_the_main_guard_say_where_the_guard_goes(
    tmp_path: Path, method: str, warm: bool
) -> None:
    done = run_script(tmp_path, UNGUARDED.format(method=method, warm=warm))
    assert done.returncode == 1
    lines = done.stderr.strip().splitlines()
    assert lines[-1].startswith("pipeflow.errors.WorkerDiedError: parallel stage 'parallel_map'")
    assert "exited with code 1 while holding sample indices [" in lines[-1]
    assert "; not delivered: " in lines[-1]  # what the pass lost, then what to do, last
    assert lines[-1].endswith(
        f". Under {method!r} each worker imports the main script (train.py) again, and its line 8, "
        'which started these workers, is not under `if __name__ == "__main__":`: every worker '
        "would start workers of its own. Put the code that iterates the loader under that "
        "guard (functions and the loader itself may stay above it)"
    )
    # Each worker says why it stops in one line, not multiprocessing's 40-line RuntimeError.
    assert "freeze_support" not in done.stderr and "forkserver.py" not in done.stderr
    stops = [ln for ln in lines if ln.startswith("pipeflow: worker process")]
    assert stops and all("train.py again" in ln for ln in stops)
    assert len(lines) < 40


@pytest.mark.slow
def test_the_same_script_with_the_guard_runs(tmp_path: Path) -> None:
    guarded_code = UNGUARDED.format(method="spawn", warm=True).replace(
        "print(list(loader))", 'if __name__ == "__main__":\n        print(list(loader))'
    )
    done = run_script(tmp_path, guarded_code)
    assert (done.returncode, done.stdout) == (0, "[0, 1, 2, 3]\n"), done.stderr[-2000:]


def test_the_guard_is_found_around_the_line(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text(
        "import x\n"  # 1
        "def main():\n"  # 2
        "    return 1\n"  # 3
        "main()\n"  # 4
        "if __name__ == '__main__':\n"  # 5
        "    main()\n"  # 6
        "    for i in []:\n"  # 7
        "        pass\n",  # 8
        encoding="utf-8",
    )
    assert [guarded(Start(str(script), line)) for line in (1, 4, 6, 8)] == [
        False,
        False,
        True,
        True,
    ]
    assert guarded(Start(str(tmp_path / "missing.py"), 1)) is None
    (tmp_path / "page.md").write_text("Not *Python*: a page.\n", encoding="utf-8")
    assert guarded(Start(str(tmp_path / "page.md"), 1)) is None


def test_the_hint_is_for_spawn_and_forkserver_only(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("print(1)\n", encoding="utf-8")
    assert death_hint("fork", Start(str(script), 1)) == ""
    assert "its line 1, which started these workers" in death_hint("spawn", Start(str(script), 1))
    unknown = death_hint("forkserver", None)
    assert "what it printed above says why it stopped" in unknown
