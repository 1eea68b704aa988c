"""__init__.py: the package namespace — ``import pipeflow`` stays light; DataLoader (and torch
with it) loads on first use."""

from __future__ import annotations

import ast
import subprocess
import sys

import pytest


@pytest.mark.slow
def test_import_pipeflow_does_not_import_torch() -> None:
    code = (
        "import sys, pipeflow as pf\n"
        "list(pf.indices(4) | pf.shuffle(seed=0) | pf.batch(2))\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "pf.DataLoader\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def _run(code: str) -> str:
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    return done.stdout


@pytest.mark.slow
def test_import_pipeflow_imports_none_of_its_stages() -> None:
    out = _run(
        "import sys, pipeflow\n"
        "print(sorted(m for m in sys.modules if m.startswith('pipeflow')))\n"
        "print('numpy' in sys.modules, 'asyncio' in sys.modules)\n"
    )
    assert out.split("\n")[:2] == ["['pipeflow']", "False False"]


def test_every_public_name_resolves_and_stays_the_same_object() -> None:
    import pipeflow as pf

    namespace: dict[str, object] = {}
    exec("from pipeflow import *", namespace)
    for name in pf.__all__:
        value = getattr(pf, name)
        assert value is getattr(pf, name) is namespace[name], name
    assert set(pf.__all__) <= set(dir(pf))
    # the names, the TYPE_CHECKING imports and the table of modules are three lists: in step
    assert set(pf.__all__) == set(pf._WHERE)  # type: ignore[attr-defined]
    with pytest.raises(AttributeError, match="no attribute 'bath'"):
        pf.bath


@pytest.mark.slow
def test_a_submodule_imported_first_leaves_the_public_name_the_function() -> None:
    """``import pipeflow.stages.batch`` binds the module on the package; pf.batch stays the stage."""
    out = _run(
        "import pipeflow.stages.batch, pipeflow.stages.shuffle, pipeflow.stages.fetch, pipeflow.sources.shards\n"
        "import pipeflow as pf\n"
        "print([type(getattr(pf, n)).__name__ for n in ('batch', 'shuffle', 'fetch', 'shards')])\n"
        "print(list(pf.indices(5) | pf.batch(2)))\n"
    )
    assert out.split("\n")[:2] == [
        "['function', 'function', 'function', 'function']",
        "[[0, 1], [2, 3], [4]]",
    ]


@pytest.mark.slow
def test_a_spawn_worker_imports_only_what_its_task_needs() -> None:
    """No reader, shard source or coroutine loop in a worker that runs a plain function."""
    out = _run(
        "import sys\n"
        "sys.path.insert(0, 'tests')\n"
        "import pipeflow as pf\n"
        "from light import pipeflow_modules\n"
        "if __name__ == '__main__':\n"
        "    stage = pf.parallel_map(pipeflow_modules, workers=1, backend='process',"
        " mp_context='spawn')\n"
        "    print(list(pf.indices(1) | stage)[0])\n"
    )
    modules = ast.literal_eval(out)
    assert "pipeflow.parallel.pools._worker" in modules
    for heavy in (
        "pipeflow.sources.readers",
        "pipeflow.sources.shards",
        "pipeflow.stages.batch",
        "asyncio",
    ):
        assert heavy not in modules, modules


@pytest.mark.slow
def test_threads_resolving_a_name_at_once_get_one_object() -> None:
    out = _run(
        "import sys, threading\n"
        "sys.setswitchinterval(1e-6)\n"
        "import pipeflow as pf\n"
        "barrier, seen = threading.Barrier(8), []\n"
        "def look():\n"
        "    barrier.wait()\n"
        "    seen.append([id(getattr(pf, n)) for n in pf.__all__ if n != 'DataLoader'])\n"
        "threads = [threading.Thread(target=look) for _ in range(8)]\n"
        "[t.start() for t in threads]\n"
        "[t.join() for t in threads]\n"
        "print(all(s == seen[0] for s in seen))\n"
    )
    assert out.strip() == "True"


def test_pipeflow_state_is_the_public_face_of_the_resume_protocol() -> None:
    # The protocol lives in pipeflow.resume; pipeflow.state (documented, imported by users'
    # own stages) re-exports its public names as the same objects, and nothing else.
    import pipeflow.resume.state as protocol
    import pipeflow.state as face

    for name in face.__all__:
        assert getattr(face, name) is getattr(protocol, name), name
    assert {"Rule", "Record", "Form", "Int", "Value", "conform", "skipped", "through"} <= set(
        face.__all__
    )
    public = {n for n in vars(face) if not n.startswith("_")} - {"annotations"}
    assert public == set(face.__all__)
