"""Workers' states in a loader's state: what a worker's record may hold, and what happens when
it can't be used.

- A ``parallel_source`` thread worker that dies of any error (outside an item's own code:
  taking its replica's state for ``state_dict()``) ends the pass with that error, named,
  instead of a ``next()`` that waits forever; no thread is left behind.
- A worker record that its worker could not resume from (a replica's ``position`` of the
  wrong type or out of range, an ``ended`` that its replica's record contradicts, generators'
  states that don't restore) is refused at ``load_state_dict``, naming the field.
- A stateful dataset's state taken with one number of workers and loaded with another is
  refused in the user's words (how many workers, and what to resume with), never as an
  "unknown key"; a dataset without state resumes exactly with any number.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
import threading
from collections.abc import Callable
from typing import Any

import pytest
import torch

import pipeflow as pf
import pipeflow.resume.state as pf_state
from pipeflow.errors import StreamNotSplitError
from tests._resume_cases import OwnRng, Stream, _listed
from tests._shards import write_shards
from tests.conftest import nothing_left

_TARS = write_shards(tempfile.mkdtemp(prefix="pipeflow-worker-states-"), [4, 3, 5, 2])


def _plain(x: Any) -> Any:
    return json.loads(json.dumps(x, default=lambda o: o.tolist()))


def _resealed(state: dict[str, Any]) -> dict[str, Any]:
    """*state* with its digests (where this pipeflow writes them) made again, as a user who
    edits a state by hand would: the field checks, not the digests, are what is tested."""
    digests = getattr(pf_state, "digests", None)
    if "digests" in state and digests is not None:
        state["digests"] = digests(state)
    return state


def _bounded(fn: Callable[[], Any], timeout: float = 20.0) -> Any:
    """``fn()`` in a daemon thread: its result or exception; fails if it still runs."""
    out: list[Any] = []

    def run() -> None:
        try:
            out.append(fn())
        except BaseException as e:  # what the consumer got is the result
            out.append(e)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"still waiting after {timeout} s: a hang"
    return out[0]


# -- a thread worker that dies ----------------------------------------------------------------
class _StateFails:
    """Split by worker; worker 1's ``state_dict()`` fails from its second call: as its
    thread takes its replica's state after an item, outside the item's own code."""

    def __iter__(self) -> Any:
        info = pf.get_worker_info()
        first = 0 if info is None else info.id
        return iter(range(first, 10, 2))

    def state_dict(self) -> dict[str, Any]:
        info = pf.get_worker_info()
        if info is not None and info.id == 1:
            self.calls = getattr(self, "calls", 0) + 1
            if self.calls >= 2:
                raise KeyError("state of worker 1")
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        pass


def test_a_thread_worker_that_dies_ends_the_pass_with_its_error_and_leaves_no_thread() -> None:
    with nothing_left():
        loader = pf.parallel_source(pf.from_iterable(_StateFails()), workers=2, backend="thread")
        got = _bounded(lambda: list(loader))
        assert isinstance(got, KeyError), got  # the original type, its traceback with it
        assert got.__traceback__ is not None
        notes = "\n".join(getattr(got, "__notes__", []))
        assert "stage 'parallel_source' failed on item" in notes, notes
        assert "thread worker 1 of 2" in notes and "the worker thread died of it" in notes
        loader.close()


# -- a parallel_source worker's record ----------------------------------------------------------
def _shards_source(backend: str) -> pf.Loader:
    return pf.parallel_source(
        pf.shards(_TARS, seed=1) | pf.read_tar(), workers=2, backend=backend, seed=4
    )


def _taken(make: Callable[[], pf.Loader], k: int) -> tuple[dict[str, Any], list[Any]]:
    """The state after *k* items, and the rest of the epoch."""
    loader = make()
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = _plain(loader.state_dict())
    rest = _plain(list(it))
    loader.close()
    return state, rest


_STATES: dict[str, tuple[dict[str, Any], list[Any]]] = {}


def _shards_state(k: int = 5) -> tuple[dict[str, Any], list[Any]]:
    key = f"shards-{k}"
    if key not in _STATES:
        _STATES[key] = _taken(lambda: _shards_source("thread"), k)
    state, rest = _STATES[key]
    return copy.deepcopy(state), rest


@pytest.mark.parametrize("value", ["x", None, 2**63, -1, 100, 2.5, True])
def test_a_bad_replica_position_is_refused_at_load(value: Any) -> None:
    state, _ = _shards_state()
    state["source"]["workers"]["1"]["state"]["replica"]["position"] = value
    loader = _shards_source("thread")
    with pytest.raises(ValueError) as info:
        loader.load_state_dict(_resealed(state))
    text = str(info.value)
    count = state["source"]["workers"]["1"]["count"]
    where = "load_state_dict: state['source']['workers']['1']['state']['replica']['position']"
    assert re.match(rf"{re.escape(where)} must be (an integer )?between 0 and {count}\b", text)
    assert f"got {value!r}" in text
    loader.close()


def test_a_replica_position_that_is_not_the_workers_count_is_refused() -> None:
    state, _ = _shards_state()
    worker = state["source"]["workers"]["1"]
    worker["state"]["replica"]["position"] = worker["count"] - 1
    with pytest.raises(ValueError, match=r"\['position'\] is \d+, but .*\['count'\] says"):
        _shards_source("thread").load_state_dict(_resealed(state))


def test_a_bad_position_is_refused_before_any_worker_starts_on_processes() -> None:
    state, _ = _shards_state()
    state["source"]["workers"]["0"]["state"]["replica"]["position"] = "x"
    loader = _shards_source("process")
    with pytest.raises(ValueError, match=r"\['workers'\]\['0'\].*must be an integer between"):
        loader.load_state_dict(_resealed(state))
    loader.close()


def test_ended_contradicted_by_the_replica_record_is_refused() -> None:
    state, _ = _shards_state()  # both workers mid-stream
    state["source"]["workers"]["0"]["ended"] = True
    with pytest.raises(ValueError, match=r"\['ended'\] says it ran out"):
        _shards_source("thread").load_state_dict(_resealed(state))
    state, _ = _shards_state(12)  # worker 0 ran out
    ended = [w for w, v in state["source"]["workers"].items() if v["ended"]]
    assert ended, state["source"]
    state["source"]["workers"][ended[0]]["ended"] = False
    with pytest.raises(ValueError, match=r"workers taking turns|\['position'\] is 0, but"):
        _shards_source("thread").load_state_dict(_resealed(state))


def test_a_missing_replica_record_is_refused_where_the_replica_cannot_skip_without() -> None:
    state, _ = _shards_state()
    state["source"]["workers"]["1"]["state"] = None
    with pytest.raises(ValueError, match=r"holds no record of where worker '?1'?'s replica"):
        _shards_source("thread").load_state_dict(_resealed(state))


class _Uneven:
    """Worker 0 has 2 items, worker 1 eight: worker 0 runs out early. No state of its own."""

    def __iter__(self) -> Any:
        info = pf.get_worker_info()
        return iter([0, 1] if info is None or info.id == 0 else range(10, 18))


def _uneven() -> pf.Loader:
    return pf.parallel_source(pf.from_iterable(_Uneven()), workers=2, backend="thread", seed=4)


@pytest.mark.parametrize("flip", ["0", "1"])
def test_an_ended_flag_without_a_replica_record_is_refused_or_resumes_exactly(flip: str) -> None:
    state, rest = _taken(_uneven, 6)
    assert state["source"]["workers"]["0"]["ended"] is True  # worker 0 ran out
    state["source"]["workers"][flip]["ended"] = not state["source"]["workers"][flip]["ended"]
    loader = _uneven()
    if flip == "0":  # worker 0 said not to have run out: its counts contradict the turns
        with pytest.raises(ValueError, match=r"^load_state_dict: "):
            loader.load_state_dict(_resealed(state))
        return
    loader.load_state_dict(_resealed(state))
    # worker 1 said to have run out is asked again: its rest is not lost
    assert _plain(_bounded(lambda: list(loader))) == rest
    loader.close()


def test_bad_generator_states_in_a_worker_record_are_refused() -> None:
    state, _ = _taken(lambda: _shards_source("process"), 5)
    for bad, words in [
        ({"torch": "not base64!"}, "torch"),
        ({"torch": "AAAA"}, "torch's global generator"),
        ({"random": [3, [1, 2], None]}, "Python's random module"),
        ("x", "must be a dict"),
        ({"other": 1}, "unknown key 'other'"),
    ]:
        mutated = copy.deepcopy(state)
        mutated["source"]["workers"]["1"]["state"]["rng"] = bad
        loader = _shards_source("process")
        with pytest.raises(ValueError, match=r"\['workers'\]\['1'\]\['state'\]\['rng'\]") as info:
            loader.load_state_dict(_resealed(mutated))
        assert words in str(info.value)
        loader.close()


# -- another number of workers ------------------------------------------------------------------
def _dataloader(dataset: Any, workers: int) -> pf.DataLoader:
    iterable = isinstance(dataset, torch.utils.data.IterableDataset)
    return pf.DataLoader(
        dataset,
        batch_size=2,
        shuffle=None if iterable else False,
        num_workers=workers,
        collate_fn=_listed,
        generator=torch.Generator().manual_seed(11),
    )


def _pipe(workers: int) -> pf.Loader:
    fetch = pf.fetch(OwnRng(12))
    return pf.indices(12) | pf.parallel_map(fetch, workers=workers, backend="process", seed=3)


_COUNTS = [(0, 2), (2, 3), (3, 2), (2, 0)]


def _refused(make: Callable[[int], Any], before: int, after: int, k: int) -> str:
    loader = make(before)
    it = iter(loader)
    for _ in range(k):
        next(it)
    state = loader.state_dict()
    del it
    other = make(after)
    with pytest.raises(ValueError) as info:
        other.load_state_dict(copy.deepcopy(state))
    return str(info.value)


def _cases(k_values: tuple[int, ...]) -> list[Any]:
    out = []
    for k in k_values:
        for before, after in _COUNTS:
            out.append(pytest.param(before, after, k, id=f"{before}to{after}-k{k}"))
    return out


@pytest.mark.parametrize(("before", "after", "k"), _cases((0, 3)))
def test_a_stateful_dataset_with_another_num_workers_is_refused_in_the_users_words(
    before: int, after: int, k: int
) -> None:
    text = _refused(lambda w: _dataloader(OwnRng(12), w), before, after, k)
    assert "unknown key" not in text and "lacks the key" not in text, text
    assert f"the state was taken with {before} workers, and this loader has {after}" in text
    assert f"resume with num_workers={before}" in text


@pytest.mark.parametrize(("before", "after"), [(b, a) for b, a in _COUNTS if b])
def test_parallel_map_over_a_stateful_dataset_with_another_workers_is_refused(
    before: int, after: int
) -> None:
    text = _refused(_pipe, before, after, 3)
    assert "unknown key" not in text and "lacks the key" not in text, text
    assert f"the state was taken with {before} workers, and this loader has {after}" in text
    assert f"workers={before} (parallel_map)" in text


@pytest.mark.parametrize(("before", "after"), _COUNTS)
def test_a_stateful_iterable_dataset_with_another_num_workers_is_refused(
    before: int, after: int
) -> None:
    text = _refused(lambda w: _dataloader(Stream(12), w), before, after, 2)
    assert "unknown key" not in text and "lacks the key" not in text, text
    assert f"num_workers is {after} here but {before} in the state" in text


class _Plain(torch.utils.data.Dataset):
    """A dataset without state: any number of workers resumes it exactly."""

    def __len__(self) -> int:
        return 12

    def __getitem__(self, i: int) -> int:
        return i * 10


@pytest.mark.parametrize(("before", "after"), _COUNTS)
def test_a_dataset_without_state_resumes_exactly_with_another_num_workers(
    before: int, after: int
) -> None:
    loader = _dataloader(_Plain(), before)
    it = iter(loader)
    for _ in range(2):
        next(it)
    state = loader.state_dict()
    rest = _plain(list(it))
    other = _dataloader(_Plain(), after)
    other.load_state_dict(copy.deepcopy(state))
    assert _plain(list(other)) == rest


class _OwnStream:
    """A stream split by pipeflow's worker info that keeps where it stands on itself (as
    torchdata's tests' datasets do): thread workers must each read their own copy."""

    def __init__(self, n: int) -> None:
        self.n, self.done, self.skip, self.epoch = n, 0, 0, 0

    def __iter__(self) -> Any:
        info = pf.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        mine = list(range(first, self.n, step))
        self.done, self.skip = self.skip, 0
        for i in mine[self.done :]:
            self.done += 1
            yield i, self.epoch
        self.done = 0
        self.epoch += 1

    def state_dict(self) -> dict[str, int]:
        return {"done": self.done, "epoch": self.epoch}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.skip, self.epoch = state["done"], state["epoch"]


@pytest.mark.parametrize("k", [0, 3, 6, 9, 12])
def test_thread_workers_over_a_stateful_stream_each_resume_their_own_copy(k: int) -> None:
    def make() -> pf.Loader:
        return pf.parallel_source(pf.from_iterable(_OwnStream(12)), workers=2, backend="thread")

    whole = list(make())
    assert sorted(whole) == [(i, 0) for i in range(12)]
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = first.state_dict()
    first.close()
    again = make()
    again.load_state_dict(state)
    assert head + list(again) == whole  # before: 9 to 16 items, some twice
    again.close()


@pytest.mark.parametrize(("workers", "backend"), [(0, "process"), (0, "thread"), (2, "thread")])
def test_a_stateful_dataset_shared_by_parallel_map_refuses_a_state_it_cannot_make(
    workers: int, backend: str
) -> None:
    """In line or in threads, the stages share this process's dataset: its state as of the
    consumer's position is not tracked there, so ``state_dict()`` says so (before: the
    state left the dataset's out, and the resumed pass drew other numbers)."""
    fetch = pf.fetch(OwnRng(12))
    loader = pf.indices(12) | pf.parallel_map(fetch, workers=workers, backend=backend)
    it = iter(loader)
    next(it)
    with pytest.raises(ValueError, match=r"^state_dict: parallel_map runs its stages in "):
        loader.state_dict()
    loader.close()


class _TorchSplit(torch.utils.data.IterableDataset):
    """Splits by torch's ``get_worker_info()``, which answers ``None`` in a thread."""

    def __iter__(self) -> Any:
        info = torch.utils.data.get_worker_info()
        first, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(first, 6, step))


def test_a_torch_stream_that_thread_workers_would_each_read_whole_is_refused_loudly() -> None:
    """Before: each of 2 threads read all 6 items, 12 in the epoch, without a word."""
    source = pf.from_iterable(_TorchSplit())
    loader = pf.parallel_source(source, workers=2, backend="thread") | pf.ignore_errors()
    with pytest.raises(StreamNotSplitError, match=r"pipeflow.get_worker_info\(\)"):
        list(loader)  # never dropped, though ignore_errors drops other errors
    loader.close()
    processes = pf.parallel_source(pf.from_iterable(_TorchSplit()), workers=2)
    assert sorted(processes) == list(range(6))  # in processes torch's answer is right


@pytest.mark.parametrize("size", [7, 17])
def test_a_state_after_the_last_short_batch_of_a_split_stream_loads(size: int) -> None:
    # A batch after parallel_source counts its last, short batch as a full one, so the
    # position stands past the stream's last item: state_dict() once raised IndexError
    # there, and the count check would have refused the state.
    from tests._contract_cases import SplitStream

    def build() -> pf.Loader[Any]:
        stream = pf.from_iterable(SplitStream(size, 0))
        return pf.parallel_source(stream, workers=2, backend="thread", seed=0) | pf.batch(2)

    loader = build()
    first = list(loader)
    assert sum(len(b) for b in first) == size and len(first[-1]) == 1
    loader.close()
    loader = build()
    it = iter(loader)
    taken = [next(it) for _ in range(len(first))]
    state = json.loads(json.dumps(loader.state_dict()))  # after the last batch, mid-pass
    loader.close()
    assert state["epoch"] == 0 and state["position"] == len(first)
    fresh = build()
    fresh.load_state_dict(state)
    assert list(fresh) == []  # the rest of epoch 0
    assert sorted(x for b in list(fresh) for x in b) == sorted(x for b in taken for x in b)
    fresh.close()
