"""``collate(pad=...)``: ragged samples padded into tensors, with lengths and masks (issue 26)."""

from __future__ import annotations

import gc
import pickle
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import example, given
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.engine._stage import without_torch
from pipeflow.stages import _collate_torch as pf_collate
from tests.strategies import ragged_lengths
from tests.test_shm import BIG, Link


def collate(batch: list[Any], **options: Any) -> Any:
    """One batch through ``pf.collate(**options)``, as a loader runs it."""
    return next(iter(pf.from_iterable([batch]) | pf.collate(**options)))


# -- the values -------------------------------------------------------------------------------
@given(lengths=ragged_lengths, multiple=st.sampled_from([None, 1, 8]), value=st.integers(-5, 5))
@example(lengths=[0], multiple=8, value=0)
@example(lengths=[3, 3], multiple=None, value=0)
def test_every_item_is_kept_whole_and_the_rest_is_the_pad_value(lengths, multiple, value) -> None:
    items = [np.arange(1, n + 1, dtype=np.int32) * 10 + i for i, n in enumerate(lengths)]
    got = collate(items, pad=value, pad_to_multiple_of=multiple, lengths=True, mask=True)
    longest = max(lengths)
    width = longest if multiple is None else -(-longest // multiple) * multiple
    assert got.values.shape == (len(items), width) and got.values.dtype == torch.int32
    for row, mask, item in zip(got.values, got.mask, items):
        assert row[: len(item)].tolist() == item.tolist()
        assert (row[len(item) :] == value).all()
        assert mask.tolist() == [True] * len(item) + [False] * (width - len(item))
    assert got.lengths.tolist() == lengths and got.lengths.dtype == torch.int64


def test_padding_a_list_of_token_ids_keeps_default_collate_for_the_rest() -> None:
    samples = [{"ids": [5, 6, 7], "label": 0, "text": "a"}, {"ids": [8], "label": 1, "text": "b"}]
    got = collate(samples, pad=0)
    assert got["ids"].tolist() == [[5, 6, 7], [8, 0, 0]]
    assert got["label"].tolist() == [0, 1] and got["text"] == ["a", "b"]


def test_pad_values_by_field_and_none_for_fields_left_to_default_collate() -> None:
    samples = [
        {"ids": np.array([1, 2, 3]), "labels": np.array([1, 2, 3]), "image": np.ones((2, 2))},
        {"ids": np.array([4]), "labels": np.array([4]), "image": np.zeros((2, 2))},
    ]
    got = collate(samples, pad={"ids": 0, "labels": -100})
    assert got["ids"].tolist() == [[1, 2, 3], [4, 0, 0]]
    assert got["labels"].tolist() == [[1, 2, 3], [4, -100, -100]]
    assert got["image"].shape == (2, 2, 2)  # not named: default_collate's stack


def test_nested_dicts_tuples_and_namedtuples_keep_their_structure() -> None:
    class Pair(NamedTuple):
        frames: Any
        label: int

    samples = [
        ({"audio": Pair(np.ones((3, 2), np.float32), 0)}, [1, 2]),
        ({"audio": Pair(np.ones((1, 2), np.float32), 1)}, [3]),
    ]
    audio, ids = collate(samples, pad=(0.0, -1), mask=True)
    assert isinstance(audio["audio"], Pair)
    frames = audio["audio"].frames
    assert frames.values.shape == (2, 3, 2) and frames.values[1, 1:].eq(0).all()
    assert frames.mask[1].tolist() == [[True, True], [False, False], [False, False]]
    assert audio["audio"].label.tolist() == [0, 1]  # a number: default_collate
    assert ids.values.tolist() == [[1, 2], [3, -1]] and ids.lengths is None


def test_items_ragged_in_every_dimension_are_padded_in_each() -> None:
    boxes = [np.ones((2, 4)), np.ones((3, 1))]
    got = collate(boxes, pad=0.0, lengths=True)
    assert got.values.shape == (2, 3, 4)
    assert got.lengths.tolist() == [[2, 4], [3, 1]]  # each item's shape
    assert got.values.sum().item() == 8 + 3


def test_tensors_and_tensors_numpy_cannot_view() -> None:
    items = [torch.ones(3, dtype=torch.bfloat16), torch.ones(1, dtype=torch.bfloat16)]
    got = collate(items, pad=0, mask=True)
    assert got.values.dtype == torch.bfloat16 and got.values.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert got.mask.tolist() == [[True, True, True], [True, False, False]]
    grads = [torch.ones(2, requires_grad=True), torch.ones(1, requires_grad=True)]
    assert collate(grads, pad=0).tolist() == [[1, 1], [1, 0]]
    plain = collate([torch.arange(3), torch.arange(1)], pad=-1)
    assert plain.tolist() == [[0, 1, 2], [0, -1, -1]] and plain.dtype == torch.int64


# -- what is refused ----------------------------------------------------------------------------
def test_a_pad_value_the_dtype_cannot_hold_is_refused_naming_the_field() -> None:
    samples = [{"ids": np.array([1, 2], np.uint8)}, {"ids": np.array([1], np.uint8)}]
    with pytest.raises(
        ValueError, match=r"pad value -1 must fit the items\['ids'\], of dtype uint8"
    ):
        collate(samples, pad=-1)
    with pytest.raises(ValueError, match=r"pad value 0\.5"):
        collate([np.array([1]), np.array([1, 2])], pad=0.5)


def test_a_pad_that_does_not_match_the_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="names the field 'idz'"):
        collate([{"ids": [1]}, {"ids": [1, 2]}], pad={"idz": 0})
    with pytest.raises(ValueError, match="gives values by position"):
        collate([{"ids": [1]}], pad=(0,))
    with pytest.raises(RuntimeError, match="padding keeps the number of dimensions"):
        collate([np.ones(2), np.ones((2, 2))], pad=0)


def test_without_pad_ragged_items_still_fail_and_the_message_names_the_fix() -> None:
    with pytest.raises(RuntimeError, match=r"pad them with pf.collate\(pad=...\)"):
        collate([np.ones(2), np.ones(3)])


# -- where the arrays are made ------------------------------------------------------------------
def test_in_a_worker_without_torch_the_batch_is_numpy_until_it_arrives() -> None:
    stage = pf.collate(pad={"ids": 0}, pad_to_multiple_of=4, lengths=True, mask=True)
    samples = [{"ids": [1, 2, 3], "y": 1.5}, {"ids": [4], "y": 2.5}]
    made = next(without_torch(stage).apply(iter([samples]), pf.Context(0)))
    assert not isinstance(made["ids"].values, torch.Tensor)  # numpy, wrapped for the trip
    arrived = pickle.loads(pickle.dumps(made))
    expected = collate(samples, pad={"ids": 0}, pad_to_multiple_of=4, lengths=True, mask=True)
    for field in ("values", "lengths", "mask"):
        assert torch.equal(getattr(arrived["ids"], field), getattr(expected["ids"], field))
    assert torch.equal(arrived["y"], expected["y"])


def test_in_a_process_worker_a_padded_batch_is_made_in_the_segment_it_travels_in() -> None:
    link = Link()
    link.writer.activate()  # this thread is now a worker's task thread: _alloc hands out shm
    try:
        first, _ = link.send(np.zeros(4 * BIG, dtype=np.float32))  # a segment to keep...
        del first
        gc.collect()
        link.writer.release(link.reader.take_freed(0) or [])  # ...that is free again
        items = [np.full(BIG, 7, np.float32), np.full(BIG // 2, 7, np.float32)]
        batch = collate(items, pad=0.0, mask=True)
        assert link.writer.reserved is not None  # the padded batch took the segment's pages
        got, _ = link.send(batch)
        assert torch.equal(got.values, batch.values) and torch.equal(got.mask, batch.mask)
    finally:
        link.close()


def test_in_a_torch_dataloader_worker_the_batch_is_in_torch_shared_memory(monkeypatch) -> None:
    monkeypatch.setattr(pf_collate, "_in_worker", lambda: True)
    monkeypatch.setattr("pipeflow.stages.pad._in_worker", lambda: True)
    got = collate([np.ones(3, np.float32), np.ones(1, np.float32)], pad=0.0, lengths=True)
    assert got.values.is_shared() and got.lengths.is_shared()


class Ragged:
    """Samples of lengths 1, 2, 3, ... (a module-level dataset, so it pickles)."""

    def __len__(self) -> int:
        return 23

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"ids": np.arange(i % 7 + 1, dtype=np.int64), "label": i}


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_parallel_workers_give_the_batches_the_main_process_gives(backend: str, no_leaks) -> None:
    ds = Ragged()
    work = pf.fetch(ds) | pf.collate(pad=0, pad_to_multiple_of=8, mask=True)
    alone = list(pf.indices(ds) | pf.batch(4) | work)
    with pf.indices(ds) | pf.batch(4) | pf.parallel_map(work, workers=2, backend=backend) as par:
        together = list(par)
    assert len(alone) == len(together) == 6
    for a, b in zip(alone, together):
        assert torch.equal(a["ids"].values, b["ids"].values)
        assert torch.equal(a["ids"].mask, b["ids"].mask)
        assert torch.equal(a["label"], b["label"])
