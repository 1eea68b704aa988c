"""pf.shared_list: a read-only list whose pages forked workers share instead of copying."""

from __future__ import annotations

import copy
import gc
import multiprocessing
import os
import pickle

import numpy as np
import pytest

from pipeflow.shared import SharedList, shared_list

ITEMS = [{"id": i, "name": f"n{i}", "tags": ["a"] * (i % 3), "x": i / 3} for i in range(50)]


def test_sequence_behaves_like_the_list() -> None:
    s = shared_list(ITEMS)
    assert len(s) == len(ITEMS)
    assert list(s) == ITEMS
    assert [s[i] for i in range(-50, 50)] == ITEMS + ITEMS
    assert s[np.int64(3)] == ITEMS[3]  # any __index__
    assert list(reversed(s)) == ITEMS[::-1]
    assert ITEMS[7] in s
    assert s.index(ITEMS[9]) == 9
    assert s.count(ITEMS[1]) == 1


@pytest.mark.parametrize(
    "sl",
    [slice(None), slice(3, 9), slice(None, None, -2), slice(40, 2, -7), slice(60, 70), slice(5, 5)],
)
def test_slices_are_shared_lists_of_the_items(sl: slice) -> None:
    part = shared_list(ITEMS)[sl]
    assert isinstance(part, SharedList)
    assert list(part) == ITEMS[sl]


def test_items_are_fresh_copies() -> None:
    s = shared_list(ITEMS)
    s[1]["tags"].append("b")
    assert s[1] == ITEMS[1]
    assert s[1] is not s[1]


def test_generator_and_empty_inputs() -> None:
    assert list(shared_list(x * x for x in range(4))) == [0, 1, 4, 9]
    empty = shared_list([])
    assert len(empty) == 0
    assert list(empty) == []
    assert empty.nbytes == 0
    with pytest.raises(IndexError, match=r"must be in \[0, 0\) \(got 0\)"):
        empty[0]


def test_numpy_items_come_back_writable_and_independent() -> None:
    s = shared_list([np.arange(5), np.ones((2, 3), dtype=np.float32)])
    a = s[0]
    a[0] = 99
    assert s[0][0] == 0
    assert s[1].dtype == np.float32
    assert s[1].shape == (2, 3)


def test_errors_name_the_rule_and_the_value() -> None:
    with pytest.raises(TypeError, match=r"not a str .*pass \[text\]"):
        shared_list("abc")
    with pytest.raises(TypeError, match=r"must be iterable \(got int\)"):
        shared_list(3)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"got item 2 of type 'generator'"):
        shared_list([1, 2, (x for x in ())])
    s = shared_list([1, 2])
    with pytest.raises(IndexError, match=r"must be in \[-2, 2\) \(got -3\)"):
        s[-3]
    with pytest.raises(TypeError, match=r"integers or slices \(got str\)"):
        s["0"]  # type: ignore[call-overload]


def test_read_only_and_factory_only() -> None:
    s = shared_list([1])
    with pytest.raises(AttributeError, match="read-only"):
        s._data = b""  # type: ignore[misc]
    with pytest.raises(AttributeError, match="read-only"):
        del s._ends
    with pytest.raises(TypeError, match=r"shared_list\(items\)"):
        SharedList()
    with pytest.raises(TypeError):
        hash(s)
    assert shared_list(s) is s
    assert copy.copy(s) is s
    assert copy.deepcopy(s) is s


def test_equality_is_by_items() -> None:
    assert shared_list([1, 2]) == shared_list([1, 2])
    assert shared_list([1, 2]) != shared_list([2, 1])
    assert shared_list([{"a": 1, "b": 2}]) == shared_list([{"b": 2, "a": 1}])  # other pickles
    assert shared_list([1]) != [1]  # like tuple != list


@pytest.mark.parametrize("protocol", range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_pickles_with_every_protocol(protocol: int) -> None:
    s = shared_list(ITEMS)
    data = pickle.dumps(s, protocol=protocol)
    if protocol >= 3:  # protocol 2 has no bytes opcodes: it pickles bytes as latin-1 text
        assert len(data) < s.nbytes + 200  # the buffer once, not item by item
    back = pickle.loads(data)
    assert back == s
    assert list(back) == ITEMS


def test_pickles_out_of_band_without_copying() -> None:
    s = shared_list(ITEMS)
    buffers: list[pickle.PickleBuffer] = []
    data = pickle.dumps(s, protocol=5, buffer_callback=buffers.append)
    assert len(data) < 200
    back = pickle.loads(data, buffers=[memoryview(b) for b in buffers])
    assert list(back) == ITEMS


def _private_dirty_kb() -> int:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1])
    raise AssertionError


def _read_all(s: SharedList[object], conn: multiprocessing.connection.Connection) -> None:
    before = _private_dirty_kb()
    for _ in range(3):
        for i in range(len(s)):
            s[i]
    conn.send(_private_dirty_kb() - before)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps_rollup"), reason="Linux only")
def test_a_forked_reader_copies_almost_nothing() -> None:
    s = shared_list({"id": i, "name": f"item-{i}"} for i in range(200_000))  # ~8 MB
    gc.collect()
    # The objects of this process (the whole test session's) kept out of the child's
    # collections: a full one would touch every page they are on, whatever the list does.
    gc.freeze()
    try:
        ctx = multiprocessing.get_context("fork")
        here, there = ctx.Pipe()
        p = ctx.Process(target=_read_all, args=(s, there))
        p.start()
        grew_kb = here.recv()
        p.join()
    finally:
        gc.unfreeze()
    assert grew_kb < 0.1 * s.nbytes / 1024, grew_kb  # the plain list: ~100 %


@pytest.mark.slow
def test_spawned_torch_dataloader_gets_the_items() -> None:
    torch = pytest.importorskip("torch")
    s = shared_list([np.full(3, i, dtype=np.float32) for i in range(10)])
    loader = torch.utils.data.DataLoader(
        s, batch_size=4, num_workers=2, multiprocessing_context="spawn"
    )
    got = torch.cat(list(loader))
    assert got[:, 0].tolist() == list(range(10))
