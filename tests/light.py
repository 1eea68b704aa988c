"""A dataset module that does not import torch (for workers that must not need it)."""

from __future__ import annotations

import sys

import numpy as np


class TorchFree:
    """Reports, in each sample, whether torch was imported in the process that loaded it."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> dict[str, object]:
        return {"x": np.full(3, i, dtype=np.float32), "y": i, "torch": "torch" in sys.modules}


def pipeflow_modules(i: int) -> list[str]:
    """The pipeflow modules (and asyncio, if any) imported in the process that runs this."""
    return sorted(m for m in sys.modules if m.startswith("pipeflow") or m == "asyncio")
