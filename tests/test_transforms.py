"""stages/transforms.py: map, filter and random_map — what a failed ``map`` says."""

from __future__ import annotations

import pytest

import pipeflow as pf


def test_map_error_names_the_stage_and_item() -> None:
    def boom(x: int) -> int:
        if x == 3:
            raise ValueError("bad 3")
        return x

    loader = pf.indices(5) | pf.map(boom)
    loader.set_epoch(2)
    with pytest.raises(ValueError, match="bad 3") as info:
        list(loader)
    assert info.value.__notes__ == ["pipeflow: stage 'map' failed on item 3 (epoch 2)"]
