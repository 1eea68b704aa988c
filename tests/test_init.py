"""__init__.py: the package namespace — ``import pipeflow`` stays light; DataLoader (and torch
with it) loads on first use."""

from __future__ import annotations

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
