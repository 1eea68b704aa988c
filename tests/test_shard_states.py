"""States of sharded streams that survive moving the data and refuse changed data; batches
inside parallel_source workers that would break equal batches per rank; a worker's death that
names where it stood; an unshuffled source and a state taken after an error."""

from __future__ import annotations

import json
import os
import shutil
import signal
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests._shards import ident, sample_id, write_shards, write_tar


def _drain(loader: Any, limit: int | None = None) -> list[str]:
    """The ids a pass yields (``"ERR"`` for a failed item), up to *limit* of them."""
    out: list[str] = []
    it = iter(loader)
    while limit is None or len(out) < limit:
        try:
            out.append(ident(next(it)))
        except StopIteration:
            break
        except pf.ShardReadError:
            out.append("ERR")
    return out


def _roundtrip(state: dict[str, Any]) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads(json.dumps(state))
    return loaded


def _tar_loader(folder: str, workers: int = 0, **kw: Any) -> pf.Loader:
    inner = pf.shards(os.path.join(folder, "*.tar"), **kw) | pf.read_tar()
    if workers:
        return pf.parallel_source(inner, workers=workers, backend="thread")
    return inner


# -- an unshuffled source, a state after an error ------------------------------------------------
def test_an_unshuffled_source_without_a_seed_resumes_in_a_fresh_loader(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [4, 4, 4])
    loader = pf.shards(paths, shuffle=False) | pf.read_tar()
    head = _drain(loader, 6)
    state = _roundtrip(loader.state_dict())
    fresh = pf.shards(paths, shuffle=False) | pf.read_tar()  # draws another (unused) seed
    fresh.load_state_dict(state)
    assert head + _drain(fresh) == [sample_id(k, i) for k in range(3) for i in range(4)]


def test_a_state_taken_right_after_a_shard_error_does_not_raise_it_again(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [3, 3, 3])
    paths.insert(1, str(tmp_path / "missing.tar"))
    loader = pf.shards(paths, shuffle=False) | pf.read_tar()
    head = _drain(loader, 4)
    assert head == ["0-0", "0-1", "0-2", "ERR"]
    resumed = pf.shards(paths, shuffle=False) | pf.read_tar()
    resumed.load_state_dict(_roundtrip(loader.state_dict()))
    assert _drain(resumed) == [sample_id(k, i) for k in (1, 2) for i in range(3)]


# -- moving the data, changing it -----------------------------------------------------------------
@settings(max_examples=12, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=4),
    seed=st.integers(0, 3),
    cut=st.integers(0, 40),
    workers=st.sampled_from([0, 2]),
)
def test_a_state_resumes_exactly_after_the_folder_is_moved(
    tmp_path_factory: Any, sizes: list[int], seed: int, cut: int, workers: int
) -> None:
    folder = str(tmp_path_factory.mktemp("data"))
    write_shards(folder, sizes)
    full = _drain(_tar_loader(folder, workers, seed=seed))
    loader = _tar_loader(folder, workers, seed=seed)
    head = _drain(loader, min(cut, len(full)))
    state = _roundtrip(loader.state_dict())
    moved = folder + "-moved"
    shutil.move(folder, moved)
    resumed = _tar_loader(moved, workers, seed=seed)
    resumed.load_state_dict(state)
    assert head + _drain(resumed) == full


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("change", ["other size", "same size"])
def test_a_regenerated_shard_is_refused_by_name_at_load(
    tmp_path: Any, workers: int, change: str
) -> None:
    folder = str(tmp_path / "data")
    os.mkdir(folder)
    paths = write_shards(folder, [6, 6, 6])
    loader = _tar_loader(folder, workers, shuffle=False)
    _drain(loader, 4 if workers else 2)  # inside shard 0 (and 1, with two workers)
    state = _roundtrip(loader.state_dict())
    before = os.path.getsize(paths[0])
    write_tar(paths[0], 7, 16 if change == "other size" else 6)  # the same name, new samples
    assert (os.path.getsize(paths[0]) == before) == (change == "same size")
    fresh = _tar_loader(folder, workers, shuffle=False)
    with pytest.raises(ValueError, match="changed since the state was taken") as info:
        fresh.load_state_dict(state)
    assert "shard-0000.tar" in str(info.value)
    # the loader is as it was: a whole epoch, of the shard as it is now
    assert sorted(_drain(fresh)) == sorted(
        [sample_id(7, i) for i in range(16 if change == "other size" else 6)]
        + [sample_id(k, i) for k in (1, 2) for i in range(6)]
    )


def test_a_shard_gone_since_the_state_was_taken_is_refused_by_name(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [5, 5])
    loader = pf.shards(paths, shuffle=False) | pf.read_tar()
    _drain(loader, 2)
    state = _roundtrip(loader.state_dict())
    os.remove(paths[0])
    with pytest.raises(ValueError, match="can't be read now") as info:
        (pf.shards(paths, shuffle=False) | pf.read_tar()).load_state_dict(state)
    assert paths[0] in str(info.value)


@pytest.mark.parametrize(
    "entry",
    [
        None,
        3,
        {"number": 0},
        {"number": 0, "bytes": 1, "head": "zz"},
        {"url": 1, "bytes": 0, "head": "0" * 16},
    ],
)
def test_a_malformed_shard_entry_is_refused(tmp_path: Any, entry: Any) -> None:
    paths = write_shards(str(tmp_path), [5, 5])
    loader = pf.shards(paths, shuffle=False) | pf.read_tar()
    _drain(loader, 2)
    state = _roundtrip(loader.state_dict())
    assert state["stages"]["0"]["shard"]["number"] == 0
    state["stages"]["0"]["shard"] = entry
    with pytest.raises(ValueError, match=r"\['shard'\]"):
        (pf.shards(paths, shuffle=False) | pf.read_tar()).load_state_dict(state)


# -- equal batches per rank -----------------------------------------------------------------------
def test_batching_inside_workers_over_ranks_kept_even_is_refused(
    tmp_path: Any, monkeypatch: Any
) -> None:
    sizes = [5, 3, 7, 2, 4]
    paths = write_shards(str(tmp_path), sizes)

    def inside(**kw: Any) -> pf.Loader:
        shards = pf.shards(paths, sizes=sizes, seed=0, **kw)
        return pf.parallel_source(shards | pf.read_tar() | pf.batch(2), workers=2, backend="thread")

    with pytest.raises(ValueError, match=r"batch runs inside the 2 workers.*Batch after"):
        inside(rank=0, world_size=2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    told = inside()  # the world size is known when the pass starts
    with pytest.raises(ValueError, match="batch runs inside the 2 workers"):
        next(iter(told))
    assert len(_batches(inside(balance="shards"))) > 0  # whole shards: no promise to keep
    one = pf.parallel_source(
        pf.shards(paths, sizes=sizes, seed=0) | pf.read_tar() | pf.batch(2), workers=1
    )
    assert len(_batches(one)) == 6  # one worker batches the rank's whole share: 11 samples
    counts = []
    for rank in (0, 1):
        monkeypatch.setenv("RANK", str(rank))
        after = pf.parallel_source(
            pf.shards(paths, sizes=sizes, seed=0) | pf.read_tar(), workers=2, backend="thread"
        )
        counts.append(len(_batches(after | pf.batch(2))))
    assert counts == [6, 6]


def _batches(loader: pf.Loader) -> list[Any]:
    return list(loader)


# -- a worker's death names where it stood --------------------------------------------------------
def _die_at_2_7(sample: dict[str, Any]) -> dict[str, Any]:
    if sample["txt"] == "2-7":
        os.kill(os.getpid(), signal.SIGKILL)
    return sample


def test_a_dead_source_worker_is_named_with_the_shard_and_sample_it_stood_at(
    tmp_path: Any,
) -> None:
    paths = write_shards(str(tmp_path), [10, 10, 10, 10])
    inner = pf.shards(paths, shuffle=False) | pf.read_tar() | pf.map(_die_at_2_7)
    loader = pf.parallel_source(inner, workers=2, backend="process")
    with pytest.raises(pf.WorkerDiedError) as info:
        for _ in loader:
            pass
    notes = " ".join(getattr(info.value, "__notes__", []))
    # worker 0 reads shards 0 and 2; it died on 2-7, having delivered 2-0 .. 2-6
    assert "worker 0 had delivered 7 samples of 'shard-0002.tar'" in notes, notes
    assert "its sample 7 next at byte" in notes


@pytest.mark.parametrize("kind", ["jsonl", "parquet"])
def test_every_format_names_its_shard_version_and_refuses_a_changed_one(
    tmp_path: Any, kind: str
) -> None:
    if kind == "parquet":
        pytest.importorskip("pyarrow")
    from tests._shards import WRITERS

    folder = str(tmp_path / "data")
    os.mkdir(folder)
    paths = write_shards(folder, [7, 7], kind)
    reader = {"jsonl": pf.read_jsonl, "parquet": pf.read_parquet}[kind]

    def make(where: str) -> pf.Loader:
        return pf.shards(os.path.join(where, f"*.{kind}"), shuffle=False) | reader()

    loader = make(folder)
    head = _drain(loader, 9)
    state = _roundtrip(loader.state_dict())
    assert state["stages"]["0"]["shard"]["number"] == 1
    moved = folder + "-moved"
    shutil.move(folder, moved)
    resumed = make(moved)
    resumed.load_state_dict(state)
    assert head + _drain(resumed) == [sample_id(k, i) for k in range(2) for i in range(7)]
    WRITERS[kind](os.path.join(moved, os.path.basename(paths[1])), 5, 7)  # the same size
    with pytest.raises(ValueError, match="changed since the state was taken"):
        make(moved).load_state_dict(state)
