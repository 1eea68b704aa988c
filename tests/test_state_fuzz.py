"""Malformed states: every record of every stage kind, mutated, is refused at load with a
``ValueError`` naming where — and the loader is left as it was. Never wrong data.

A state is taken mid-epoch from pipelines that between them keep every kind of record (an
out-of-order stage's, ignore_errors', a restarting stage's, a stateful source's and dataset's,
a parallel source's and its workers' replicas', a shard reader's, a buffer shuffle's, a mix's
and its loaders'), then one place in it is mutated: a key removed, a value of the wrong type,
out of range, or a record from another stage. The user's own objects' states are not
mutated: they are the user's to check.
"""

from __future__ import annotations

import atexit
import copy
import json
import os
import shutil
import tempfile
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests._resume_cases import OwnRng
from tests._shards import write_shards


class _Counting:
    def __init__(self, n: int) -> None:
        self.n, self.i = n, 0

    def __iter__(self) -> _Counting:
        return self

    def __next__(self) -> int:
        if self.i == self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.i = state["i"]


def _fails(i: int) -> int:
    if i % 5 == 2:
        raise OSError(i)
    return i


class _Split:
    def __iter__(self) -> Any:
        info = pf.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(first, 30, step))


_FOLDER = tempfile.mkdtemp(prefix="pipeflow-fuzz-")
atexit.register(shutil.rmtree, _FOLDER, True)
_TARS = write_shards(os.path.join(_FOLDER), [4, 3, 5, 2])


def _read() -> pf.Loader:
    return pf.shards(_TARS, seed=1) | pf.read_tar()


PIPELINES: dict[str, Callable[[], pf.Loader]] = {
    "unordered": lambda: (
        pf.indices(60) | pf.batch(5) | pf.parallel_map(sorted, workers=2, ordered=False)
    ),
    "ignore_errors": lambda: pf.indices(40) | pf.map(_fails) | pf.ignore_errors(),
    "pack": lambda: pf.from_iterable([[1] * (i % 7 + 1) for i in range(40)]) | pf.pack(8),
    "stateful_source": lambda: pf.from_iterable(_Counting(40)) | pf.batch(3),
    "stateful_dataset": lambda: pf.indices(20) | pf.fetch(OwnRng(20)),
    "parallel_source": lambda: (
        pf.parallel_source(pf.from_iterable(_Split()), workers=2, backend="thread", seed=1)
        | pf.batch(2)
    ),
    "shards": lambda: pf.shards(_TARS, seed=1),
    "read_tar": lambda: _read() | pf.batch(2),
    "buffer_shuffle": lambda: _read() | pf.shuffle(seed=2, buffer_size=3),
    "mix": lambda: pf.mix([_read(), pf.from_iterable(_Counting(9))], seed=3, stop="all"),
    "parallel_source_shards": lambda: pf.parallel_source(
        _read(), workers=2, backend="thread", seed=4
    ),
}

#: Where a mutation would touch the user's own state (theirs to check), by key.
_USERS = {"object", "iterator", "state"}


def _paths(value: Any, path: tuple[Any, ...] = ()) -> list[tuple[Any, ...]]:
    """Every place in a state, but inside the user's objects' states."""
    out = [path] if path else []
    if path and path[-1] in _USERS:
        return out
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*path, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*path, i))
    return out


def _states() -> dict[str, dict[str, Any]]:
    out = {}
    for name, make in PIPELINES.items():
        loader = make()
        it = iter(loader)
        for _ in range(3):
            next(it)
        out[name] = json.loads(json.dumps(loader.state_dict()))
        loader.close()
    return out


STATES = _states()
BAD_VALUES: list[Any] = [None, "x", -1, 10**9, [], {}, 2.5, True]


def _set(state: dict[str, Any], path: tuple[Any, ...], value: Any) -> None:
    target = state
    for key in path[:-1]:
        target = target[key]
    if value is _DELETE:
        if isinstance(target, dict):
            del target[path[-1]]
        else:
            target.pop(path[-1])
    else:
        target[path[-1]] = value


_DELETE = object()


def _at(state: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        state = state[key]
    return state


def _harmless(name: str, path: tuple[Any, ...], value: Any) -> bool:
    """Mutations that leave a well-formed state of the same pipeline: a worker's stream that
    ran out is a fact no check can verify (its length is the stream's)."""
    if path[-1] == "ended" and isinstance(value, bool):
        return True
    if path[-1] == "start" and value is _DELETE and name == "pack":  # see Restarts.check
        return STATES[name]["stages"]["0"]["inputs"] > 0
    if len(path) == 2 and path[0] == "stages" and value is _DELETE:
        return bool(STATES[name]["stages"][path[1]] == {"inputs": 0})  # as good as none
    if path[-1] == "stages" and len(path) > 1 and value is _DELETE:
        return bool(_at(STATES[name], path) == {})  # a nested pass record's: optional when empty
    if path[:2] == ("source", "workers") and path[-1] == "state" and value is None:
        return "replica" in str(STATES[name])  # a worker's replica then reads its count again
    if path[-1] == "offset" and value is _DELETE:
        return True  # a reader's: without it, the shard is read from its start (exact still)
    if path[-1] == "offset" and isinstance(value, int) and value >= 0 and value is not True:
        return True  # a byte in a shard: the reader checks it as it opens the shard, not a load
    if path == ("epoch",) and isinstance(value, int) and value >= 0 and value is not True:
        return True  # any epoch is an epoch
    seeds = STATES[name]["seeds"]
    if path == ("seeds",) and value == [] and all(s[0].endswith(" workers") for s in seeds):
        return True  # a parallel stage's workers' seed is taken when there, never required
    if path[:1] == ("seeds",) and len(path) == 2 and value is _DELETE:
        return bool(seeds[path[1]][0].endswith(" workers"))
    if path[:1] == ("seeds",) and len(path) == 3 and path[2] == 2 and isinstance(value, bool):
        return True  # whether pipeflow drew it: this loader's own flag decides, the value matches
    if path[:1] == ("seeds",) and len(path) == 3 and path[2] == 1:
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**64
    return False


@st.composite
def mutations(draw: Any) -> tuple[str, dict[str, Any], tuple[Any, ...], Any]:
    name = draw(st.sampled_from(sorted(STATES)), label="pipeline")
    state = copy.deepcopy(STATES[name])
    path = draw(st.sampled_from(_paths(state)), label="path")
    other = draw(st.sampled_from(sorted(STATES)), label="other")
    foreign = next(iter(STATES[other]["stages"].values()), STATES[other].get("source"))
    if path[-1] in _USERS:  # the user's state itself: only its absence is ours to see
        value = draw(st.sampled_from([_DELETE, None]), label="value")
    else:
        value = draw(st.sampled_from([*BAD_VALUES, _DELETE, foreign]), label="value")
    return name, state, path, value


@settings(max_examples=int(os.environ.get("FUZZ_EXAMPLES", "150")))
@given(mutations())
def test_a_malformed_state_is_refused_naming_where_and_changes_nothing(case: Any) -> None:
    name, state, path, value = case
    before = json.dumps(state)
    _set(state, path, value)
    if json.dumps(state) == before or _harmless(name, path, value):
        return  # not a mutation after all
    loader = PIPELINES[name]()
    untouched = loader.state_dict()
    with pytest.raises((ValueError, TypeError)) as info:
        loader.load_state_dict(state)
    text = str(info.value)
    assert text.startswith("load_state_dict:"), text
    named = {str(p) for p in path if isinstance(p, str)} | {"pipeline", "stage", "state"}
    assert any(word in text for word in named), (path, text)
    assert loader.state_dict() == untouched  # as it was
    loader.close()


@pytest.mark.parametrize("name", sorted(PIPELINES))
def test_each_pipeline_state_is_valid_unmutated(name: str) -> None:  # the fuzz's baseline
    loader = PIPELINES[name]()
    loader.load_state_dict(copy.deepcopy(STATES[name]))
    assert list(loader) is not None
    loader.close()
