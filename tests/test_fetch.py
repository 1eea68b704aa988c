"""stages/fetch.py: fetch — what a failed load says (the sample index, the batch, a lying ``len``)."""

from __future__ import annotations

import pytest

import pipeflow as pf


class FailAt:
    def __init__(self, bad: int) -> None:
        self.bad = bad

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(f"cannot load {i}")
        return i


def test_fetch_error_keeps_type_and_names_stage_index_and_batch() -> None:
    loader = pf.indices(10) | pf.batch(4) | pf.fetch(FailAt(6))
    with pytest.raises(KeyError) as info:
        list(loader)
    notes = info.value.__notes__
    assert notes == [
        "pipeflow: stage 'fetch' failed on sample index 6 (batch [4, 5, 6, 7], epoch 0)"
    ]
    assert info.traceback[-1].name == "__getitem__"  # the original traceback is kept


def test_lying_len_names_index_and_length() -> None:
    class Liar:
        def __len__(self) -> int:
            return 5

        def __getitem__(self, i: int) -> int:
            if i >= 3:
                raise IndexError(i)
            return i

    with pytest.raises(IndexError) as info:
        list(pf.indices(Liar()) | pf.fetch(Liar()))
    assert "sample index 3" in info.value.__notes__[0]
    assert "length is 5" in info.value.__notes__[0]
