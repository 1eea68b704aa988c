"""pf.mix's own states, at every save point: mixes read ahead of by their consumer (a buffer
shuffle, a prefetching parallel_map), epochs that are not a multiple of the batch size, all
three stop rules; every state loads in a freshly built loader and resumes exactly. And a
mix's record, tampered with, is refused at load (or resumes exactly)."""

from __future__ import annotations

import copy
import itertools
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import pipeflow as pf
import pipeflow.resume.state as pf_state


def _same(x: Any) -> Any:
    return x


def _build(shape: dict[str, Any]) -> Any:
    kids = []
    for k, n in enumerate(shape["sizes"]):
        child = pf.from_iterable([f"{k}:{i}" for i in range(n)])
        if shape["inner"]:
            child = child | pf.shuffle(seed=11 + k, buffer_size=shape["inner"])
        if shape["nested"] and k == 0:  # a prefetching stage inside a loader too
            child = child | pf.parallel_map(_same, workers=2, backend="thread")
        kids.append(child)
    loader = pf.mix(kids, weights=shape["weights"], seed=shape["seed"], stop=shape["stop"])
    if shape["outer"]:
        loader = loader | pf.shuffle(seed=5, buffer_size=shape["outer"])
    loader = loader | pf.batch(shape["batch"], drop_last=shape["drop_last"])
    if shape["workers"]:
        loader = loader | pf.parallel_map(_same, workers=2, backend="thread")
    return loader


def _round_trip(state: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(json.dumps(state))
    return out


def _check_every_save_point(shape: dict[str, Any]) -> None:
    reference = _build(shape)
    reference.set_epoch(0)
    first, second = list(reference), list(reference)
    loader = _build(shape)
    loader.set_epoch(0)
    states = [loader.state_dict()]
    for _ in loader:
        states.append(loader.state_dict())  # after every batch, the last one included
    states.append(loader.state_dict())  # after the pass ended
    assert len(states) == len(first) + 2
    for k, state in enumerate(states):
        resumed = _build(shape)
        resumed.load_state_dict(_round_trip(state))
        if k <= len(first):
            assert list(resumed) == first[k:], (shape, k)
        assert list(resumed) == second, (shape, k)


_shapes = st.fixed_dictionaries(
    {
        "sizes": st.lists(st.integers(0, 14), min_size=2, max_size=3),
        "inner": st.sampled_from([0, 3]),
        "nested": st.booleans(),
        "stop": st.sampled_from(["first", "all", "cycle"]),
        "seed": st.integers(0, 2**16),
        "weights": st.lists(st.sampled_from([1, 2, 3]), min_size=3, max_size=3),
        "outer": st.sampled_from([0, 0, 4]),
        "batch": st.integers(2, 5),
        "drop_last": st.booleans(),
        "workers": st.booleans(),
    }
).map(lambda s: {**s, "weights": s["weights"][: len(s["sizes"])]})


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(shape=_shapes)
def test_every_save_point_of_a_mix_resumes_exactly(shape: dict[str, Any]) -> None:
    _check_every_save_point(shape)


@pytest.mark.parametrize("stop", ["first", "all", "cycle"])
def test_a_prefetched_mix_resumes_from_every_save_point(stop: str) -> None:
    """The colleague's case: loaders with buffer shuffles, a prefetching parallel_map after
    the mix, an epoch not a multiple of the batch size (the mix reads loaders to their end,
    or into their next pass, ahead of what was consumed)."""
    shape = {
        "sizes": [23, 9, 31],
        "inner": 4,
        "nested": False,
        "stop": stop,
        "seed": 3,
        "weights": [1, 2, 1],
        "outer": 0,
        "batch": 4,
        "drop_last": False,
        "workers": True,
    }
    for _ in range(3):  # how far the consumer reads ahead varies from run to run
        _check_every_save_point(shape)


def test_a_mix_of_parallel_sources_resumes_from_every_save_point() -> None:
    """A loader whose records fold what their consumer took (a parallel_source's workers'
    counts) folds what the mix's consumer took, not what the mix read ahead."""

    def make() -> Any:
        a = pf.from_iterable([f"a{i}" for i in range(40)]) | pf.shard()
        b = pf.from_iterable([f"b{i}" for i in range(23)]) | pf.shuffle(seed=3, buffer_size=4)
        sources = [pf.parallel_source(a, workers=2, backend="thread", seed=1), b]
        mixed = pf.mix(sources, weights=[2, 1], seed=4) | pf.batch(5)
        return mixed | pf.parallel_map(_same, workers=2, backend="thread", max_in_flight=8)

    reference = make()
    reference.set_epoch(0)
    first, second = list(reference), list(reference)
    loader = make()
    loader.set_epoch(0)
    states = [loader.state_dict()]
    for _ in loader:
        states.append(loader.state_dict())
    for k, state in enumerate(states):
        resumed = make()
        resumed.load_state_dict(_round_trip(state))
        assert list(resumed) == first[k:], k
        assert list(resumed) == second, k


# -- tampered records -------------------------------------------------------------------------
def _reseal(state: dict[str, Any]) -> dict[str, Any]:
    """*state* with its digests made again (where the format has them), so that what the
    mix's own checks catch is what is tested."""
    digests = getattr(pf_state, "digests", None)
    if "digests" in state and digests is not None:
        state["digests"] = digests(state)
    return state


def _mutations(record: dict[str, Any]) -> Any:
    n = len(record["counts"])
    for key in ("counts", "cycles"):
        for i in range(n):
            for value in (-1, 10**6, 1.5, "3", None, True, record[key][i] + 1):
                yield ("set", key, i, value)
    for i in range(n):
        for value in (not record["ended"][i], 0, None):
            yield ("set", "ended", i, value)
        for value in (None, 5, {}):
            yield ("set", "loaders", i, value)
        yield ("end", i)  # ended, its record dropped
        yield ("position", i)
    for i, j in itertools.combinations(range(n), 2):
        for key in ("counts", "ended", "cycles", "loaders"):
            yield ("swap", (key,), i, j)
    for key in ("counts", "ended", "cycles", "loaders"):
        yield ("short", key)
        yield ("del", key)


def _mutated(record: dict[str, Any], mutation: tuple[Any, ...]) -> dict[str, Any] | None:
    out = copy.deepcopy(record)
    kind = mutation[0]
    if kind == "set":
        out[mutation[1]][mutation[2]] = mutation[3]
    elif kind == "end":
        out["ended"][mutation[1]], out["loaders"][mutation[1]] = True, None
    elif kind == "position":
        if out["loaders"][mutation[1]] is None:
            return None
        out["loaders"][mutation[1]]["position"] += 1
    elif kind == "swap":
        i, j = mutation[2], mutation[3]
        for key in mutation[1]:
            out[key][i], out[key][j] = out[key][j], out[key][i]
    elif kind == "short":
        out[mutation[1]] = out[mutation[1]][:-1]
    else:
        del out[mutation[1]]
    return out


@pytest.mark.parametrize(
    ("sizes", "stop", "inner"),
    [([5, 9, 4], "all", 3), ([3, 8], "cycle", 2), ([4, 7, 2], "cycle", 3), ([6, 9], "first", 3)],
)
def test_a_tampered_mix_record_is_refused_or_resumes_exactly(
    sizes: list[int], stop: str, inner: int
) -> None:
    """Out-of-range values, wrong types, fields swapped between the loaders: refused at load
    (by the mix's checks; the loaders' records' passes by its ``check_pass``, called here as
    a load would call it), or an exact resume (a swap of equal values). The digests are
    made again, so the mix's own checks are what is tested. Consistent-looking changes that
    move items from one loader's count to another's are the digests' to catch."""
    shape = {"sizes": sizes, "inner": inner, "nested": False, "stop": stop, "seed": 9}
    shape |= {"weights": [1, 2, 3][: len(sizes)], "outer": 0, "batch": 1, "drop_last": False}
    shape["workers"] = False
    reference = _build(shape)
    reference.set_epoch(0)
    full = list(reference)
    loader = _build(shape)
    loader.set_epoch(0)
    states = [loader.state_dict()]
    for _ in loader:
        states.append(loader.state_dict())
    loaded = 0
    for k, state in enumerate(states[:-1]):
        if "source" not in state:  # before the pass: nothing to tamper with
            continue
        for mutation in _mutations(state["source"]):
            record = _mutated(state["source"], mutation)
            if record is None:
                continue
            fresh = _build(shape)
            try:
                fresh.load_state_dict(_reseal({**copy.deepcopy(state), "source": record}))
                fresh.source.resume.check_pass(
                    fresh.source, record, "state['source']", state["epoch"]
                )
            except ValueError:
                continue
            loaded += 1
            rest = list(itertools.islice(iter(fresh), len(full) + 1))
            assert rest == full[k:], (mutation, k)
    assert loaded  # the swaps of equal values load, and change nothing
