"""The planning step (``pipeflow/engine/_plan.py``): what it computes equals what running gives,
it resumes exactly, and every row of ``stats()`` counts the items that passed it."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.engine._plan import Computed, Positions
from tests.strategies import batch_sizes, seeds


def _rows(loader: pf.Loader[Any]) -> list[tuple[str, int]]:
    return [(s.name, s.items) for s in loader.stats().stages]


# -- stats tell the truth ---------------------------------------------------------------------
def test_every_row_counts_the_items_that_passed_it() -> None:
    loader = pf.indices(1000) | pf.shuffle(seed=0) | pf.batch(10)
    assert len(list(loader)) == 100
    assert _rows(loader) == [("indices → shuffle → batch (computed)", 100)]
    loader = pf.indices(1000) | pf.shuffle(seed=0) | pf.batch(10) | pf.map(len) | pf.filter(bool)
    assert sum(loader) == 1000
    assert _rows(loader) == [
        ("indices → shuffle → batch (computed)", 100),
        ("map", 100),
        ("filter", 100),
    ]


def test_a_stage_that_does_not_compute_ends_the_plan() -> None:
    loader = pf.indices(20) | pf.map(int) | pf.shuffle(seed=1) | pf.batch(5)
    assert len(list(loader)) == 4
    assert _rows(loader) == [("indices", 20), ("map", 20), ("shuffle", 20), ("batch", 4)]
    assert loader.plan().fused == 0
    assert "#" not in repr(loader)


def test_rows_count_what_an_early_break_took() -> None:
    loader = pf.indices(1000) | pf.shuffle(seed=0) | pf.batch(10)
    it = iter(loader)
    for _ in range(3):
        next(it)
    it.close()  # type: ignore[attr-defined]
    assert _rows(loader) == [("indices → shuffle → batch (computed)", 3)]


@pytest.mark.parametrize("ordered", [True, False])
def test_a_parallel_map_after_indices_reads_it_directly_and_the_row_counts_it(
    ordered: bool,
) -> None:
    loader = pf.indices(300) | pf.parallel_map(abs, workers=2, ordered=ordered) | pf.batch(10)
    assert loader.plan().direct
    got = [x for batch in loader for x in batch]
    assert got == list(range(300)) if ordered else sorted(got) == list(range(300))
    assert [s.items for s in loader.stats().stages] == [300, 300, 30]
    list(loader)  # a second pass adds to the counts
    assert [s.items for s in loader.stats().stages] == [600, 600, 60]
    assert "parallel_map reads indices directly, in runs" in repr(loader)


def test_a_direct_read_stopped_early_counts_what_the_workers_took() -> None:
    loader = pf.indices(10_000) | pf.parallel_map(abs, workers=2, max_in_flight=4)
    it = iter(loader)
    assert [next(it) for _ in range(10)] == list(range(10))
    it.close()  # type: ignore[attr-defined]
    taken, mapped = (s.items for s in loader.stats().stages)
    assert mapped == 10
    assert 10 <= taken <= 10 + 4 + 4  # what was consumed, plus at most what was in flight


# -- the plan is visible ----------------------------------------------------------------------
def test_the_plan_is_shown_in_the_repr_and_by_plan() -> None:
    loader = pf.indices(8) | pf.shuffle(seed=3) | pf.shard(1, 2) | pf.batch(2) | pf.map(len)
    assert repr(loader) == (
        "indices(8)\n"
        "| shuffle(seed=3)\n"
        "| shard(rank=1, world_size=2, drop_last=False)\n"
        "| batch(size=2, drop_last=False)\n"
        "| map(fn=len)\n"
        "# computed as one source: indices → shuffle → shard → batch"
    )
    planned = loader.plan()
    assert isinstance(planned.source, Computed)
    assert planned.fused == 3
    assert [s.name for s in planned.stages] == ["map"]
    assert planned.names() == ["indices → shuffle → shard → batch (computed)", "map"]


def test_a_loader_built_with_seeds_prints_the_same_text_every_time() -> None:
    def build() -> pf.Loader[Any]:
        return pf.indices(8) | pf.shuffle(seed=0) | pf.parallel_map(abs, workers=2, seed=5)

    assert repr(build()) == repr(build())
    drawn = pf.indices(8) | pf.shuffle()
    assert "shuffle(seed=None, drawn " in repr(drawn)


# -- computed equals read ---------------------------------------------------------------------
def _pipelines(
    n: int, shuffle: str | None, seed: int, share: tuple[int, int, bool] | None, size: int | None
) -> tuple[pf.Loader[Any], pf.Loader[Any]]:
    """The same pipeline twice: computed (the planner sees positions) and read (a ``map``
    right after ``indices`` hides them, so every stage runs on items)."""
    stages: list[pf.Stage[Any, Any]] = []
    if shuffle is not None:
        stages.append(pf.shuffle(seed=seed % 2**63, generator=shuffle))
    if share is not None:
        rank, world, drop_last = share
        stages.append(pf.shard(rank, world, drop_last=drop_last))
    if size is not None:
        stages.append(pf.batch(size))
    computed, read = pf.indices(n), pf.indices(n) | pf.map(int)
    for s in stages:
        computed, read = computed | s, read | s
    return computed, read


shares = st.none() | st.integers(1, 5).flatmap(
    lambda w: st.tuples(st.integers(0, w - 1), st.just(w), st.booleans())
)
kinds = st.sampled_from([None, "numpy", "torch"])


@given(
    n=st.integers(0, 3000),
    shuffle=kinds,
    seed=seeds,
    share=shares,
    size=st.none() | batch_sizes,
    epoch=st.integers(0, 3),
)
@example(n=1024 + 4096 + 3, shuffle="numpy", seed=3, share=(1, 3, False), size=7, epoch=0)
@example(n=7, shuffle=None, seed=0, share=(4, 5, False), size=None, epoch=0)  # padding wraps
def test_what_the_plan_computes_is_what_the_stages_yield(
    n: int,
    shuffle: str | None,
    seed: int,
    share: tuple[int, int, bool] | None,
    size: int | None,
    epoch: int,
) -> None:
    computed, read = _pipelines(n, shuffle, seed, share, size)
    computed.set_epoch(epoch)
    read.set_epoch(epoch)
    assert computed.plan().fused == (shuffle is not None) + (share is not None) + (size is not None)
    assert read.plan().fused == 0
    assert list(computed) == list(read)
    assert len(computed) == len(read)


@given(
    n=st.integers(1, 2000),
    shuffle=kinds,
    seed=seeds,
    share=shares,
    size=st.none() | batch_sizes,
    data=st.data(),
)
def test_a_computed_source_resumes_exactly_in_a_new_loader(
    n: int,
    shuffle: str | None,
    seed: int,
    share: tuple[int, int, bool] | None,
    size: int | None,
    data: st.DataObject,
) -> None:
    loader, _ = _pipelines(n, shuffle, seed, share, size)
    total = len(loader)
    k = data.draw(st.integers(0, total), label="items before the state")
    it = iter(loader)
    got = [next(it) for _ in range(k)]
    state = loader.state_dict()
    resumed, _ = _pipelines(n, shuffle, seed, share, size)
    resumed.load_state_dict(state)
    got.extend(resumed)
    _, read = _pipelines(n, shuffle, seed, share, size)
    assert got == list(read)
    assert resumed.stats().stages[0].items == total - k


def test_a_computed_shard_still_numbers_its_outputs_for_random_map() -> None:
    def draw(x: int, rng: Any) -> tuple[int, float]:
        return x, float(rng.random())

    computed = pf.indices(9) | pf.shard(1, 3) | pf.random_map(draw, seed=4)
    read = pf.indices(9) | pf.map(int) | pf.shard(1, 3) | pf.random_map(draw, seed=4)
    whole = dict(pf.indices(9) | pf.random_map(draw, seed=4))
    assert computed.plan().fused == 1
    assert list(computed) == list(read) == [(i, whole[i]) for i in (1, 4, 7)]


def test_positions_describe_without_running() -> None:
    p = Positions(10)
    assert list(p.items(0, 3)) == list(range(3, 10))
    assert p.shuffled(1, "numpy") is not None
    assert p.shuffled(1, "numpy").shuffled(2, "numpy") is None  # type: ignore[union-attr]
    sharded = p.sharded(lambda: (1, 4, 0, 1), False)
    assert sharded is not None and list(sharded.items(0, 0)) == [1, 5, 9]
    assert sharded.sharded(lambda: (0, 2, 0, 1), False) is None
    worker = p.sharded(lambda: (1, 2, 1, 2), False)  # rank 1 of 2: 1, 3, 5, 7, 9; worker 1 of 2
    assert worker is not None and list(worker.items(0, 0)) == [3, 7]
