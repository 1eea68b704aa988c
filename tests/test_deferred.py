"""Collation without torch in process workers: the same batches, tensors made on arrival."""

from __future__ import annotations

import os
import pickle
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import assume, given, settings

import pipeflow as pf
from pipeflow.parallel.transport._shm import Reader, Writer
from pipeflow.stages._pending import Pending, collate_pending
from tests.light import TorchFree
from tests.test_collate import COLLATE_EXAMPLES, assert_same, batches, outcome


def travel(result: Any) -> Any:
    """A result's trip from a worker to the main process (pipeflow's transport)."""
    writer = Writer(f"pipeflow-test-{os.getpid()}-")
    try:
        data, segment, layout, *_ = writer.encode(result)
        return Reader().decode(0, data, segment, layout)
    finally:
        writer.close()


def arrive(batch: Any) -> Any:
    """What the main process gets from a worker that collated *batch* without torch."""
    return travel(collate_pending(batch))


def sendable(result: Any) -> bool:
    try:
        pickle.dumps(result)
    except Exception:
        return False
    return True


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make_batch", COLLATE_EXAMPLES.values(), ids=COLLATE_EXAMPLES.keys())
def test_arrives_as_default_collate_would_make_it(make_batch: Callable[[], Any]) -> None:
    want, want_error = outcome(pf.default_collate, make_batch())
    got, got_error = outcome(arrive, make_batch())
    if want_error is not None:
        assert type(got_error) is type(want_error)
    elif sendable(collate_pending(make_batch())):  # else no worker could send it either
        assert got_error is None
        assert_same(got, want)


@settings(deadline=None, max_examples=100)
@given(batches)
def test_generated_batches_arrive_as_default_collate_makes_them(batch: list[Any]) -> None:
    assume(sendable(batch))  # generated namedtuple classes live nowhere pickle can find
    assert_same(arrive(batch), pf.default_collate(batch))


def test_leaves_are_pending_numpy_in_the_worker() -> None:
    import numpy as np

    out = collate_pending([(np.zeros(2, np.float32), 1), (np.ones(2, np.float32), 2)])
    assert all(isinstance(leaf, Pending) for leaf in out)


@pytest.mark.parametrize("method", [pytest.param("spawn", marks=pytest.mark.slow), "forkserver"])
def test_spawned_workers_do_not_import_torch_for_default_collate(method: str) -> None:
    ds = TorchFree()
    loader = (
        pf.indices(ds)
        | pf.batch(4)
        | pf.parallel_map(
            pf.fetch(ds) | pf.collate(), workers=2, backend="process", mp_context=method
        )
    )
    batches = list(loader)
    torch = pytest.importorskip("torch")
    assert [b["y"].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11]]
    assert isinstance(batches[0]["x"], torch.Tensor) and batches[0]["x"].dtype == torch.float32
    assert not any(b["torch"].any() for b in batches)  # no worker imported torch
