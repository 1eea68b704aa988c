"""state.py on its own: the skip plan each stage's Rule leads to, and what a state records."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.resume.state import Delivery, Drops, Plan, Rule, plan


def test_maps_and_batches_push_the_skip_down_to_the_source() -> None:
    stages = (pf.indices(100) | pf.batch(8) | pf.map(len) | pf.collate()).stages
    assert plan(stages, {"position": 3}) == Plan(source_skip=24, offsets=(24, 3, 3))


def test_a_stage_that_replays_cuts_after_itself() -> None:
    stages = (pf.indices(100) | pf.filter(bool) | pf.batch(4)).stages
    assert plan(stages, {"position": 5}) == Plan(cut=((0, 20),), offsets=(0, 20))


def test_a_seeking_stage_is_told_where_to_start_and_nothing_above_it_is_read() -> None:
    seek = pf.Stage(lambda items: iter(items), "seek", length="same", resume=Rule.seek())
    stages = (pf.map(abs), seek, pf.batch(4))
    assert plan(stages, {"position": 2}) == Plan(start=((1, 8),), offsets=(0, 0, 8))


def test_an_out_of_order_stage_skips_what_it_delivered_below_it() -> None:
    stages = (pf.batch(2), pf.parallel_map(len, workers=1, ordered=False), pf.map(abs))
    resume = {"position": 9, "stages": {1: {"prefix": 3, "extras": [5]}}}
    got = plan(stages, resume)
    assert got.source_skip == 6 and got.extras == ((1, frozenset({5})),)
    assert got.offsets[:2] == (6, 3)


def test_a_dropping_stage_says_how_many_inputs_it_took() -> None:
    stages = (pf.map(abs), pf.ignore_errors(), pf.batch(4))
    resume = {"position": 2, "stages": {1: {"inputs": 11}}}
    assert plan(stages, resume) == Plan(source_skip=11, offsets=(11, 11, 8))


def test_delivery_keeps_the_prefix_and_the_extras() -> None:
    d = Delivery(10, frozenset({12}))
    d.order += [11, 10, 14, 13]
    assert d.after(2) == {"prefix": 13, "extras": []}  # 10, 11 and 12 done
    assert d.after(3) == {"prefix": 13, "extras": [14]}
    assert d.after(4) == {"prefix": 15, "extras": []}


@given(st.lists(st.integers(0, 20)), st.integers(0, 40))
def test_drops_count_every_drop_before_the_consumed_outputs(before, consumed) -> None:
    drops = Drops(offset=5)
    drops.before += sorted(before)
    want = 5 + consumed + len([d for d in before if d <= consumed])
    assert drops.after(consumed)["inputs"] == want


@settings(max_examples=40, deadline=None)
@given(
    n=st.integers(0, 60),
    size=st.integers(1, 9),
    k=st.integers(0, 12),
    replay=st.booleans(),
)
def test_a_resumed_loader_yields_exactly_the_rest(n, size, k, replay) -> None:
    """The plan against running: for any position, the rest equals the tail of a full pass."""

    def make() -> pf.Loader:
        loader = pf.indices(n) | pf.shuffle(seed=n)
        if replay:
            loader = loader | pf.filter(lambda i: i % 3)
        return loader | pf.batch(size) | pf.map(sorted)

    whole = list(make())
    k = min(k, len(whole))
    first = make()
    it = iter(first)
    for _ in range(k):
        next(it)
    resumed = make()
    resumed.load_state_dict(first.state_dict())
    assert list(resumed) == whole[k:]


def test_a_state_past_the_end_of_the_epoch_is_refused() -> None:
    loader = pf.indices(10) | pf.batch(4)
    state = loader.state_dict()
    state["position"] = 4
    with pytest.raises(ValueError, match=r"position 4 lies past the end of the epoch \(3 outputs"):
        loader.load_state_dict(state)


@pytest.mark.parametrize(
    ("other", "words"),
    [
        (pf.indices(11) | pf.shuffle(seed=1) | pf.batch(3), "source is indices(11)"),
        (pf.indices(10) | pf.shuffle(seed=2) | pf.batch(3), "shuffle's seed is 2 here but 1"),
        (pf.indices(10) | pf.shuffle(seed=1) | pf.batch(4), "batch(size=4"),
        (pf.indices(10) | pf.shuffle(seed=1), "1 stages here, 2 in the state"),
    ],
)
def test_a_state_from_another_pipeline_is_refused(other: pf.Loader, words: str) -> None:
    state = (pf.indices(10) | pf.shuffle(seed=1) | pf.batch(3)).state_dict()
    with pytest.raises(ValueError, match="different pipeline") as info:
        other.load_state_dict(state)
    assert words in str(info.value)


def test_garbage_is_refused() -> None:
    loader = pf.indices(3)
    with pytest.raises(ValueError, match="not a pipeflow loader state"):
        loader.load_state_dict({"epoch": 1})
    state = loader.state_dict()
    state["position"] = -1
    with pytest.raises(ValueError, match=r"\['position'\] must be between 0 and \d+ \(got -1\)"):
        loader.load_state_dict(state)


def test_a_restarting_stage_skips_its_inputs_above_and_its_own_outputs_itself() -> None:
    stages = (pf.map(abs), pf.ignore_errors(), pf.batch(4))
    resume = {"position": 2, "stages": {1: {"inputs": 11, "start": 3}}}
    got = plan(stages, resume)
    assert got == Plan(source_skip=11, start=((1, 3),), offsets=(11, 11, 8))
