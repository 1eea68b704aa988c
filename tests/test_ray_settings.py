"""``backend="ray"`` when a stage is built: what is refused, with which words, and that
nothing of Ray is imported before a pass runs (no Ray is started here: see test_ray.py)."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import pytest

import pipeflow as pf
from pipeflow.parallel.ray._ray_options import REFUSED, actor_options


def square(x: int) -> int:
    return x * x


async def asquare(x: int) -> int:
    return x * x


@pytest.mark.parametrize("key", sorted(REFUSED))
def test_ray_options_that_would_change_how_pipeflow_runs_actors_are_refused(key: str) -> None:
    with pytest.raises(ValueError, match=rf"parallel_map: ray_options can't set '{key}'"):
        pf.parallel_map(square, workers=2, backend="ray", ray_options={key: 1})


@pytest.mark.parametrize(
    ("options", "backend", "error", "words"),
    [
        ({"num_cpus": 1}, "thread", ValueError, "ray_options applies to backend='ray' only"),
        ({"num_cpus": 1}, "process", ValueError, "ray_options applies to backend='ray' only"),
        ([("num_cpus", 1)], "ray", TypeError, "ray_options must be a mapping"),
        ({1: 2}, "ray", TypeError, "ray_options keys must be option names"),
        ({"num_cpu": 1}, "ray", ValueError, "ray_options must hold Ray actor options"),
    ],
)
def test_bad_ray_options_are_refused_when_built(
    options: Any, backend: str, error: type[Exception], words: str
) -> None:
    with pytest.raises(error, match=rf"^parallel_map: {words}"):
        pf.parallel_map(square, workers=2, backend=backend, ray_options=options)
    with pytest.raises(error, match=rf"^parallel_source: {words}"):
        pf.parallel_source(pf.indices(3), workers=2, backend=backend, ray_options=options)


def test_what_the_ray_backend_cannot_run_is_refused_when_built() -> None:
    with pytest.raises(ValueError, match="backend='ray' runs plain functions"):
        pf.parallel_map(asquare, workers=2, backend="ray")
    with pytest.raises(ValueError, match="restarts applies to backend='process' or 'ray'"):
        pf.parallel_map(square, workers=2, backend="thread", restarts=1)
    with pytest.raises(ValueError, match="mp_context applies to backend='process' only"):
        pf.parallel_map(square, workers=2, backend="ray", mp_context="spawn")


def test_a_ray_stage_shows_its_backend_and_options() -> None:
    stage = pf.parallel_map(
        square, workers=3, backend="ray", restarts=2, ray_options={"num_cpus": 0.5}, seed=1
    )
    assert repr(stage) == (
        "parallel_map(square, workers=3, backend='ray', restarts=2, "
        "ray_options={'num_cpus': 0.5}, seed=1)"
    )
    assert actor_options({"num_cpus": 0.5}) == {"num_cpus": 0.5, "scheduling_strategy": "SPREAD"}


def test_without_ray_installed_the_stage_is_refused_with_the_fix() -> None:
    code = (
        "import sys; sys.modules['ray'] = None\n"
        "import importlib.util as u; u.find_spec = lambda name, *a: None\n"
        "import pipeflow as pf\n"
        "try:\n"
        "    pf.parallel_map(abs, workers=2, backend='ray')\n"
        "except ModuleNotFoundError as e:\n"
        "    print(e)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert "pip install 'pipeflow[ray]'" in out.stdout, out


def test_building_a_ray_stage_imports_neither_ray_nor_torch() -> None:
    code = (
        "import sys, pipeflow as pf\n"
        "loader = pf.indices(4) | pf.parallel_map(abs, workers=2, backend='ray')\n"
        "repr(loader)\n"
        "assert 'ray' not in sys.modules and 'torch' not in sys.modules, 'imported'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
