"""The shared-memory transport: segments are recycled, and a result still in use is never
overwritten. In-process checks of the worker side (``Writer``) and the main side (``Reader``)
over real ``/dev/shm`` files, then the same invariant end to end with real worker processes."""

from __future__ import annotations

import contextlib
import errno
import gc
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.parallel import _kept
from pipeflow.parallel.transport import _segments
from pipeflow.parallel.transport._shm import Reader, Writer
from pipeflow.stages import _alloc
from tests.conftest import children
from tests.faults import Sleepy

BIG = _segments.INLINE_LIMIT // 4  # float32 elements: an array of this many travels by segment


def own_shm() -> dict[int, int]:
    """The /dev/shm files this process's pools hold, inode -> bytes: their segment files
    still there, and the unlinked ones that a mapping or a file descriptor of this process or
    of one of its children (the workers) keeps alive. Not ``statvfs``: that counts every
    program's files, and another one's use would fail the test."""
    prefix = os.path.join(_segments.SHM_DIR, f"pipeflow-{os.getpid()}-")  # segment_prefix's
    held: dict[int, int] = {}

    def hold(inode: int, nbytes: int) -> None:
        held[inode] = max(held.get(inode, 0), nbytes)

    for entry in os.scandir(_segments.SHM_DIR):
        if entry.path.startswith(prefix):
            with contextlib.suppress(OSError):  # unlinked meanwhile: counted below if kept
                hold(entry.inode(), entry.stat().st_size)
    for pid in {os.getpid(), *children()}:
        with contextlib.suppress(OSError):  # a worker that has just exited
            for fd in os.listdir(f"/proc/{pid}/fd"):
                link = f"/proc/{pid}/fd/{fd}"
                with contextlib.suppress(OSError):
                    if os.readlink(link).startswith(prefix):
                        st_ = os.stat(link)
                        hold(st_.st_ino, st_.st_size)
            with open(f"/proc/{pid}/maps") as f:
                for line in f:
                    span, _, _, _, inode, *path = line.split()
                    if path and path[0].startswith(prefix):
                        start, end = (int(a, 16) for a in span.split("-"))
                        hold(int(inode), end - start)
    return held


def own_shm_bytes(besides: set[int]) -> int:
    """Bytes of :func:`own_shm`, but for the files *besides* (say, a dead process's that
    had this pid: there before the test)."""
    return sum(n for inode, n in own_shm().items() if inode not in besides)


def own_shm_left(besides: set[int], within: float = 2.0) -> int:
    """:func:`own_shm_bytes` once it is 0, or after *within* seconds (RELIABILITY.md's bound
    for workers to stop), what is still held."""
    deadline = time.monotonic() + within
    while (left := own_shm_bytes(besides)) and time.monotonic() < deadline:
        time.sleep(0.02)
    return left


class Link:
    """A worker's writer and the main process's reader, in one process."""

    def __init__(self, keep: int = 16, keep_bytes: int | None = None) -> None:
        prefix = f"pipeflow-test-{os.getpid()}-{id(self)}-"
        self.writer = Writer(prefix, keep=keep, keep_bytes=keep_bytes)
        self.reader = Reader()
        self.piped = False  # the last result came through the pipe

    def send(self, obj: Any) -> tuple[Any, Any]:
        """One trip; return what arrived and the segment description it came in."""
        freed = self.reader.take_freed(0) or []
        self.writer.release(freed)
        data, segment, layout, retired, self.piped = self.writer.encode(obj)
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
    keep_units=st.integers(0, 12),
)
@settings(max_examples=60, deadline=None)
def test_a_result_still_in_use_is_never_overwritten(steps, keep, keep_units) -> None:
    """... and what a worker keeps stays within its budget, by count and by bytes."""
    budget = keep_units * BIG * 4
    link = Link(keep=keep, keep_bytes=budget)
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
            assert sum(link.writer.sizes.values()) <= budget
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
    before = set(own_shm())
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
    in_segments = sum(b.nbytes for _, b in held if b.nbytes >= _segments.INLINE_LIMIT)
    assert own_shm_bytes(before) >= in_segments > 0  # the measure sees the batches held
    loader.close()
    del held, batch
    gc.collect()
    left = own_shm_left(before)
    assert left == 0, f"{left:,} bytes of /dev/shm still held after close"


class Wide:
    """Samples of 40 KiB: a batch of three travels through a segment."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(10_000, i, dtype=np.float32)


@contextlib.contextmanager
def mounted_shm(where: Any, size: str, monkeypatch: Any) -> Iterator[Any]:
    """A tmpfs of *size* at *where* as the segment directory (needs the right to mount;
    skipped without). Fork workers see it too: they inherit the module's setting."""
    where.mkdir()
    try:
        mounted = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)],
            capture_output=True,
        )
    except OSError:  # no mount command
        pytest.skip("can't mount a small tmpfs here")
    if mounted.returncode != 0:
        pytest.skip("can't mount a small tmpfs here")
    monkeypatch.setattr(_segments, "SHM_DIR", str(where))
    try:
        yield where
    finally:
        subprocess.run(["umount", str(where)], check=True)


@pytest.fixture
def tiny_shm(tmp_path, monkeypatch):
    """A 1 MiB tmpfs as the segment directory."""
    with mounted_shm(tmp_path / "shm", "1m", monkeypatch) as where:
        yield where


@pytest.fixture
def shm_64m(tmp_path, monkeypatch):
    """A 64 MiB tmpfs as the segment directory, used by nothing else: its usage is ours."""
    with mounted_shm(tmp_path / "shm", "64m", monkeypatch) as where:
        yield where


def used(where: Any) -> int:
    """Bytes in use in the tmpfs at *where* (unlinked files count until unmapped)."""
    st_ = os.statvfs(where)
    return (st_.f_blocks - st_.f_bfree) * st_.f_frsize


def test_a_full_shm_names_itself_and_the_fix(tiny_shm) -> None:
    with pytest.raises(OSError, match=r"is full.*--shm-size") as info:
        _segments.write_segment("pipeflow-test-full", [bytes(2 << 20)], 2 << 20, 2 << 20)
    assert info.value.errno == errno.ENOSPC
    assert os.listdir(tiny_shm) == []  # the half-made segment is gone


def test_a_result_that_does_not_fit_comes_through_the_pipe(tiny_shm) -> None:
    link = Link()
    try:
        got, segment = link.send(np.full(2 * 1024 * 1024 // 4, 5, dtype=np.float32))
        assert segment is None and link.piped
        assert (got == 5).all()
        assert os.listdir(tiny_shm) == []  # the half-made segment is gone
    finally:
        link.close()


def test_a_full_shm_gives_back_the_free_kept_segments(tiny_shm) -> None:
    """600 KiB kept and free, then 700 KiB: both don't fit in 1 MiB. That one comes through
    the pipe, and the kept one goes back, so that the next one fits."""
    link = Link(keep_bytes=1 << 20)
    try:
        first, segment = link.send(np.ones(600 * 1024 // 4, dtype=np.float32))
        assert segment[1] >= 0  # kept
        del first
        gc.collect()
        for k, piped in [(2, True), (3, False)]:
            got, segment = link.send(np.full(700 * 1024 // 4, k, dtype=np.float32))
            assert link.piped == piped and (segment is None) == piped
            assert (got == k).all()
            del got
            gc.collect()
    finally:
        link.close()


def test_a_worker_whose_result_does_not_fit_sends_it_through_the_pipe(
    tiny_shm, no_leaks, caplog
) -> None:
    """Batches larger than /dev/shm: the epoch completes, one warning names /dev/shm and
    the fix, and nothing is left there."""
    loader = pf.indices(4) | pf.parallel_map(
        big_array, workers=2, backend="process", mp_context="fork"
    )
    got = list(loader)
    assert [int(a[0]) for a in got] == [0, 1, 2, 3]
    warned = [r.getMessage() for r in caplog.records if "is full" in r.getMessage()]
    assert len(warned) == 1 and str(tiny_shm) in warned[0] and "--shm-size" in warned[0]
    assert os.listdir(tiny_shm) == []


def test_a_kept_pool_holds_nothing_in_shm_between_epochs(shm_64m, no_leaks, monkeypatch) -> None:
    """Persistent workers: once an epoch's batches are dropped and no epoch follows within
    ``TRIM_AFTER`` (0.2 s here), the pool's shared memory is all back (the workers live on),
    and the next epoch is exact."""
    monkeypatch.setattr(_kept, "TRIM_AFTER", 0.2)
    n, size = 36, 4  # batches of 160 KiB: each travels in a segment a worker would keep
    loader = pf.indices(n) | pf.batch(size)
    loader = loader | pf.parallel_map(
        pf.fetch(Wide(n)) | pf.collate(),
        workers=2,
        backend="process",
        mp_context="fork",
        persistent=True,
    )
    try:
        for _ in range(2):
            firsts = [int(b[0, 0]) for b in loader]
            assert firsts == list(range(0, n, size))
            gc.collect()
            deadline = time.monotonic() + _kept.TRIM_AFTER + 2
            while used(shm_64m) > 0 and time.monotonic() < deadline:
                time.sleep(0.02)  # the workers drop theirs as they read the pipe
            assert used(shm_64m) == 0, f"{used(shm_64m):,} bytes held between epochs"
    finally:
        loader.close()


def big_array(i: int) -> np.ndarray:
    return np.full(2 * 1024 * 1024 // 4, i, dtype=np.float32)


def test_results_through_the_pipe_never_time_out_a_healthy_worker(tiny_shm) -> None:
    """``/dev/shm`` full: 2 MiB results come through the pipe, which holds far less. While
    the consumer holds a result, the worker waits on its send, and begins its next item (of
    50 ms, ``timeout=0.8``: room for a busy machine) only once this process reads that result,
    1 s after the worker was done with the one before: that wait must not count as time
    on the item."""
    stage = pf.parallel_map(
        Sleepy(big_array, 0.05), workers=1, backend="process", max_in_flight=8, timeout=0.8
    )
    got = 0
    for _ in pf.indices(16) | stage:
        got += 1
        if got in (3, 4):
            time.sleep(1.0)
    assert got == 16


FILL_THEN_REUSE = """
import sys, os, gc
import numpy as np
from pipeflow.stages import _alloc
from pipeflow.parallel.transport import _segments
from pipeflow.parallel.transport._shm import Reader
from pipeflow.parallel.transport._shm import Writer
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
