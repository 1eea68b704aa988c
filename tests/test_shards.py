"""pf.shards and the readers: every sample once per epoch across ranks and workers, the order
a function of (seed, epoch), exact and cheap resume (in this process and in a new one),
the rank balance policies, a buffer shuffle after the reader, failures that say what and
where."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.sources.shards import split
from tests._shards import ident, sample_id, stream_loader, write_shards

KINDS = ["tar", "jsonl", "parquet"]
try:
    import pyarrow  # noqa: F401
except ImportError:  # the stream extra is not installed
    KINDS.remove("parquet")

READERS = {"tar": pf.read_tar, "jsonl": pf.read_jsonl, "parquet": pf.read_parquet}


def _everything(sizes: list[int]) -> list[str]:
    return [sample_id(k, i) for k, n in enumerate(sizes) for i in range(n)]


def _rank_loader(
    paths: list[str],
    kind: str,
    rank: int,
    world: int,
    workers: int,
    backend: str = "thread",
    **kw: Any,
) -> Any:
    inner = pf.shards(paths, seed=5, rank=rank, world_size=world, **kw) | READERS[kind]()
    if not workers:
        return inner
    return pf.parallel_source(inner, workers=workers, backend=backend)


# -- the split ----------------------------------------------------------------------------------
@given(st.integers(0, 30), st.integers(1, 5), st.randoms(use_true_random=False))
def test_whole_shards_are_dealt_once_across_ranks(n: int, world: int, rng: Any) -> None:
    order = list(range(n))
    rng.shuffle(order)
    dealt = [s for r in range(world) for s, _, _ in split(order, None, r, world, "shards")]
    assert sorted(dealt) == list(range(n))


@given(st.lists(st.integers(0, 6), max_size=8), st.integers(1, 4), st.sampled_from(["pad", "drop"]))
@example([3, 3, 1], 2, "pad")
@example([0, 0], 3, "pad")
def test_balanced_ranks_read_equal_runs_of_the_epoch(
    sizes: list[int], world: int, balance: str
) -> None:
    order = list(range(len(sizes)))
    total = sum(sizes)
    runs = [split(order, sizes, r, world, balance) for r in range(world)]
    counts = [sum(b - a for _, a, b in run) for run in runs]
    each = -(-total // world) if balance == "pad" else total // world
    assert counts == [each] * world  # every rank the same number: no DDP hang
    read = [(s, i) for run in runs for s, a, b in run for i in range(a, b)]
    epoch = [(s, i) for s in order for i in range(sizes[s])]
    if balance == "drop":  # the epoch's first samples, each once; the last few left out
        assert read == epoch[: each * world]
    else:  # each once, then the epoch's first ones again to fill the last run
        assert read == (epoch * (world + 1))[: each * world]


# -- every sample once, the order from (seed, epoch), exact resume ------------------------------
def _once_and_resume(
    folder: str, sizes: list[int], world: int, workers: int, backend: str, **case: Any
) -> None:
    """Every rank's epoch, twice (the same: a function of (seed, epoch)), and resumed after
    *step* items by a fresh loader from a JSON state (exactly the rest); every sample once
    across the ranks."""
    kind, step, epoch = case["kind"], case["step"], case["epoch"]
    paths = write_shards(folder, sizes, kind)
    seen: list[str] = []
    for rank in range(world):

        def make(rank: int = rank) -> Any:
            loader = _rank_loader(paths, kind, rank, world, workers, backend, balance="shards")
            loader.set_epoch(epoch)
            return loader

        full = [ident(s) for s in make()]
        again = make()
        assert [ident(s) for s in again] == full  # a function of (seed, epoch) alone
        seen += full
        # interrupted after `step` samples, resumed by a fresh loader: exactly the rest
        again.set_epoch(epoch)
        it = iter(again)
        head = [ident(s) for s in itertools.islice(it, min(step, len(full)))]
        state = json.loads(json.dumps(again.state_dict()))
        del it
        resumed = make()
        resumed.load_state_dict(state)
        assert head + [ident(s) for s in resumed] == full
    assert sorted(seen) == sorted(_everything(sizes))


@settings(max_examples=25)
@given(
    sizes=st.lists(st.integers(0, 5), min_size=0, max_size=6),
    world=st.integers(1, 3),
    workers=st.sampled_from([0, 1, 2]),
    kind=st.sampled_from(KINDS),
    step=st.integers(0, 40),
    epoch=st.integers(0, 3),
)
@example(sizes=[0, 3, 0], world=2, workers=2, kind="tar", step=1, epoch=0)
def test_every_sample_once_across_the_job_and_an_exact_resume(
    tmp_path_factory: Any,
    sizes: list[int],
    world: int,
    workers: int,
    kind: str,
    step: int,
    epoch: int,
) -> None:
    folder = str(tmp_path_factory.mktemp("shards"))
    _once_and_resume(folder, sizes, world, workers, "thread", kind=kind, step=step, epoch=epoch)


@settings(max_examples=4)  # each example starts 3 pools of processes per rank
@given(
    sizes=st.lists(st.integers(0, 5), min_size=0, max_size=5),
    world=st.integers(1, 2),
    workers=st.integers(1, 2),
    kind=st.sampled_from(KINDS),
    step=st.integers(0, 30),
    epoch=st.integers(0, 3),
)
@example(sizes=[0, 4, 0, 3], world=2, workers=2, kind="tar", step=2, epoch=1)
def test_every_sample_once_and_an_exact_resume_on_process_workers(
    tmp_path_factory: Any,
    sizes: list[int],
    world: int,
    workers: int,
    kind: str,
    step: int,
    epoch: int,
) -> None:
    folder = str(tmp_path_factory.mktemp("shards"))
    _once_and_resume(folder, sizes, world, workers, "process", kind=kind, step=step, epoch=epoch)


def test_the_order_changes_with_the_epoch_and_the_seed(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [2] * 12)
    orders = []
    for seed, epoch in [(0, 0), (0, 1), (1, 0)]:
        loader = pf.shards(paths, seed=seed) | pf.read_tar()
        loader.set_epoch(epoch)
        orders.append([s["__url__"] for s in loader][::2])
    assert len({tuple(o) for o in orders}) == 3
    assert all(sorted(o) == paths for o in orders)


def test_balanced_ranks_with_workers_read_equal_counts(tmp_path: Any) -> None:
    sizes = [5, 1, 0, 7, 3]
    paths = write_shards(str(tmp_path), sizes)
    per_rank = []
    for rank in range(3):
        loader = _rank_loader(paths, "tar", rank, 3, 2, sizes=sizes, balance="pad")
        per_rank.append([ident(s) for s in loader])
    assert [len(r) for r in per_rank] == [6, 6, 6]
    counts = Counter(x for r in per_rank for x in r)
    assert set(counts) == set(_everything(sizes))
    assert sum(counts.values()) - len(counts) == 2  # 16 samples padded to 18


def test_several_ranks_without_sizes_are_refused_unless_whole_shards(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [1, 2])
    with pytest.raises(ValueError, match="sizes="):
        pf.shards(paths, rank=0, world_size=2)
    loader = pf.shards(paths, rank=0, world_size=2, balance="shards")
    assert len(list(loader)) == 1


def test_a_state_from_another_world_size_is_refused(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [2, 2, 2])
    two = pf.shards(paths, seed=1, rank=0, world_size=2, balance="shards") | pf.read_tar()
    it = iter(two)
    next(it)
    three = pf.shards(paths, seed=1, rank=0, world_size=3, balance="shards") | pf.read_tar()
    with pytest.raises(ValueError, match=r"world_size=2 in the state|world_size=3"):
        three.load_state_dict(two.state_dict())


def test_patterns_expand_braces_and_globs(tmp_path: Any) -> None:
    write_shards(str(tmp_path), [1, 1, 1])
    braces = pf.shards(str(tmp_path / "shard-{0000..0002}.tar"), shuffle=False)
    globbed = pf.shards(str(tmp_path / "*.tar"), shuffle=False)
    assert [s.url for s in braces] == [s.url for s in globbed]
    with pytest.raises(ValueError, match="no shard matches"):
        pf.shards(str(tmp_path / "*.nothing"))
    with pytest.raises(ValueError, match="listed twice"):
        pf.shards(["a.tar", "a.tar"])
    with pytest.raises(ValueError, match="one size per shard"):
        pf.shards(["a.tar"], sizes=[1, 2])
    with pytest.raises(ValueError, match="balance"):
        pf.shards(["a.tar"], balance="even")
    with pytest.raises(TypeError, match="prefetch"):
        pf.read_tar(prefetch=1.5)


# -- cheap resume ---------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", KINDS)
def test_a_resume_reads_no_shard_that_was_done(tmp_path: Any, kind: str) -> None:
    sizes = [4] * 6
    paths = write_shards(str(tmp_path), sizes, kind)
    loader = pf.shards(paths, seed=3) | READERS[kind]()
    full = [ident(s) for s in loader]
    loader.set_epoch(0)
    it = iter(loader)
    head = [ident(next(it)) for _ in range(14)]  # shards 0-2 done, the 4th open
    state = loader.state_dict()
    (record,) = state["stages"].values()
    assert record["inputs"] == 3 and record["start"] == 2 and "offset" in record
    done = {s["__url__"] for s in pf.shards(paths, seed=3) | READERS[kind]()} - {
        s for s in paths if any(x.startswith(f"{paths.index(s)}-") for x in full[14:])
    }
    for path in done:
        os.remove(path)  # a resumed pass must not open them
    resumed = pf.shards(paths, seed=3) | READERS[kind]()
    resumed.load_state_dict(state)
    assert head + [ident(s) for s in resumed] == full


def test_a_buffer_shuffle_after_the_reader_resumes_exactly_rereading_its_span(
    tmp_path: Any,
) -> None:
    paths = write_shards(str(tmp_path), [25] * 40)  # 1,000 samples

    def make() -> Any:
        return pf.shards(paths, seed=2) | pf.read_tar() | pf.shuffle(seed=4, buffer_size=20)

    loader = make()
    full = [ident(s) for s in loader]
    assert sorted(full) == sorted(_everything([25] * 40)) and full != sorted(full)
    for step in (0, 1, 19, 20, 21, 500, 985, 999, 1000):
        loader.set_epoch(0)
        it = iter(loader)
        head = [ident(next(it)) for _ in range(step)]
        resumed = make()
        resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
        resumed.reset_stats()
        assert head + [ident(s) for s in resumed] == full, step
        read = resumed.stats().stages[1].items  # what the reader made again
        assert read - (1000 - step) <= 200, (step, read)  # the buffer's span, not the epoch


def test_malformed_reader_and_buffer_records_are_refused_and_leave_the_loader(
    tmp_path: Any,
) -> None:
    paths = write_shards(str(tmp_path), [5] * 4)

    def make() -> Any:
        return pf.shards(paths, seed=2) | pf.read_tar() | pf.shuffle(seed=4, buffer_size=3)

    loader = make()
    full = [ident(s) for s in loader]
    loader.set_epoch(0)
    it = iter(loader)
    for _ in range(7):
        next(it)
    good = loader.state_dict()
    pass_ = {"epoch": 0, "seed": 4}
    assert good["stages"]["1"] == {"inputs": 7, "made": 7, "read": 10, **pass_}
    bad = [
        ("0", {"inputs": -1}),
        ("0", {"inputs": 1, "start": 2, "offset": "x"}),
        ("0", {"inputs": 1, "offset": 512}),
        ("0", {"inputs": 1, "what": 1}),
        ("1", {"inputs": 9, "made": 7, "read": 10, **pass_}),
        ("1", {"inputs": 0, "made": 6, "read": 10, **pass_}),
        ("1", {"inputs": 0, "made": 7, "read": 2, **pass_}),
        ("1", {"inputs": 7, "made": 7, "read": 10}),  # no epoch, no seed
        ("1", {"inputs": 7, "made": 7, "read": 10, "epoch": -1, "seed": 4}),
        ("1", {"inputs": 7, "made": 7, "read": 10, "epoch": 0, "seed": "4"}),
        ("1", "nope"),
    ]
    for key, record in bad:
        state = json.loads(json.dumps(good))
        state["stages"][key] = record
        fresh = make()
        with pytest.raises(ValueError, match=r"load_state_dict: state\['stages'\]"):
            fresh.load_state_dict(state)
        assert [ident(s) for s in fresh] == full  # left as it was


@pytest.mark.parametrize("seed", [4, None])
def test_a_buffer_record_from_another_epoch_or_seed_is_refused_at_load(
    tmp_path: Any, seed: int | None
) -> None:
    paths = write_shards(str(tmp_path), [5] * 4)

    def make(shuffle_seed: int | None) -> Any:
        shuffled = pf.shuffle(seed=shuffle_seed, buffer_size=3)
        return pf.shards(paths, seed=2) | pf.read_tar() | shuffled

    def state_at(loader: Any, epoch: int, step: int = 7) -> dict[str, Any]:
        loader.set_epoch(epoch)
        it = iter(loader)
        for _ in range(step):
            next(it)
        return json.loads(json.dumps(loader.state_dict()))

    source = make(seed)
    good = state_at(source, 1)
    other_epoch = dict(good, epoch=0)  # the same record, said to be epoch 0's
    other_seed = json.loads(json.dumps(good))  # the same position, said to be another seed's
    other_seed["stages"]["1"]["seed"] = good["stages"]["1"]["seed"] + 1
    assert other_seed["stages"]["1"]["seed"] != good["stages"]["1"]["seed"]
    whole = make(seed).with_seeds(iter(s for _, s, _ in good["seeds"]))  # as the state has it
    whole.set_epoch(1)
    full = [ident(s) for s in whole]
    for state, what in [(other_epoch, "epoch 1 with seed"), (other_seed, "seed ")]:
        fresh = make(seed)
        untouched = fresh.state_dict()
        with pytest.raises(ValueError, match=r"load_state_dict: state\['stages'\]\['1'\]") as e:
            fresh.load_state_dict(state)
        assert "is the buffer of a pass of epoch" in str(e.value) and what in str(e.value)
        assert fresh.state_dict() == untouched  # left as it was
    resumed = make(seed)
    resumed.load_state_dict(good)  # the state itself resumes exactly
    assert full[:7] + [ident(s) for s in resumed] == full


# -- uneven shards and DDP: a real two-rank gloo job ---------------------------------------------
def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_uneven_shards_hang_ddp_with_whole_shards_and_not_with_the_default(tmp_path: Any) -> None:
    sizes = [6, 2, 4]  # balance="shards" deals shards 0 and 2 to rank 0, shard 1 to rank 1
    paths = write_shards(str(tmp_path), sizes)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = {**os.environ, "PYTHONPATH": root, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    env["MASTER_PORT"] = str(_free_port())
    script = os.path.join(root, "tests", "_ddp_shards.py")
    ranks = [
        subprocess.Popen(
            [sys.executable, script, str(tmp_path), *paths],
            env={**env, "RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outs = [p.communicate(timeout=90) for p in ranks]
    finally:
        for p in ranks:
            p.kill()
    assert [p.returncode for p in ranks] == [0, 0], [o[1][-3000:] for o in outs]
    seen = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # the default policy: every rank the same number of steps, all of them done together
    pad = [s["pad"] for s in seen]
    assert [r["steps"] for r in pad] == [3, 3] and [r["hung"] for r in pad] == [None, None]
    assert sorted(x for r in pad for x in r["samples"]) == sorted(_everything(sizes))
    # batch inside two parallel_source workers: refused on both ranks as the pass starts,
    # never a hang; batch after them: the same steps on both ranks, every sample once
    inside = [s["inside"] for s in seen]
    assert all("batch runs inside the 2 workers" in r.get("refused", "") for r in inside), inside
    after = [s["after"] for s in seen]
    assert [r["steps"] for r in after] == [3, 3] and [r["hung"] for r in after] == [None, None]
    assert sorted(x for r in after for x in r["samples"]) == sorted(_everything(sizes))
    # whole shards, no Join: rank 0 has 5 batches, rank 1 one; rank 0's second all-reduce
    # waits on a rank that will never join it, until the process group's timeout
    whole = [s["shards"] for s in seen]
    assert whole[1] == {"steps": 1, "samples": ["1-0", "1-1"], "hung": None}
    assert whole[0]["steps"] == 1 and whole[0]["hung"] is not None, whole[0]
    assert "timed out" in whole[0]["hung"].lower() or "timeout" in whole[0]["hung"].lower()


# -- a kill, then a resume in a new process -------------------------------------------------------
_SCRIPT = textwrap.dedent(
    """
    import json, os, signal, sys
    sys.path.insert(0, {root!r})
    from tests._shards import ident, stream_loader
    case = json.loads(sys.argv[2])
    args = [case[k] for k in ("paths", "rank", "world", "workers", "backend")]
    loader = stream_loader(*args)
    if sys.argv[1] == "run":
        loader.set_epoch(case["epoch"])
        it = iter(loader)
        for _, s in zip(range(case["step"]), it):  # at most the rank's epoch
            print(json.dumps(ident(s)), flush=True)
        print(json.dumps(loader.state_dict()), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    else:
        loader.load_state_dict(json.loads(sys.stdin.read()))
        for s in loader:
            print(json.dumps(ident(s)), flush=True)
        for s in loader:  # the next epoch too
            print(json.dumps(ident(s)), flush=True)
    """
)


def _run(script: Any, case: dict[str, Any], *args: str, state: str | None = None) -> Any:
    return subprocess.run(
        [sys.executable, str(script), *args, json.dumps(case)],
        input=state,
        capture_output=True,
        text=True,
        timeout=60,
    )


@settings(max_examples=3)  # two new processes an example (and their workers)
@given(
    sizes=st.lists(st.integers(0, 9), min_size=1, max_size=6),
    world=st.integers(1, 2),
    workers=st.integers(0, 2),
    backend=st.sampled_from(["thread", "process"]),
    step=st.integers(0, 40),
    epoch=st.integers(0, 2),
)
@example(sizes=[6, 0, 9, 4, 7, 5], world=1, workers=2, backend="process", step=9, epoch=1)
@example(sizes=[6, 0, 9, 4, 7, 5], world=2, workers=2, backend="process", step=0, epoch=1)
def test_killed_then_resumed_in_a_new_process(
    tmp_path_factory: Any,
    sizes: list[int],
    world: int,
    workers: int,
    backend: str,
    step: int,
    epoch: int,
) -> None:
    folder = tmp_path_factory.mktemp("killed")
    paths = write_shards(str(folder), sizes)
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = folder / "run.py"
    script.write_text(_SCRIPT.format(root=root))
    rank = world - 1
    case = {"paths": paths, "rank": rank, "world": world, "workers": workers}
    case.update(backend=backend, step=step, epoch=epoch)
    first = _run(script, case, "run")
    lines = first.stdout.splitlines()
    assert first.returncode == -9, first.stderr[-3000:]
    head, state = [json.loads(x) for x in lines[:-1]], lines[-1]
    rest = _run(script, case, "resume", state=state)
    assert rest.returncode == 0, rest.stderr[-3000:]
    tail = [json.loads(x) for x in rest.stdout.splitlines()]
    seeds = [s[1] for s in json.loads(state)["seeds"]]  # the drawn seeds travelled in the state
    whole = stream_loader(paths, rank, world, workers, "thread", seeds=seeds)
    whole.set_epoch(epoch)
    this, following = [ident(s) for s in whole], [ident(s) for s in whole]
    if step > len(this):  # the run ended its pass: the state is the next epoch's start
        assert head == this
        assert tail == following + [ident(s) for s in whole]
    else:  # the rest of the epoch (empty when the state came after its last item), the next
        assert head + tail == this + following


# -- failures ---------------------------------------------------------------------------------------
def test_a_sample_that_fails_to_decode_is_dropped_by_ignore_errors(tmp_path: Any) -> None:
    path = str(tmp_path / "bad.jsonl")
    with open(path, "w") as f:
        f.write('{"id": "a"}\n{not json\n{"id": "c"}\n')
    loader = pf.shards([path]) | pf.read_jsonl()
    it = iter(loader)
    assert next(it)["json"] == {"id": "a"}
    with pytest.raises(ValueError) as info:
        next(it)
    assert "line 2 (byte 12) of shard" in " ".join(info.value.__notes__)
    assert next(it)["json"] == {"id": "c"}  # the pass goes on
    dropping = pf.shards([path]) | pf.read_jsonl() | pf.ignore_errors()
    assert [s["json"]["id"] for s in dropping] == ["a", "c"]


def test_a_missing_or_truncated_shard_is_one_error_and_ignore_errors_counts_it(
    tmp_path: Any,
) -> None:
    paths = write_shards(str(tmp_path), [3, 3, 3])
    with open(paths[1], "r+b") as f:
        f.truncate(3072 + 100)  # inside the header of the second sample's second file
    os.remove(paths[2])
    out, errors = [], []
    it = iter(pf.shards(paths, shuffle=False) | pf.read_tar())
    while True:
        try:
            out.append(ident(next(it)))
        except StopIteration:
            break
        except pf.ShardReadError as e:
            errors.append(str(e))
    assert out == ["0-0", "0-1", "0-2", "1-0"]  # nothing after a cut, nothing twice
    assert len(errors) == 2, errors
    assert paths[1] in errors[0] and "at byte 3072" in errors[0]
    assert "does not exist" in errors[1] and paths[2] in errors[1]
    # under ignore_errors each is one failed item, dropped and counted; the pass goes on
    dropping = pf.shards(paths, shuffle=False) | pf.read_tar() | pf.ignore_errors()
    assert [ident(s) for s in dropping] == out
    assert dropping.stats().stages[-1].ignored_errors == 2


def test_sizes_that_lie_are_an_error(tmp_path: Any) -> None:
    paths = write_shards(str(tmp_path), [3, 2])
    few = pf.shards(paths, sizes=[3, 3], shuffle=False) | pf.read_tar()
    with pytest.raises(pf.ShardReadError, match="has 2 samples, and sizes= gives it 3"):
        list(few)
    many = pf.shards(paths, sizes=[2, 2], shuffle=False) | pf.read_tar()
    with pytest.raises(pf.ShardReadError, match="more samples than the 2"):
        list(many)
