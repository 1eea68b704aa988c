"""Large batches are collated into buffers that earlier batches gave back (issue 37: fresh
19 MB buffers made the collate in worker threads pay for new pages, from 2 to 56 ms a batch),
and never into a buffer that an array or tensor still views."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch

import pipeflow as pf
from pipeflow.stages import _alloc


def _images(n: int) -> list[np.ndarray]:
    """Samples of 48 KiB: a batch of 32 is 1.5 MiB, over RECYCLE_MIN."""
    return [np.full((3, 64, 64), i, np.float32) for i in range(n)]


def _check(batch: torch.Tensor, first: int) -> None:
    expected = np.arange(first, first + len(batch), dtype=np.float32)
    assert (batch.numpy() == expected[:, None, None, None]).all()


def test_batches_held_keep_their_own_buffers_and_values() -> None:
    data = _images(12 * 32)
    work = pf.fetch(data) | pf.collate()
    loader = pf.indices(len(data)) | pf.batch(32) | pf.parallel_map(work, workers=2)
    held = list(loader)
    assert len({b.data_ptr() for b in held}) == len(held)
    for k, batch in enumerate(held):  # none written again by a later batch
        _check(batch, 32 * k)


def test_a_dropped_batch_buffer_serves_a_later_batch_in_worker_threads() -> None:
    data = _images(24 * 32)
    work = pf.fetch(data) | pf.collate()
    loader = pf.indices(len(data)) | pf.batch(32) | pf.parallel_map(work, workers=2)
    addresses = set()
    for k, batch in enumerate(loader):
        _check(batch, 32 * k)
        addresses.add(batch.data_ptr())
        del batch
    assert len(addresses) < 12  # 24 batches: the buffers went round


def test_in_the_main_thread_dropped_batches_buffers_serve_the_next_ones() -> None:
    data = _images(8 * 32)
    loader = pf.indices(len(data)) | pf.batch(32) | pf.fetch(data) | pf.collate()
    addresses = set()
    for k, batch in enumerate(loader):
        _check(batch, 32 * k)
        addresses.add(batch.data_ptr())
        del batch
    assert len(addresses) <= 3  # the pipeline's generators hold the last batch a while
    held = list(loader)
    assert len({b.data_ptr() for b in held}) == len(held)
    for k, batch in enumerate(held):
        _check(batch, 32 * k)


def test_a_buffer_goes_back_only_when_its_last_view_is_gone() -> None:
    r = _alloc.Recycler()
    a = r.empty((2, 1 << 19), "float32")
    tensor = torch.from_numpy(a)
    row = a[1]
    del a
    assert r.waiting() == 0
    del tensor
    assert r.waiting() == 0
    del row
    assert r.waiting() == 1


def test_the_recycler_keeps_at_most_its_budget_and_serves_near_sizes_only() -> None:
    r = _alloc.Recycler(keep=2)
    arrays = [r.empty((1 << 20,), np.uint8) for _ in range(3)]
    del arrays
    assert r.waiting() == 2
    big = r.empty((4 << 20,), np.uint8)  # no waiting buffer is near its size
    assert r.waiting() == 2
    small = r.empty((1 << 20,), np.uint8)
    assert r.waiting() == 1
    tiny = r.empty((100,), np.float32)  # under RECYCLE_MIN: numpy.empty's
    assert tiny.base is None
    del big, small
    assert r.waiting() == 2  # keep=2: the third given back is freed
    r.trim()
    assert r.waiting() == 0


def test_uninitialised_like_numpy_empty_in_any_dtype_and_shape() -> None:
    r = _alloc.Recycler(least=0)
    for dtype in ("float64", "int16", "bool", "complex64"):
        a = r.empty((3, 5, 7), dtype)
        assert a.shape == (3, 5, 7) and a.dtype == np.dtype(dtype)
        assert a.flags.c_contiguous and a.flags.writeable
        a[...] = 1
        assert (a == 1).all()
    assert r.empty((2,), object).base is None  # object arrays: numpy.empty's


@pytest.mark.skipif(not hasattr(os, "fork"), reason="fork")
def test_a_forked_child_starts_with_no_waiting_buffers() -> None:
    a = _alloc.RECYCLED.empty((1 << 20,), np.uint8)
    del a
    assert _alloc.RECYCLED.waiting() >= 1
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _alloc.RECYCLED.waiting() == 0 else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
