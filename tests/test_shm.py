"""The shared-memory transport: segments are recycled, and a result still in use is never
overwritten. In-process checks of the worker side (``Writer``) and the main side (``Reader``)
over real ``/dev/shm`` files, then the same invariant end to end with real worker processes."""

from __future__ import annotations

import errno
import gc
import os
import subprocess
import sys
import threading
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow import _alloc
from pipeflow.parallel import _segments
from pipeflow.parallel._shm import Reader, Writer

BIG = _segments.INLINE_LIMIT // 4  # float32 elements: an array of this many travels by segment


def shm_used() -> int:
    """Bytes of /dev/shm in use (unlinked files count until their last mapping goes)."""
    st_ = os.statvfs(_segments.SHM_DIR)
    return (st_.f_blocks - st_.f_bfree) * st_.f_frsize


class Link:
    """A worker's writer and the main process's reader, in one process."""

    def __init__(self, keep: int = 16) -> None:
        self.writer = Writer(f"pipeflow-test-{os.getpid()}-{id(self)}-", keep=keep)
        self.reader = Reader()

    def send(self, obj: Any) -> tuple[Any, Any]:
        """One trip; return what arrived and the segment description it came in."""
        freed = self.reader.take_freed(0) or []
        self.writer.release(freed)
        data, segment, layout, retired = self.writer.encode(obj)
        self.writer.unreserve()
        self.reader.retire(0, retired)
        return self.reader.decode(0, data, segment, layout), segment

    def close(self) -> None:
        self.writer.close()
        self.reader.close()


def test_a_dropped_result_gives_its_segment_back_for_the_next_one() -> None:
    link = Link()
    try:
        first, seg1 = link.send(np.full(BIG, 1, dtype=np.float32))
        assert seg1[0] is not None and seg1[1] >= 0  # a new segment, kept by the worker
        del first
        gc.collect()
        second, seg2 = link.send(np.full(BIG, 2, dtype=np.float32))
        assert seg2[0] is None and seg2[1] == seg1[1]  # the same pages, no new file
        assert (second == 2).all()
        held, seg3 = link.send(np.full(BIG, 3, dtype=np.float32))
        assert seg3[1] != seg2[1]  # `second` is still alive: its segment is not reused
        assert (second == 2).all() and (held == 3).all()
    finally:
        link.close()


@given(
    steps=st.lists(
        st.tuples(
            st.integers(1, 6),  # size, in units of BIG elements
            st.booleans(),  # keep the result
            st.booleans(),  # build it with _alloc.empty, as a collate in a worker does
        ),
        min_size=1,
        max_size=40,
    ),
    keep=st.integers(1, 6),
)
@settings(max_examples=60, deadline=None)
def test_a_result_still_in_use_is_never_overwritten(steps, keep) -> None:
    link = Link(keep=keep)
    link.writer.activate()
    held: list[tuple[int, Any]] = []
    try:
        for k, (units, keep_it, in_place) in enumerate(steps):
            if in_place:
                obj: Any = {"x": _alloc.empty((units * BIG,), np.float32), "label": k}
                obj["x"][:] = k
            else:
                obj = {"x": np.full(units * BIG, k, dtype=np.float32), "label": k}
            got, _ = link.send(obj)
            del obj
            assert got["label"] == k and (got["x"] == k).all()
            if keep_it:
                held.append((k, got))
            del got  # no cycles: reference counting frees it (and its segment) here
        for k, got in held:
            assert (got["x"] == k).all(), f"result {k} was overwritten"
        assert len(link.writer.fds) <= keep
    finally:
        link.close()


def test_empty_hands_out_shared_memory_only_in_the_task_thread() -> None:
    link = Link()
    link.writer.activate()
    try:
        first, _ = link.send(np.zeros(4 * BIG, dtype=np.float32))
        del first
        gc.collect()
        link.writer.release(link.reader.take_freed(0) or [])
        other: list[Any] = []
        t = threading.Thread(target=lambda: other.append(_alloc.empty((BIG,), np.float32)))
        t.start()
        t.join()
        assert link.writer.reserved is None  # another thread got plain memory
        mine = _alloc.empty((BIG,), np.float32)
        assert link.writer.reserved is not None
        mine[:] = 7
        got, segment = link.send(mine)
        assert segment[0] is None and (got == 7).all()
    finally:
        link.close()


@pytest.mark.parametrize("method", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_held_batches_stay_intact_across_epochs_and_memory_returns(method, no_leaks) -> None:
    """Real workers: a consumer that keeps some batches (across epochs) sees them unchanged
    while later batches reuse the freed segments; closing frees every page of /dev/shm."""
    gc.collect()
    before = shm_used()
    n, size = 40, 3
    loader = (
        pf.indices(n)
        | pf.batch(size)
        | pf.parallel_map(
            pf.fetch(Wide(n)) | pf.collate(),
            workers=2,
            backend="process",
            mp_context=method,
            persistent=True,
        )
    )
    held = []
    for epoch in range(3):
        for k, batch in enumerate(loader):
            expect = np.arange(k * size, min(n, (k + 1) * size), dtype=np.float32)
            assert (batch[:, 0] == expect).all() and (batch[:, -1] == expect).all()
            if (k + epoch) % 3 == 0:
                held.append((k, batch))
    for k, batch in held:
        expect = np.arange(k * size, min(n, (k + 1) * size), dtype=np.float32)
        assert (batch == expect[:, None]).all(), f"held batch {k} changed"
    loader.close()
    del held, batch
    gc.collect()
    assert shm_used() - before < 1 << 20


class Wide:
    """Samples of 40 KiB: a batch of three travels through a segment."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(10_000, i, dtype=np.float32)


@pytest.fixture
def tiny_shm(tmp_path, monkeypatch):
    """A 1 MiB tmpfs as the segment directory (needs the right to mount; skipped without)."""
    where = tmp_path / "shm"
    where.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(where)], capture_output=True
        )
    except OSError:  # no mount command
        pytest.skip("can't mount a small tmpfs here")
    if mounted.returncode != 0:
        pytest.skip("can't mount a small tmpfs here")
    monkeypatch.setattr(_segments, "SHM_DIR", str(where))
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_a_full_shm_raises_enospc_naming_the_cause(tiny_shm) -> None:
    link = Link()
    try:
        with pytest.raises(OSError, match="is full") as info:
            link.send(np.zeros(2 * 1024 * 1024 // 4, dtype=np.float32))
        assert info.value.errno == errno.ENOSPC
        assert os.listdir(tiny_shm) == []  # the half-made segment is gone
    finally:
        link.close()


def test_a_worker_whose_result_does_not_fit_raises_in_the_consumer(tiny_shm, no_leaks) -> None:
    loader = pf.indices(4) | pf.parallel_map(
        big_array, workers=2, backend="process", mp_context="fork"
    )
    with pytest.raises(OSError, match="is full") as info:
        list(loader)
    assert "could not be sent back" in str(info.value.__notes__)
    assert os.listdir(tiny_shm) == []


def big_array(i: int) -> np.ndarray:
    return np.full(2 * 1024 * 1024 // 4, i, dtype=np.float32)


FILL_THEN_REUSE = """
import sys, os, gc
import numpy as np
from pipeflow import _alloc
from pipeflow.parallel import _segments
from pipeflow.parallel._shm import Reader
from pipeflow.parallel._shm import Writer
from tests.test_shm import Link
_segments.SHM_DIR = sys.argv[1]
link = Link()
link.writer.activate()
n = 300 * 1024 // 4  # its segment is rounded up: the tail is never written by the first result
first, segment = link.send(np.ones(n, dtype=np.float32))
del first
gc.collect()
with open(os.path.join(sys.argv[1], "filler"), "wb") as f:  # fill the rest of the tmpfs
    try:
        while True:
            f.write(bytes(64 * 1024))
            f.flush()
    except OSError:
        pass
link.writer.release(link.reader.take_freed(0) or [])
whole = segment[2] // 4
again = _alloc.empty((whole,), np.float32)  # the whole kept segment, tail included
again[:] = 2  # writes every page: must not SIGBUS on a full tmpfs
got, _ = link.send(again)
assert (got == 2).all()
print("ok")
"""


@pytest.mark.slow
def test_a_kept_segment_never_sigbuses_when_shm_fills_up(tiny_shm) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([root, os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [sys.executable, "-c", FILL_THEN_REUSE, str(tiny_shm)],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        cwd=root,
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "ok"
