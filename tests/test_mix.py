"""pf.mix: interleaving by weight from (seed, epoch, position), the stop rules, exact resume
(also with shards and a reader inside)."""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests._shards import ident, write_shards


def _sources(sizes: list[int]) -> list[Any]:
    return [pf.from_iterable([f"{k}:{i}" for i in range(n)]) for k, n in enumerate(sizes)]


@settings(max_examples=30)
@given(
    sizes=st.lists(st.integers(0, 12), min_size=1, max_size=3),
    stop=st.sampled_from(["first", "all", "cycle"]),
    step=st.integers(0, 40),
    epoch=st.integers(0, 2),
)
def test_mix_is_deterministic_and_resumes_exactly(
    sizes: list[int], stop: str, step: int, epoch: int
) -> None:
    weights = [1.0 + k for k in range(len(sizes))]
    make = lambda: pf.mix(_sources(sizes), weights=weights, seed=7, stop=stop)  # noqa: E731
    loader = make()
    loader.set_epoch(epoch)
    full = list(loader)
    again = make()
    again.set_epoch(epoch)
    assert list(again) == full  # a function of (seed, epoch)
    items = Counter(full)
    everything = {f"{k}:{i}" for k, n in enumerate(sizes) for i in range(n)}
    if stop == "all":
        assert sorted(full) == sorted(everything)  # every item once
    elif stop == "cycle":
        assert set(full) == everything  # every item at least once
    else:
        assert set(full) <= everything and max(items.values(), default=1) == 1
    again.set_epoch(epoch)
    it = iter(again)
    head = [next(it) for _ in range(min(step, len(full)))]
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(again.state_dict())))
    assert head + list(resumed) == full


def test_weights_set_the_proportions() -> None:
    loader = pf.mix(_sources([3000, 3000]), weights=[3, 1], seed=1, stop="first")
    counts = Counter(x.split(":")[0] for x in loader)
    assert 2.6 < counts["0"] / counts["1"] < 3.4


def test_mix_of_sharded_readers_resumes_exactly(tmp_path: Any) -> None:
    a = write_shards(str(tmp_path / "a"), [5, 3]) if (tmp_path / "a").mkdir() is None else []
    b = write_shards(str(tmp_path / "b"), [4, 4, 2]) if (tmp_path / "b").mkdir() is None else []

    def make() -> Any:
        return pf.mix(
            [pf.shards(a, seed=1) | pf.read_tar(), pf.shards(b, seed=2) | pf.read_tar()],
            weights=[1, 2],
            seed=3,
        )

    loader = make()
    full = [ident(s) for s in loader]
    assert len(full) == 18
    loader.set_epoch(0)
    it = iter(loader)
    head = [ident(next(it)) for _ in range(7)]
    resumed = make()
    resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
    assert head + [ident(s) for s in resumed] == full


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(TypeError, match="loaders"):
        pf.mix([[1, 2]])
    with pytest.raises(ValueError, match="weights"):
        pf.mix(_sources([1, 1]), weights=[1])
    with pytest.raises(ValueError, match="weights"):
        pf.mix(_sources([1]), weights=[0])
    with pytest.raises(ValueError, match="stop"):
        pf.mix(_sources([1]), stop="never")
    one = pf.from_iterable([1])
    with pytest.raises(ValueError, match="twice"):
        pf.mix([one, one])
