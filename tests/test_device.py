"""pin_memory and to_device: CPU behaviour here, GPU behaviour where a GPU is present."""

from __future__ import annotations

import threading
import time
import traceback
import warnings
from collections import namedtuple

import pytest
import torch

import pipeflow as pf
from pipeflow.engine._failure import Failure
from pipeflow.stages import device as device_module

Pair = namedtuple("Pair", ["x", "y"])
HAS_CUDA = torch.cuda.is_available()


def nested(i: int) -> dict:
    return {
        "a": torch.full((2,), float(i)),
        "b": [torch.ones(1), (torch.zeros(1), "s")],
        "p": Pair(torch.tensor([i]), i),
    }


@pytest.mark.skipif(HAS_CUDA, reason="checks the no-accelerator path")
def test_pin_memory_without_accelerator_warns_once_and_passes_through(monkeypatch) -> None:
    monkeypatch.setattr(device_module, "_WARNED", threading.Event())
    batches = [nested(i) for i in range(3)]
    with pytest.warns(UserWarning, match="no accelerator"):
        out = list(pf.from_iterable(batches) | pf.pin_memory())
    assert all(a is b for a, b in zip(out, batches))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        list(pf.from_iterable(batches) | pf.pin_memory())  # once only


def test_to_device_cpu_moves_nested_batches() -> None:
    out = next(iter(pf.from_iterable([nested(1)]) | pf.to_device("cpu")))
    assert out["a"].tolist() == [1.0, 1.0]
    assert isinstance(out["p"], Pair) and out["p"].y == 1
    assert out["b"][1][1] == "s"


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="prefetch"):
        pf.pin_memory(prefetch=0)
    with pytest.raises(ValueError, match="to_device: device"):
        pf.to_device("not-a-device")
    with pytest.raises(TypeError, match="non_blocking"):
        pf.to_device("cpu", non_blocking="yes")


def slow_double(x: int) -> int:
    time.sleep(0.01)
    return 2 * x


def test_in_thread_keeps_order_overlaps_and_stops() -> None:
    before = threading.active_count()
    it = device_module.in_thread(iter(range(100)), slow_double, 2, name="t")
    assert [next(it) for _ in range(5)] == [0, 2, 4, 6, 8]
    it.close()
    deadline = time.monotonic() + 30  # a leak, told from a slow exit on a busy machine
    while threading.active_count() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert threading.active_count() == before


def test_in_thread_passes_a_failed_item_on_as_a_failure_and_goes_on() -> None:
    def boom(x: int) -> int:
        if x == 3:
            raise KeyError("three")
        return x

    out = list(device_module.in_thread(iter(range(10)), boom, 2, name="t"))
    failed = out[3]
    assert isinstance(failed, Failure) and isinstance(failed.error, KeyError)
    assert traceback.extract_tb(failed.error.__traceback__)[-1].name == "boom"
    assert out[:3] + out[4:] == [0, 1, 2, 4, 5, 6, 7, 8, 9]


def test_in_thread_raises_what_its_source_raises() -> None:
    def source():
        yield 1
        raise KeyError("source")

    it = device_module.in_thread(source(), lambda x: x, 2, name="t")
    assert next(it) == 1
    with pytest.raises(KeyError, match="source"):
        next(it)


@pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA GPU")
def test_gpu_pinned_and_async_copies_are_correct() -> None:
    batches = [nested(i) for i in range(20)]
    pinned = list(pf.from_iterable(batches) | pf.pin_memory())
    assert all(b["a"].is_pinned() and b["p"].x.is_pinned() for b in pinned)
    moved = list(pf.from_iterable(batches) | pf.pin_memory() | pf.to_device("cuda"))
    for i, b in enumerate(moved):
        assert b["a"].device.type == "cuda"
        assert b["a"].cpu().tolist() == [float(i), float(i)]
