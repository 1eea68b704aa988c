"""``pf.cache``: the output is the uncached pipeline's, epoch by epoch, and each sample is
computed once in all (counted by the computing function itself, in files, so that worker
processes are counted honestly); randomness before it refused; bounded; persistent."""

from __future__ import annotations

import glob
import json
import os
import signal
import subprocess
import sys
import textwrap
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.engine._memo import Home

# -- data that counts its computations -----------------------------------------------------------


class Counted:
    """A map-style dataset whose item ``i`` is 16 bytes made from ``i``; each computation
    leaves a file in *where* (named by the process and a number), so that any process's
    computations are counted."""

    def __init__(self, n: int, where: str, fail: frozenset[int] = frozenset()) -> None:
        self.n, self.where, self.fail = n, where, fail

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> bytes:
        fd, _ = _tempfile(self.where, f"{i}-")
        os.close(fd)
        if i in self.fail:
            raise OSError(f"sample {i} is damaged")
        return i.to_bytes(2, "little") * 8


def _tempfile(where: str, prefix: str) -> tuple[int, str]:
    import tempfile

    return tempfile.mkstemp(prefix=prefix, dir=where)


def computed(where: str) -> list[int]:
    """The indices computed so far (one per computation), and forget them."""
    names = os.listdir(where)
    for name in names:
        os.unlink(os.path.join(where, name))
    return sorted(int(name.split("-")[0]) for name in names)


def decode(sample: bytes) -> bytes:
    return sample[::-1]


def as_list(batch: Any) -> Any:
    return [bytes(x) for x in batch] if isinstance(batch, list) else batch


def epochs_of(loader: pf.Loader[Any], count: int) -> list[list[Any]]:
    return [[as_list(x) for x in loader] for _ in range(count)]


# -- the output, and the count ----------------------------------------------------------------------


@settings(max_examples=15, deadline=None)
@given(
    n=st.integers(0, 40),
    seed=st.integers(0, 2**32),
    workers=st.sampled_from([0, 1, 2]),
    cap=st.one_of(st.none(), st.integers(0, 40)),
    count=st.integers(1, 3),
)
def test_a_cache_in_the_main_process_changes_nothing_but_the_work(
    tmp_path_factory: pytest.TempPathFactory,
    n: int,
    seed: int,
    workers: int,
    cap: int | None,
    count: int,
) -> None:
    where = str(tmp_path_factory.mktemp("calls"))
    data = Counted(n, where)
    size = 16 + 49  # the cache's estimate of one sample: its bytes and a bytes object's header
    max_bytes = None if cap is None else max(1, cap * size)
    work = pf.fetch(data) | pf.map(decode)

    def build(cached: bool) -> pf.Loader[Any]:
        loader = pf.indices(n) | pf.shuffle(seed=seed) | pf.parallel_map(work, workers=workers)
        loader = loader | pf.cache(max_bytes=max_bytes) if cached else loader
        return loader | pf.random_map(lambda x, rng: (x, int(rng.integers(99))), seed=seed)

    with build(False) as plain:
        want = epochs_of(plain, count)
    computed(where)
    with build(True) as cached:
        got = epochs_of(cached, count)
        stats = next(s for s in cached.stats().stages if s.name == "cache")
    assert got == want
    kept = n if cap is None else min(n, cap)
    assert len(computed(where)) == n + (count - 1) * (n - kept)
    assert (stats.cache_hits, stats.cache_misses) == (
        (count - 1) * kept,
        n + (count - 1) * (n - kept),
    )


@pytest.mark.parametrize("backend", ["thread", "process"])
@settings(max_examples=6, deadline=None)
@given(
    n=st.integers(1, 30),
    size=st.integers(1, 7),
    seed=st.integers(0, 2**32),
    workers=st.integers(1, 3),
    persistent=st.booleans(),
    cap=st.one_of(st.none(), st.integers(1, 20)),
    count=st.integers(1, 3),
)
def test_a_cache_in_the_workers_computes_each_sample_once_in_all(
    tmp_path_factory: pytest.TempPathFactory,
    backend: str,
    n: int,
    size: int,
    seed: int,
    workers: int,
    persistent: bool,
    cap: int | None,
    count: int,
) -> None:
    where = str(tmp_path_factory.mktemp("calls"))
    data = Counted(n, where)
    max_bytes = None if cap is None else cap * 400  # in worker processes: about 300 a file

    def build(cached: bool) -> pf.Loader[Any]:
        work = pf.fetch(data) | pf.map(tuple)
        if cached:
            work = pf.fetch(data) | pf.cache(max_bytes=max_bytes) | pf.map(tuple)
        stage = pf.parallel_map(work, workers=workers, backend=backend, persistent=persistent)
        return pf.indices(n) | pf.shuffle(seed=seed) | pf.batch(size) | stage

    with build(False) as plain:
        want = epochs_of(plain, count)
    computed(where)
    with build(True) as cached:
        got = epochs_of(cached, count)
        row = cached.stats().stages[-1]
    assert got == want
    made = computed(where)
    assert row.cache_hits + row.cache_misses == count * n
    assert len(made) == row.cache_misses  # what the cache counts is what ran
    if cap is None:
        assert made == list(range(n))  # once each, whichever worker got it
    else:
        assert set(made) == set(range(n))


def test_a_key_that_comes_again_while_in_flight_is_computed_once(tmp_path: Any) -> None:
    where = str(tmp_path)
    data = Counted(5, where)
    keys = [3, 1, 3, 3, 0, 1, 4, 3]
    want = [data[k] for k in keys]
    computed(where)
    work = pf.parallel_map(pf.fetch(data), workers=2, max_in_flight=4)
    loader = pf.from_iterable(keys) | work | pf.cache()
    assert [bytes(x) for x in loader] == want
    assert computed(where) == [0, 1, 3, 4]
    assert [bytes(x) for x in loader] == want
    assert computed(where) == []
    batches = [[3, 1, 3], [1, 4], [4, 4, 0]]
    want = [[data[k] for k in b] for b in batches]
    computed(where)
    batched = pf.from_iterable(batches) | pf.fetch(data) | pf.cache()
    assert [as_list(b) for b in batched] == want
    assert computed(where) == [0, 1, 3, 4]


def test_a_failed_sample_is_not_kept_and_fails_again(tmp_path: Any) -> None:
    where = str(tmp_path)
    data = Counted(6, where, fail=frozenset({2}))

    def build(cached: bool) -> pf.Loader[Any]:
        loader = pf.indices(6) | pf.fetch(data)
        loader = loader | pf.cache() if cached else loader
        return loader | pf.ignore_errors(exceptions=OSError)

    want = epochs_of(build(False), 2)
    computed(where)
    cached = build(True)
    assert epochs_of(cached, 2) == want
    assert computed(where) == [0, 1, 2, 2, 3, 4, 5]  # 2 failed in both epochs
    assert [s.ignored_errors for s in cached.stats().stages][-1] == 2


def test_a_stream_is_cached_by_shard_and_place_the_reader_still_reads(tmp_path: Any) -> None:
    paths = []
    for k in range(3):
        paths.append(str(tmp_path / f"s{k}.jsonl"))
        with open(paths[-1], "w") as f:
            f.writelines(json.dumps({"x": 10 * k + j}) + "\n" for j in range(4))
    calls: list[Any] = []

    def decode(sample: dict[str, Any]) -> int:
        calls.append(sample["__key__"])
        return int(sample["json"]["x"])

    def build(cached: bool) -> pf.Loader[Any]:
        loader = pf.shards(paths, seed=3) | pf.read_jsonl() | pf.map(decode)
        loader = loader | pf.cache() if cached else loader
        return loader | pf.batch(5)

    want = epochs_of(build(False), 3)
    calls.clear()
    cached = build(True)
    assert epochs_of(cached, 3) == want
    assert len(calls) == 12  # the first epoch only
    stats = next(s for s in cached.stats().stages if s.name == "cache")
    assert (stats.cache_hits, stats.cache_misses) == (24, 12)


# -- randomness ----------------------------------------------------------------------------------


def jitter(x: bytes, rng: Any) -> bytes:
    return x + bytes([int(rng.integers(256))])


def _by_epoch(items: Any, *, epoch: int) -> Any:
    for x in items:
        yield (x, epoch)


def by_epoch(one_to_one: bool = True) -> pf.Stage[Any, Any]:
    """Each item with the epoch: one-to-one and in order (it resumes by skipping inputs),
    or declared only as keeping the count (it replays)."""
    return pf.Stage(_by_epoch, "by_epoch", length="same", skip="same" if one_to_one else None)


@pytest.mark.parametrize(
    ("build", "named"),
    [
        (lambda d: pf.indices(4) | pf.fetch(d) | pf.random_map(jitter) | pf.cache(), "random_map"),
        (lambda d: pf.indices(4) | pf.fetch(d) | by_epoch() | pf.map(len) | pf.cache(), "by_epoch"),
        (
            lambda d: (
                pf.indices(4)
                | pf.parallel_map(pf.fetch(d) | pf.random_map(jitter), workers=2)
                | pf.cache()
            ),
            r"random_map \(in parallel_map\)",
        ),
        (
            lambda d: (
                pf.indices(4)
                | pf.batch(2)
                | pf.parallel_map(pf.fetch(d) | pf.random_map(jitter) | pf.cache(), workers=2)
            ),
            "random_map",
        ),
    ],
    ids=["random_map", "epoch", "inside-parallel", "inside-workers"],
)
def test_a_stage_that_draws_before_a_cache_is_refused_when_the_loader_is_built(
    tmp_path: Any, build: Any, named: str
) -> None:
    with pytest.raises(ValueError, match=rf"^cache: {named} before it draws new numbers") as e:
        build(Counted(4, str(tmp_path)))
    assert "put cache() before" in str(e.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda d: pf.indices(4) | pf.cache(),
        lambda d: pf.indices(4) | pf.fetch(d) | pf.batch(2) | pf.cache(),
        lambda d: pf.indices(4) | pf.parallel_map(pf.cache() | pf.fetch(d), workers=2),
    ],
    ids=["first", "after-batch", "first-in-workers"],
)
def test_a_cache_with_nothing_above_it_to_spare_is_refused(tmp_path: Any, build: Any) -> None:
    with pytest.raises(ValueError, match=r"^cache: nothing above it to skip"):
        build(Counted(4, str(tmp_path)))


def test_random_stages_after_a_cache_draw_as_without_it(tmp_path: Any) -> None:
    data = Counted(8, str(tmp_path))

    def build(cached: bool) -> pf.Loader[Any]:
        loader = pf.indices(8) | pf.shuffle(seed=4) | pf.fetch(data)
        loader = loader | pf.cache() if cached else loader
        return loader | pf.random_map(jitter, seed=9) | pf.batch(3)

    assert epochs_of(build(True), 3) == epochs_of(build(False), 3)


def test_a_stage_that_changes_the_keys_by_epoch_gives_new_keys_not_stale_values() -> None:
    calls: list[Any] = []

    def work(key: Any) -> Any:
        calls.append(key)
        return key

    loader = pf.indices(3) | by_epoch(one_to_one=False) | pf.map(work) | pf.cache()
    assert [list(loader) for _ in range(2)] == [[(i, e) for i in range(3)] for e in range(2)]
    assert len(calls) == 6  # the keys are the items: (index, epoch)


def test_a_kept_array_is_read_only() -> None:
    loader = pf.indices(3) | pf.map(lambda i: np.full(4, i)) | pf.cache()
    first, second = list(loader), list(loader)
    assert all(not a.flags.writeable for a in first + second)
    assert [a.tolist() for a in second] == [[i] * 4 for i in range(3)]


# -- resume --------------------------------------------------------------------------------------


@settings(max_examples=10, deadline=None)
@given(k=st.integers(0, 12), warm=st.booleans(), cap=st.sampled_from([None, 5 * 65]))
def test_a_state_resumes_exactly_in_a_fresh_loader_warm_or_cold(
    tmp_path_factory: pytest.TempPathFactory, k: int, warm: bool, cap: int | None
) -> None:
    data = Counted(12, str(tmp_path_factory.mktemp("calls")))

    def build() -> pf.Loader[Any]:
        return (
            pf.indices(12)
            | pf.shuffle(seed=2)
            | pf.parallel_map(pf.fetch(data), workers=2)
            | pf.cache(max_bytes=cap)
            | pf.random_map(jitter, seed=1)
        )

    reference = build()
    want = epochs_of(reference, 3)
    loader = build()
    if warm:
        list(loader)
    it = iter(loader)
    head = [bytes(next(it)) for _ in range(k)]
    state = loader.state_dict()
    loader.close()
    epoch = 1 if warm else 0
    assert head == want[epoch][:k]
    fresh = build()
    if warm:
        list(fresh)  # warm too: the state's rest comes from the cache
    fresh.load_state_dict(state)
    assert [bytes(x) for x in fresh] == want[epoch][k:]
    assert [bytes(x) for x in fresh] == want[epoch + 1]


# -- persistent ----------------------------------------------------------------------------------

_RUN = textwrap.dedent(
    """
    import sys
    sys.path.insert(0, {root!r})
    import pipeflow as pf
    from tests.test_cache import Counted, decode{extra}
    data = Counted({n}, {calls!r})
    loader = pf.indices(data) | pf.shuffle(seed=1) | pf.fetch(data) | pf.map({fn}) | pf.cache({path!r})
    import json
    print(json.dumps([bytes(x).hex() for x in loader]))
    """
)


def run_elsewhere(path: str, calls: str, n: int = 10, fn: str = "decode") -> list[str]:
    """One epoch of a persistent cache's loader in a new process: its items."""
    extra = ", reverse" if fn == "reverse" else ""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    code = _RUN.format(root=root, extra=extra, n=n, calls=calls, path=path, fn=fn)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    items: list[str] = json.loads(out.stdout)
    return items


def reverse(sample: bytes) -> bytes:
    return bytes(reversed(sample))


def test_a_disk_cache_is_reused_by_a_new_process_and_ignored_after_a_change(tmp_path: Any) -> None:
    path, calls = str(tmp_path / "cache"), str(tmp_path / "calls")
    os.mkdir(calls)
    first = run_elsewhere(path, calls)
    assert len(computed(calls)) == 10
    assert run_elsewhere(path, calls) == first
    assert computed(calls) == []  # a new process: nothing computed
    # another function above the cache (same result, other code): recomputed, not served stale
    assert run_elsewhere(path, calls, fn="reverse") == first
    assert len(computed(calls)) == 10
    # another dataset length: recomputed
    assert len(run_elsewhere(path, calls, n=11)) == 11
    assert len(computed(calls)) == 11
    assert len(os.listdir(path)) == 3  # one directory per identity


def test_a_torn_or_foreign_entry_is_recomputed_never_served(tmp_path: Any) -> None:
    path, calls = str(tmp_path / "cache"), str(tmp_path / "calls")
    os.mkdir(calls)
    first = run_elsewhere(path, calls)
    computed(calls)
    entries = sorted(glob.glob(os.path.join(path, "*", "i*")))
    torn, flipped, swapped = entries[0], entries[1], entries[2]
    with open(torn, "r+b") as f:  # a crash left it short
        f.truncate(os.path.getsize(torn) // 2)
    with open(flipped, "r+b") as f:  # a bit went wrong on disk
        f.seek(-1, os.SEEK_END)
        last = f.read(1)
        f.seek(-1, os.SEEK_END)
        f.write(bytes([last[0] ^ 1]))
    os.replace(entries[3], swapped)  # another key's entry under this name
    dead = subprocess.run(
        [sys.executable, "-c", "import os; print(os.getpid())"],
        capture_output=True,
        text=True,
        check=True,
    )
    interrupted = os.path.join(os.path.dirname(torn), f".tmp-{dead.stdout.strip()}-2-3")
    with open(interrupted, "wb") as f:
        f.write(b"half")  # a write the crash interrupted, by a process gone now
    assert run_elsewhere(path, calls) == first
    assert not os.path.exists(interrupted)
    names = {os.path.basename(p)[1:] for p in (torn, flipped, swapped, entries[3])}
    assert sorted(computed(calls)) == sorted(int(x) for x in names)


# -- resources ------------------------------------------------------------------------------------


def test_closing_the_loader_removes_the_shared_files(tmp_path: Any) -> None:
    data = Counted(8, str(tmp_path))
    work = pf.fetch(data) | pf.cache() | pf.map(tuple)
    loader = pf.indices(8) | pf.batch(3) | pf.parallel_map(work, workers=2, backend="process")
    list(loader)
    home = loader._facts()["memo"]
    assert os.listdir(home.shared)  # the workers' entries, in shared memory
    loader.close()
    assert not os.path.exists(home.shared)


def test_the_shared_files_of_a_killed_loader_go_when_the_next_one_starts(tmp_path: Any) -> None:
    code = textwrap.dedent(
        f"""
        import os, sys, time
        sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})
        import pipeflow as pf
        from tests.test_cache import Counted
        data = Counted(8, {str(tmp_path)!r})
        work = pf.fetch(data) | pf.cache() | pf.map(tuple)
        loader = pf.indices(8) | pf.batch(3) | pf.parallel_map(work, workers=2, backend="process")
        list(loader)
        print(loader._facts()["memo"].shared, flush=True)
        time.sleep(60)
        """
    )
    child = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert child.stdout is not None
    shared = child.stdout.readline().strip()
    assert os.path.isdir(shared)
    child.send_signal(signal.SIGKILL)
    child.wait()
    assert os.path.isdir(shared)  # nothing could clean after a SIGKILL
    from pipeflow.engine import _memo

    _memo._SWEPT.clear()  # a new process would sweep at its first loader with a cache
    Home.new(None)
    assert not os.path.exists(shared)


def test_a_cache_after_collate_is_refused_not_split_into_rows() -> None:
    rows = [np.full(2, i) for i in range(8)]
    loader = pf.indices(8) | pf.batch(4) | pf.fetch(rows) | pf.collate() | pf.cache()
    with pytest.raises(
        ValueError, match=r"made a Tensor \(not a list of samples\) from a batch of 4"
    ):
        list(loader)


def test_stats_between_epochs_leave_forked_workers_their_shared_store(tmp_path: Any) -> None:
    where = str(tmp_path)
    data = Counted(10, where)
    work = pf.fetch(data) | pf.cache() | pf.map(tuple)
    stage = pf.parallel_map(work, workers=2, backend="process", mp_context="fork")
    loader = pf.indices(10) | pf.shuffle(seed=1) | pf.batch(4) | stage
    for _ in range(3):
        list(loader)
        row = loader.stats().stages[-1]  # the parent opens its own view of the cache
    assert computed(where) == list(range(10))
    assert (row.cache_hits, row.cache_misses) == (20, 10)
    loader.close()


def test_a_state_resumes_with_another_path_or_cap(tmp_path: Any) -> None:
    def build(path: str | None, cap: int | None) -> pf.Loader[Any]:
        work = pf.map(decode)
        return pf.indices(6) | pf.map(lambda i: bytes([i])) | work | pf.cache(path, max_bytes=cap)

    loader = build(str(tmp_path / "a"), None)
    it = iter(loader)
    head = [next(it) for _ in range(2)]
    fresh = build(None, 100)
    fresh.load_state_dict(loader.state_dict())
    assert head + list(fresh) == [bytes([i]) for i in range(6)]


_SPAWNED = textwrap.dedent(
    """
    import os, sys
    sys.path.insert(0, {root!r})
    import pipeflow as pf

    CALLS = os.environ["CALLS"]  # the spawned workers import this script again


    def decode(i):
        open(os.path.join(CALLS, f"{{os.getpid()}}-{{i}}"), "w").close()
        return i * 3


    if __name__ == "__main__":
        path = sys.argv[1]
        work = pf.fetch(list(range(9))) | pf.map(decode) | pf.cache(path)
        stage = pf.parallel_map(work, workers=2, backend="process", mp_context="spawn")
        with pf.indices(9) | stage as spawned:
            want = list(spawned)
        first = len(os.listdir(CALLS))
        inline = pf.indices(9) | pf.fetch(list(range(9))) | pf.map(decode) | pf.cache(path)
        assert list(inline) == want
        print(first, len(os.listdir(CALLS)) - first, len(os.listdir(path)))
    """
)


def test_a_disk_cache_written_by_spawned_workers_serves_the_main_script(tmp_path: Any) -> None:
    """The script's own functions are ``__mp_main__``'s in its spawned workers, and
    ``__main__``'s in it: one identity, so the script reads what its workers wrote."""
    calls = tmp_path / "calls"
    calls.mkdir()
    script = tmp_path / "train.py"
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script.write_text(_SPAWNED.format(root=root))
    env = {**os.environ, "CALLS": str(calls)}
    out = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "cache")],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    assert out.stdout.split() == ["9", "0", "1"]  # computed by the workers, then never


class Slow(Counted):
    """:class:`Counted`, each computation taking 0.2 s: two workers given the same keys at
    once are both busy with them."""

    def __getitem__(self, i: int) -> bytes:
        import time

        time.sleep(0.2)
        return super().__getitem__(i)


@pytest.mark.parametrize("backend", ["thread", "process"])
def test_a_key_two_workers_miss_at_once_is_computed_once(tmp_path: Any, backend: str) -> None:
    where = str(tmp_path)
    data = Slow(3, where)
    batches = [[0, 1, 2], [1, 0, 2], [0, 2, 1], [2, 1, 0]]  # drawn with replacement
    want = [[data[k] for k in b] for b in batches]
    computed(where)
    work = pf.fetch(data) | pf.cache() | pf.map(list)
    stage = pf.parallel_map(work, workers=2, backend=backend, max_in_flight=2)
    with pf.from_iterable(batches) | stage as loader:
        assert [[bytes(x) for x in b] for b in loader] == want
        row = loader.stats().stages[-1]
    assert computed(where) == [0, 1, 2]  # once each in all, though both workers missed them
    assert (row.cache_hits, row.cache_misses) == (9, 3)


def test_a_claim_whose_process_died_is_taken_over(tmp_path: Any) -> None:
    from pipeflow.stages._cache_store import FileStore

    root = str(tmp_path / "store")
    code = (
        f"import sys; sys.path.insert(0, {os.path.dirname(os.path.dirname(os.path.abspath(__file__)))!r})\n"
        "from pipeflow.stages._cache_store import FileStore\n"
        f"assert FileStore({root!r}, verify=False).claim(7)\n"  # and dies holding it
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    store = FileStore(root, verify=False)
    assert os.path.exists(os.path.join(root, "i7.claim"))
    assert store.wait(7, lambda: b"seven") == (b"seven", True)  # made here, not waited for
    assert store.get(7) == b"seven"
    assert not os.path.exists(os.path.join(root, "i7.claim"))
    assert store.claim(8)
    assert not FileStore(root, verify=False).claim(8)  # held by a live process (this one)
    store.release(8)


_KILLED = textwrap.dedent(
    """
    import json, sys, time
    sys.path.insert(0, {root!r})
    import pipeflow as pf
    from tests.test_cache import Counted, decode

    def build(placement, workers, persistent):
        data = Counted(14, {calls!r})
        if placement == "main":
            work = pf.parallel_map(pf.fetch(data), workers=workers, persistent=persistent,
                                   backend="process")
            return (pf.indices(14) | pf.shuffle(seed=3) | work | pf.cache()
                    | pf.map(decode) | pf.batch(3))
        work = pf.fetch(data) | pf.cache() | pf.map(list)
        stage = pf.parallel_map(work, workers=workers, persistent=persistent, backend="process")
        return pf.indices(14) | pf.shuffle(seed=3) | pf.batch(3) | stage

    def plain(batches):
        return [[bytes(x).hex() for x in b] for b in batches]

    mode, placement, workers, persistent, k = sys.argv[1:6]
    loader = build(placement, int(workers), persistent == "1")
    if mode == "whole":
        print(json.dumps([plain(loader) for _ in range(3)]), flush=True)
    elif mode == "take":
        list(loader)  # a warm cache: the state is taken in a cached epoch
        it = iter(loader)
        head = plain(next(it) for _ in range(int(k)))
        print(json.dumps([head, loader.state_dict()]), flush=True)
        time.sleep(60)  # killed here
    else:
        loader.load_state_dict(json.loads(sys.stdin.read()))
        print(json.dumps([plain(loader), plain(loader)]), flush=True)
    """
)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("placement", "workers", "persistent"),
    [("main", 0, False), ("main", 2, True), ("workers", 2, False), ("workers", 2, True)],
)
def test_a_killed_run_with_a_warm_cache_resumes_exactly_in_a_new_process(
    tmp_path: Any, placement: str, workers: int, persistent: bool
) -> None:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    script = tmp_path / "run.py"
    script.write_text(_KILLED.format(root=root, calls=str(tmp_path)))
    args = [placement, str(workers), "1" if persistent else "0", "2"]

    def child(mode: str, stdin: str | None = None) -> Any:
        cmd = [sys.executable, str(script), mode, *args]
        out = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=True)
        return json.loads(out.stdout)

    whole = child("whole")
    taker = subprocess.Popen(
        [sys.executable, str(script), "take", *args], stdout=subprocess.PIPE, text=True
    )
    assert taker.stdout is not None
    head, state = json.loads(taker.stdout.readline())
    taker.send_signal(signal.SIGKILL)  # the run dies, its cache with it
    taker.wait()
    rest, following = child("rest", json.dumps(state))  # a new process, a cold cache
    assert head + rest == whole[1]
    assert following == whole[2]
