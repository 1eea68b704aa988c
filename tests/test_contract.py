"""The contract every stage factory keeps, checked against all of them (issue 12).

For each public factory in ``pipeflow.__all__`` that returns a stage or a loader, in each mode
that runs different code (shuffle's three, parallel stages on threads and on processes started
with fork and with spawn, stages made with ``@pf.stage``):

- nothing is read from upstream when ``iter()`` is called, only from the first ``next()``;
- bad arguments raise ``TypeError`` (wrong kind) or ``ValueError`` (out of range) when the
  stage is built, with a message that names the stage and the parameter;
- the recipe pickles, compares equal to its clone and to a twin built the same way, and has a
  readable repr;
- ``close()`` or ``del`` of an iterator after one ``next()`` leaves no thread, no child process,
  no file descriptor and no ``/dev/shm/pipeflow-*`` segment (the ``no_leaks`` fixture).

A new factory is one line in ``CASES`` (and its bad arguments lines in ``BAD``);
``test_every_exported_factory_has_a_case`` fails until it has them.
"""

from __future__ import annotations

import os
import pickle
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pytest

import pipeflow as pf
from tests.conftest import nothing_left
from tests.faults import square

pytestmark = pytest.mark.filterwarnings("ignore:pin_memory. no accelerator is available")

#: Exported names that are not stage or loader factories: classes, errors, functions on data.
NOT_FACTORIES = {
    "Context",  # what a pass tells a stage: tests/test_plan.py, tests/test_core.py
    "DataLoader",  # the torch facade: tests/test_dataloader*.py
    "ErrorBudgetExceeded",
    "set_warm_start",  # a switch, not a factory: tests/test_warm_start.py
    "Loader",  # built by the sources below and by `|`
    "Padded",  # what collate(pad=..., mask=True) returns: tests/test_pad.py
    "PipeflowError",
    "SharedList",
    "Source",  # the protocol the sources implement: every source case below is one
    "StageStats",  # what stats() returns: tests/test_stats.py
    "Traits",  # what a Stage declares of itself besides its function: tests/test_stage.py
    "Shard",  # what shards() yields to a reader: tests/test_shards.py
    "ShardReadError",
    "StageStuckError",
    "Stateful",  # the protocol a user's stateful object keeps: tests/test_stateful.py
    "StatefulDataLoader",  # torchdata's facade: tests/test_stateful.py
    "Stats",
    "WorkerDiedError",
    "WorkerError",
    "WorkerInfo",
    "WorkerTimeoutError",
    "default_collate",
    "default_convert",
    "get_worker_info",
    "shared_list",
}


# -- what the cases read and run (module level, so they pickle for process workers) -----------
@dataclass(frozen=True)
class Recorded:
    """A re-iterable, sized source that appends one byte to *log* for every item it hands
    out, from whichever thread or process reads it."""

    log: str
    n: int = 40
    pairs: bool = False  # yield [i, i] (a batch, for unbatch and collate) instead of i

    def __len__(self) -> int:
        return self.n

    def __iter__(self) -> Iterator[Any]:
        for i in range(self.n):
            with open(self.log, "a") as f:
                f.write(".")
            yield [i, i] if self.pairs else i


def reads(log: str) -> int:
    """How many items were read from a :class:`Recorded` source so far."""
    try:
        return os.path.getsize(log)
    except FileNotFoundError:
        return 0


DATA = list(range(100))


def is_even(x: int) -> bool:
    return x % 2 == 0


def jitter(x: int, rng: Any) -> int:
    return x + int(rng.integers(10))


def jitter_torch(x: int, rng: Any) -> int:
    import torch

    return x + int(torch.randint(10, (1,), generator=rng))


@pf.stage(length="same")
def add(items: Iterable[int], *, amount: int = 1) -> Iterator[int]:
    for x in items:
        yield x + amount


@pf.stage
def pairwise(items: Iterable[int], size: int, *, epoch: int) -> Iterator[tuple[int, ...]]:
    window: list[int] = []
    try:
        for x in items:
            window.append(x + epoch)
            if len(window) == size:
                yield tuple(window)
                window.clear()
    finally:
        window.clear()


def item_length(x: int) -> int:
    return x % 5


def as_tokens(x: int) -> Any:
    return np.arange(x % 5 + 1)


LENGTHS = [x % 7 for x in range(40)]  # a table of lengths for Recorded's indices 0..39


def doubled(items: Iterable[int]) -> Iterator[int]:
    for x in items:
        yield 2 * x


# -- the cases ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """One factory in one mode.

    Attributes:
        factory: the name in ``pipeflow.__all__`` it covers.
        build: the recipe (a stage or a loader) given a :class:`Recorded` source; a stage is
            put after ``from_iterable(source)``.
        pairs: the source yields batches ``[i, i]`` instead of integers.
        settle: seconds to wait after ``iter()`` before counting reads (workers read on their
            own threads or processes).
        reads: whether the first ``next()`` reads the source's items.
        leaks: why the leak checks fail for this case (a bug to fix), else ``None``.
    """

    id: str
    factory: str
    build: Callable[[Recorded], Any] = field(repr=False)
    pairs: bool = False
    settle: float = 0.0
    reads: bool = True  # reads its source's items (indices(dataset) only takes its length)
    leaks: str | None = None  # a known leak: the leak checks are expected to fail (the bug)

    def recipe(self, log: str = os.devnull) -> Any:
        return self.build(Recorded(log, pairs=self.pairs))

    def loader(self, log: str) -> pf.Loader:
        source = Recorded(log, pairs=self.pairs)
        made = self.build(source)
        return made if isinstance(made, pf.Loader) else pf.from_iterable(source) | made


def stage(factory: str, make: Callable[[], Any], *, id: str | None = None, **kw: Any) -> Any:
    """A case for a factory that returns a stage."""
    return _param(Case(id or factory, factory, lambda _: make(), **kw))


def source(
    factory: str, make: Callable[[Recorded], Any], *, id: str | None = None, **kw: Any
) -> Any:
    """A case for a factory that returns a loader reading *source*."""
    settle = 0.3 if factory.startswith("parallel") else 0.0
    return _param(Case(id or factory, factory, make, settle=settle, **kw))


def _param(case: Case) -> Any:
    # spawn starts a fresh interpreter per worker: slow, as are the other tests that do
    marks = [pytest.mark.slow] if case.id.endswith("-spawn") else []
    return pytest.param(case, id=case.id, marks=marks)


def parallel(id: str, make: Callable[[], Any]) -> Any:
    return stage("parallel_map", make, id=id, settle=0.3)


def threads(**kw: Any) -> dict[str, Any]:
    return dict(workers=2, backend="thread", seed=1, **kw)


def procs(method: str, **kw: Any) -> dict[str, Any]:
    return dict(workers=2, backend="process", mp_context=method, seed=1, **kw)


_SHARDS: dict[str, list[str]] = {}


def shard_files(kind: str) -> list[str]:
    """Two small shards of *kind* (``jsonl``, ``tar``, ``parquet``), made once per session."""
    if kind not in _SHARDS:
        import atexit
        import io
        import json
        import shutil
        import tarfile
        import tempfile

        where = tempfile.mkdtemp(prefix="pipeflow-contract-")
        atexit.register(shutil.rmtree, where, True)
        paths = [os.path.join(where, f"s{i}.{kind}") for i in range(2)]
        for i, path in enumerate(paths):
            rows = [{"x": 10 * i + j} for j in range(3)]
            if kind == "jsonl":
                with open(path, "w") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
            elif kind == "tar":
                with tarfile.open(path, "w") as tar:
                    for j, r in enumerate(rows):
                        data = json.dumps(r).encode()
                        info = tarfile.TarInfo(f"k{j}.json")
                        info.size = len(data)
                        tar.addfile(info, io.BytesIO(data))
            else:
                import pyarrow as pa
                import pyarrow.parquet as pq

                pq.write_table(pa.table({"x": [r["x"] for r in rows]}), path)
        _SHARDS[kind] = paths
    return _SHARDS[kind]


def jsonl_shard(i: int) -> str:
    return shard_files("jsonl")[i % 2]


def tar_shard(i: int) -> str:
    return shard_files("tar")[i % 2]


def parquet_shard(i: int) -> str:
    return shard_files("parquet")[i % 2]


TQDM_MONITOR = (
    "progress(force=True) leaves tqdm's 'tqdm_monitor' thread running after its bar is closed "
    "(tqdm 4.70 keeps the monitor alive once the last bar closes)"
)

CASES = [
    source("indices", lambda rec: pf.indices(rec), reads=False),
    source("from_iterable", lambda rec: pf.from_iterable(rec)),
    source("from_sampler", lambda rec: pf.from_sampler(rec)),
    stage("shuffle", lambda: pf.shuffle(seed=1), id="shuffle-full"),
    stage("shuffle", lambda: pf.shuffle(seed=1, buffer_size=4), id="shuffle-buffer"),
    stage("shuffle", lambda: pf.shuffle(seed=1, generator="torch"), id="shuffle-torch"),
    stage("batch", lambda: pf.batch(3)),
    stage("batch", lambda: pf.batch(3, drop_last=True), id="batch-drop_last"),
    stage("batch", lambda: pf.batch(max_tokens=8, length=item_length), id="batch-max_tokens"),
    stage("batch", lambda: pf.batch(2, max_tokens=8, length=item_length, window=5, seed=1), id="batch-max_tokens-window"),
    stage("bucket", lambda: pf.bucket([2], length=item_length, batch_size=2, window=5, seed=1), id="bucket-window"),
    stage("bucket", lambda: pf.bucket(3, lengths=LENGTHS, max_tokens=12, seed=1), id="bucket-lengths"),
    stage("pack", lambda: pf.map(as_tokens) | pf.pack(8, window=2), id="pack-first_fit"),
    stage("pack", lambda: pf.map(as_tokens) | pf.pack(8, window=2, method="concat"), id="pack-concat"),
    stage("unbatch", pf.unbatch, pairs=True),
    source("shards", lambda rec: pf.shards(shard_files("jsonl"), seed=1), reads=False),
    stage("read_jsonl", lambda: pf.map(jsonl_shard) | pf.read_jsonl()),
    stage("read_tar", lambda: pf.map(tar_shard) | pf.read_tar()),
    stage("read_parquet", lambda: pf.map(parquet_shard) | pf.read_parquet()),
    source("mix", lambda rec: pf.mix([pf.from_iterable(rec), pf.indices(3)], seed=1)),
    stage("fetch", lambda: pf.fetch(DATA)),
    stage("fetch", lambda: pf.fetch(DATA, batched=False), id="fetch-unbatched"),
    stage("map", lambda: pf.map(square)),
    stage("cache", lambda: pf.map(square) | pf.cache()),
    parallel("cache-in-workers", lambda: pf.batch(2) | pf.parallel_map(pf.fetch(DATA) | pf.cache(), **threads())),
    stage("filter", lambda: pf.filter(is_even)),
    stage("random_map", lambda: pf.random_map(jitter, seed=3)),
    stage("random_map", lambda: pf.random_map(jitter_torch, seed=3, generator="torch"), id="random_map-torch"),
    stage("collate", pf.collate, pairs=True),
    stage("collate", lambda: pf.collate(tuple), pairs=True, id="collate-fn"),
    stage("collate", lambda: pf.collate(pad=0, pad_to_multiple_of=8, mask=True), pairs=True, id="collate-pad"),
    stage("ignore_errors", pf.ignore_errors),
    stage("ignore_errors", lambda: pf.ignore_errors(exceptions=OSError, max_count=3), id="ignore_errors-budget"),
    stage("shard", lambda: pf.shard(1, 3)),
    stage("shard", pf.shard, id="shard-from-environment"),
    stage("progress", lambda: pf.progress(unit="img")),
    stage("progress", lambda: pf.progress(force=True), id="progress-forced-bar"),
    stage("pin_memory", pf.pin_memory),
    stage("to_device", lambda: pf.to_device("cpu")),
    stage("stage", lambda: add(amount=2), id="stage-decorated"),
    stage("stage", lambda: pairwise(2), id="stage-decorated-epoch-finally"),
    stage("Stage", lambda: pf.Stage(doubled, "doubled", length="same")),
    stage("Stage", lambda: pf.batch(2) | pf.unbatch() | pf.map(square), id="Stage-piped"),
    parallel("parallel_map-thread", lambda: pf.parallel_map(square, **threads())),
    parallel("parallel_map-thread-unordered", lambda: pf.parallel_map(square, **threads(ordered=False))),
    parallel("parallel_map-auto-thread", lambda: pf.parallel_map(square, workers="auto", seed=1)),
    parallel("parallel_map-auto-fork-unordered", lambda: pf.parallel_map(square, workers="auto", backend="process", ordered=False, seed=1)),
    parallel("parallel_map-thread-stage", lambda: pf.parallel_map(pf.fetch(DATA) | pf.map(square), **threads())),
    parallel("parallel_map-fork", lambda: pf.parallel_map(square, **procs("fork"))),
    parallel("parallel_map-fork-unordered", lambda: pf.parallel_map(square, **procs("fork", ordered=False))),
    parallel("parallel_map-fork-arrays", lambda: pf.parallel_map(pf.map(np.ones), **procs("fork"))),
    parallel("parallel_map-spawn", lambda: pf.parallel_map(square, **procs("spawn"))),
    source("parallel_source", lambda rec: pf.parallel_source(pf.from_iterable(rec), **threads()), id="parallel_source-thread"),
    source("parallel_source", lambda rec: pf.parallel_source(pf.from_iterable(rec) | pf.batch(2), **threads(ordered=False)), id="parallel_source-thread-unordered"),
    source("parallel_source", lambda rec: pf.parallel_source(pf.from_iterable(rec) | pf.map(np.ones), **procs("fork")), id="parallel_source-fork"),
    source("parallel_source", lambda rec: pf.parallel_source(pf.from_iterable(rec), **procs("fork", ordered=False)), id="parallel_source-fork-unordered"),
    source("parallel_source", lambda rec: pf.parallel_source(pf.from_iterable(rec), **procs("spawn")), id="parallel_source-spawn"),
]  # fmt: skip


def test_every_exported_factory_has_a_case() -> None:
    factories = set(pf.__all__) - NOT_FACTORIES
    covered = {p.values[0].factory for p in CASES}
    assert covered == factories, "add a line to CASES for each new factory"
    with_bad_arguments = {row.values[0] if hasattr(row, "values") else row[0] for row in BAD}
    # unbatch() and Stage(...) take no arguments a user could get wrong
    assert with_bad_arguments == factories - {"unbatch", "Stage"}


@pytest.fixture(autouse=True)
def _no_tqdm_monitor() -> None:
    """Stop tqdm's monitor thread if an earlier test started it, so that the leak checks
    see whether the test at hand starts one, whatever ran before."""
    for t in threading.enumerate():
        if t.name == "tqdm_monitor" and hasattr(t, "exit"):
            t.exit()


def expect_leak(case: Case, request: pytest.FixtureRequest) -> None:
    if case.leaks:
        request.applymarker(pytest.mark.xfail(strict=True, reason=case.leaks))


# -- laziness -------------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_iter_reads_nothing_from_upstream(case: Case, tmp_path, request) -> None:
    expect_leak(case, request)
    log = str(tmp_path / "reads")
    with nothing_left():
        loader = case.loader(log)
        it = iter(loader)
        time.sleep(case.settle)
        assert reads(log) == 0, f"{case.id}: iter() read {reads(log)} items"
        next(it)
        assert reads(log) > 0 or not case.reads
        it.close()


# -- value semantics ------------------------------------------------------------------------------
@pytest.mark.parametrize("case", CASES)
def test_recipe_pickles_compares_equal_and_has_a_readable_repr(case: Case) -> None:
    made = case.recipe()
    clone = pickle.loads(pickle.dumps(made))
    twin = case.recipe()
    text = repr(made)
    assert "object at 0x" not in text and "<function" not in text, text
    assert repr(clone) == text
    if isinstance(made, pf.Loader):
        # a loader also holds its runs (epoch, progress): its recipe is the source and stages
        assert clone.stages == made.stages == twin.stages
        assert repr(twin) == text
    else:
        assert clone == made and twin == made
        assert hash(clone) == hash(made) == hash(twin)
        assert text.startswith(made.stages[0].name)


# -- cleanup ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("how", ["close", "del"])
@pytest.mark.parametrize("case", CASES)
def test_stopping_after_one_item_leaves_nothing_behind(case: Case, how: str, tmp_path, request) -> None:  # fmt: skip
    expect_leak(case, request)
    with nothing_left():
        it = iter(case.loader(str(tmp_path / "reads")))
        next(it)
        if how == "close":
            it.close()
        else:
            del it  # no gc.collect(): dropping the last reference must be enough


# -- bad arguments, when the stage is built -------------------------------------------------------
def gen(items: Iterable[Any]) -> Iterator[Any]:
    yield from items


#: (factory, call, the exception the conventions ask for, the parameter the message must name).
#: A wrong kind of value is a TypeError, a value out of range a ValueError (STYLE.md).
BAD = [
    ("shards", lambda: pf.shards(3), TypeError, "urls"),
    ("shards", lambda: pf.shards(["a.tar"], balance="x"), ValueError, "balance"),
    ("read_tar", lambda: pf.read_tar(decode=3), TypeError, "decode"),
    ("read_jsonl", lambda: pf.read_jsonl(retries=-1), ValueError, "retries"),
    ("read_parquet", lambda: pf.read_parquet(columns="a"), TypeError, "columns"),
    ("mix", lambda: pf.mix(3), TypeError, "loaders"),
    ("mix", lambda: pf.mix([pf.indices(2)], stop="x"), ValueError, "stop"),
    ("indices", lambda: pf.indices(-1), ValueError, "n_or_sized"),
    ("indices", lambda: pf.indices(1.5), TypeError, "n_or_sized"),
    ("from_iterable", lambda: pf.from_iterable(3), TypeError, "iterable"),
    ("from_sampler", lambda: pf.from_sampler(3), TypeError, "sampler"),
    ("from_sampler", lambda: pf.from_sampler(iter([1])), TypeError, "sampler"),
    ("from_sampler", lambda: pf.from_sampler([1], set_epoch=1), TypeError, "set_epoch"),
    ("shuffle", lambda: pf.shuffle(seed=-1), ValueError, "seed"),
    ("shuffle", lambda: pf.shuffle(seed=1.5), TypeError, "seed"),
    ("shuffle", lambda: pf.shuffle(buffer_size=0), ValueError, "buffer_size"),
    ("shuffle", lambda: pf.shuffle(buffer_size=True), TypeError, "buffer_size"),
    ("shuffle", lambda: pf.shuffle(generator="mt"), ValueError, "generator"),
    ("shuffle", lambda: pf.shuffle(generator="torch", buffer_size=4), ValueError, "buffer_size"),
    ("shuffle", lambda: pf.shuffle(seed=2**63, generator="torch"), ValueError, "seed"),
    ("batch", lambda: pf.batch(0), ValueError, "size"),
    ("cache", lambda: pf.cache(max_bytes=0), ValueError, "max_bytes"),
    ("cache", lambda: pf.cache(max_bytes=True), TypeError, "max_bytes"),
    ("cache", lambda: pf.cache(3), TypeError, "path"),
    ("batch", lambda: pf.batch(True), TypeError, "size"),
    ("batch", lambda: pf.batch(2.0), TypeError, "size"),
    ("batch", lambda: pf.batch(2, drop_last=1), TypeError, "drop_last"),
    ("batch", lambda: pf.batch(max_tokens=0, length=len), ValueError, "max_tokens"),
    ("batch", lambda: pf.batch(max_tokens=8, length=3), TypeError, "length"),
    ("batch", lambda: pf.batch(max_tokens=8, length=len, window=0), ValueError, "window"),
    ("batch", lambda: pf.batch(max_tokens=8, length=len, window=4, seed=-1), ValueError, "seed"),
    ("batch", lambda: pf.batch(max_tokens=8, length=len, drop_last=True), ValueError, "drop_last"),
    ("batch", lambda: pf.batch(4, window=3), ValueError, "window"),
    ("bucket", lambda: pf.bucket("x", length=len, batch_size=2, window=3), TypeError, "boundaries"),
    ("bucket", lambda: pf.bucket([3, 2], length=len, batch_size=2, window=3), ValueError, "boundaries"),
    ("bucket", lambda: pf.bucket([2], length=len, batch_size=0, window=3), ValueError, "batch_size"),
    ("bucket", lambda: pf.bucket([2], length=len, max_tokens=0, window=3), ValueError, "max_tokens"),
    ("bucket", lambda: pf.bucket([2], length=len, batch_size=2, window=0), ValueError, "window"),
    ("bucket", lambda: pf.bucket([2], length=3, batch_size=2, window=2), TypeError, "length"),
    ("bucket", lambda: pf.bucket([2], lengths=[1, -1], batch_size=2), ValueError, "lengths"),
    ("bucket", lambda: pf.bucket([2], lengths=[1], batch_size=2, seed=-1), ValueError, "seed"),
    ("bucket", lambda: pf.bucket([2], lengths=[1], batch_size=2, drop_last=1), TypeError, "drop_last"),
    ("pack", lambda: pf.pack(0), ValueError, "length"),
    ("pack", lambda: pf.pack(8.0), TypeError, "length"),
    ("pack", lambda: pf.pack(8, window=0), ValueError, "window"),
    ("pack", lambda: pf.pack(8, method="best_fit"), ValueError, "method"),
    ("pack", lambda: pf.pack(8, pad="0"), TypeError, "pad"),
    ("fetch", lambda: pf.fetch(3), TypeError, "dataset"),
    ("fetch", lambda: pf.fetch(DATA, batched=1), TypeError, "batched"),
    ("map", lambda: pf.map(3), TypeError, "fn"),
    ("filter", lambda: pf.filter("x"), TypeError, "predicate"),
    ("random_map", lambda: pf.random_map(3), TypeError, "fn"),
    ("random_map", lambda: pf.random_map(jitter, seed=-1), ValueError, "seed"),
    ("random_map", lambda: pf.random_map(jitter, seed="1"), TypeError, "seed"),
    ("random_map", lambda: pf.random_map(jitter, generator="mt"), ValueError, "generator"),
    ("collate", lambda: pf.collate(3), TypeError, "fn"),
    ("collate", lambda: pf.collate(pad="x"), TypeError, "pad"),
    ("collate", lambda: pf.collate(pad=0, pad_to_multiple_of=0), ValueError, "pad_to_multiple_of"),
    ("collate", lambda: pf.collate(mask=True), ValueError, "mask"),
    ("collate", lambda: pf.collate(list, pad=0), ValueError, "pad"),
    ("ignore_errors", lambda: pf.ignore_errors(exceptions=3), TypeError, "exceptions"),
    ("ignore_errors", lambda: pf.ignore_errors(max_count=-1), ValueError, "max_count"),
    ("ignore_errors", lambda: pf.ignore_errors(max_fraction=1.5), ValueError, "max_fraction"),
    ("shard", lambda: pf.shard(-1, 2), ValueError, "rank"),
    ("shard", lambda: pf.shard("0", 2), TypeError, "rank"),
    ("shard", lambda: pf.shard(0, 0), ValueError, "world_size"),
    ("shard", lambda: pf.shard(2, 2), ValueError, "rank"),
    ("shard", lambda: pf.shard(0, 2, drop_last=1), TypeError, "drop_last"),
    ("progress", lambda: pf.progress(desc=3), TypeError, "desc"),
    ("progress", lambda: pf.progress(unit=None), TypeError, "unit"),
    ("progress", lambda: pf.progress(total=-1), ValueError, "total"),
    ("progress", lambda: pf.progress(total=1.5), TypeError, "total"),
    ("progress", lambda: pf.progress(force=1), TypeError, "force"),
    ("pin_memory", lambda: pf.pin_memory(prefetch=0), ValueError, "prefetch"),
    pytest.param(
        "pin_memory", lambda: pf.pin_memory(prefetch=True), TypeError, "prefetch",
        id="pin_memory-prefetch-bool",
    ),
    pytest.param(
        "pin_memory", lambda: pf.pin_memory(prefetch="2"), TypeError, "prefetch",
        id="pin_memory-prefetch-str",
    ),
    ("to_device", lambda: pf.to_device("nope"), ValueError, "device"),
    ("to_device", lambda: pf.to_device("cpu", non_blocking=1), TypeError, "non_blocking"),
    ("parallel_map", lambda: pf.parallel_map(3, workers=1), TypeError, "fn"),
    ("parallel_map", lambda: pf.parallel_map(pf.filter(bool), workers=1), ValueError, "fn"),
    pytest.param(
        "parallel_map", lambda: pf.parallel_map(pf.batch(2), workers=1), ValueError, "fn",
        id="parallel_map-fn-batch",
    ),
    ("parallel_map", lambda: pf.parallel_map(square, workers=-1), ValueError, "workers"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=True), TypeError, "workers"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, backend="gpu"), ValueError, "backend"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, ordered=1), TypeError, "ordered"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, max_in_flight=0), ValueError, "max_in_flight"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, max_in_flight=1.5), TypeError, "max_in_flight"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, mp_context="fork"), ValueError, "mp_context"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, backend="process", mp_context="nope"), ValueError, "mp_context"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, backend="process", mp_context=3), TypeError, "mp_context"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, worker_init=3), TypeError, "worker_init"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, timeout=0), ValueError, "timeout"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, timeout="1"), TypeError, "timeout"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, persistent=1), TypeError, "persistent"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, seed=-1), ValueError, "seed"),
    ("parallel_map", lambda: pf.parallel_map(square, workers=1, round_robin=1), TypeError, "round_robin"),
    ("parallel_source", lambda: pf.parallel_source([1, 2], workers=1), TypeError, "loader"),
    ("parallel_source", lambda: pf.parallel_source(pf.indices(3), workers=-1), ValueError, "workers"),
    ("parallel_source", lambda: pf.parallel_source(pf.indices(3), workers=1, backend="gpu"), ValueError, "backend"),
    ("parallel_source", lambda: pf.parallel_source(pf.indices(3), workers=1, ordered=1), TypeError, "ordered"),
    ("parallel_source", lambda: pf.parallel_source(pf.indices(3), workers=1, timeout=-1), ValueError, "timeout"),
    ("parallel_source", lambda: pf.parallel_source(pf.indices(3), workers=1, seed=1.5), TypeError, "seed"),
    ("stage", lambda: add(amout=2), TypeError, "amout"),
    ("stage", lambda: pairwise(), TypeError, "size"),
    ("stage", lambda: pairwise(2, epoch=1), TypeError, "epoch"),
    ("stage", lambda: pf.stage(length=3)(gen), TypeError, "length"),
    ("stage", lambda: pf.stage(gen, positional=True), ValueError, "positional"),
    pytest.param(
        "stage", lambda: pf.stage(gen, name=3), TypeError, "name",
        id="stage-name-int",
    ),
    pytest.param(
        "stage", lambda: pf.stage(gen, length="same", positional="yes"), TypeError, "positional",
        id="stage-positional-str",
    ),
]  # fmt: skip

#: The name a message starts with: the factory's, or the decorated function's for ``@stage``.
SHOWN = {"stage": r"(@stage|stage '(add|pairwise|gen)')"}


@pytest.mark.parametrize(("factory", "call", "exc", "param"), BAD)
def test_bad_arguments_raise_when_built_naming_stage_and_parameter(
    factory: str, call: Callable[[], Any], exc: type[Exception], param: str
) -> None:
    with pytest.raises((TypeError, ValueError)) as info:
        call()
    message = str(info.value)
    assert type(info.value) is exc, f"{type(info.value).__name__}: {message}"
    assert re.search(SHOWN.get(factory, re.escape(factory)), message), message
    assert re.search(rf"\b{param}\b", message), message


# -- integers: anything with __index__, as pipeflow._checks says ----------------------------------
_NUMPY_INT = "rejects np.int64 (an isinstance(x, int) check of its own instead of pipeflow._checks.integer, which takes anything with __index__ as parallel_map, indices and seeds do)"
INTEGER_PARAMETERS = [
    pytest.param(lambda: pf.indices(np.int64(3)), id="indices-n"),
    pytest.param(lambda: pf.parallel_map(square, workers=np.int64(2)), id="parallel_map-workers"),
    pytest.param(lambda: pf.shuffle(seed=np.uint64(3)), id="shuffle-seed"),
    pytest.param(lambda: pf.batch(np.int64(3)), id="batch-size"),
    pytest.param(lambda: pf.shuffle(buffer_size=np.int64(3)), id="shuffle-buffer_size"),
    pytest.param(lambda: pf.shard(np.int64(0), np.int64(2)), id="shard-rank"),
    pytest.param(lambda: pf.progress(total=np.int64(3)), id="progress-total"),
    pytest.param(lambda: pf.pin_memory(prefetch=np.int64(2)), id="pin_memory-prefetch"),
    pytest.param(lambda: pf.batch(max_tokens=np.int64(8), length=len), id="batch-max_tokens"),
    pytest.param(lambda: pf.bucket([np.int64(2)], lengths=[1], batch_size=np.int64(2)), id="bucket-batch_size"),
    pytest.param(lambda: pf.pack(np.int64(8), window=np.int64(2)), id="pack-length"),
]  # fmt: skip


@pytest.mark.parametrize("build", INTEGER_PARAMETERS)
def test_integer_parameters_take_numpy_integers(build: Callable[[], Any]) -> None:
    made = build()
    assert "np.int" not in repr(made)  # stored as a plain int
