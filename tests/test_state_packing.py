"""A process worker's states travel pickled by :func:`pipeflow.resume._states.dumps`: every
tensor comes back equal, of the same dtype, shape and strides, and tensors that shared a
storage still share one; tensors it cannot carry as bytes are pickled as torch does."""

from __future__ import annotations

import pickle
from typing import Any

import pytest
import torch

from pipeflow.resume._states import Packed, dumps, pack, unpacked


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, torch.Tensor):
        return (
            type(a) is type(b)
            and a.dtype == b.dtype
            and a.shape == b.shape
            and a.stride() == b.stride()
            and a.requires_grad == b.requires_grad
            and bool(torch.equal(a.detach(), b.detach()))
        )
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(map(_same, a, b))
    return bool(a == b)


base = torch.arange(24, dtype=torch.float32).reshape(4, 6)
CASES = {
    "plain": torch.arange(5),
    "view": base[1:3, 2:5],
    "transposed": base.t(),
    "empty": torch.empty(0, 3),
    "bool": torch.tensor([True, False, True]),
    "bfloat16": torch.arange(4, dtype=torch.bfloat16),
    "int8 scalar": torch.tensor(7, dtype=torch.int8),
    "needs grad": torch.ones(3, requires_grad=True),
    "parameter": torch.nn.Parameter(torch.zeros(2)),
    "nested in a dict": {"a": [torch.arange(3), {"b": torch.ones(2, 2)}], "n": 3},
}


@pytest.mark.parametrize("name", list(CASES))
def test_a_tensor_comes_back_as_it_went(name: str) -> None:
    value = CASES[name]
    assert _same(value, pickle.loads(dumps(value)))


def test_tensors_that_shared_a_storage_still_share_one() -> None:
    whole = torch.arange(10)
    a, b = pickle.loads(dumps([whole[:5], whole[5:]]))
    a[0] = 99
    assert a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
    assert b.tolist() == [5, 6, 7, 8, 9]


def test_a_packed_state_is_the_state_when_it_was_packed() -> None:
    live = {"seen": [1, 2], "t": torch.zeros(2)}
    packed = pack({"dataset": live, "rng": b"raw"})
    live["seen"].append(3)  # the dataset goes on after the reply was sent
    live["t"] += 1
    assert isinstance(packed["dataset"], Packed) and packed["rng"] == b"raw"
    again = pickle.loads(pickle.dumps(packed))
    state = unpacked(again)
    assert state is not None
    assert state["dataset"]["seen"] == [1, 2] and state["dataset"]["t"].tolist() == [0.0, 0.0]
