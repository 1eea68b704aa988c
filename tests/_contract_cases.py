"""Pipelines for the resume contract (tests/test_resume_contract.py), and the means to run a
pass bounded in time and compare its items by value.

Each pipeline is built from ``(seed, size, variant)``: *seed* feeds its shuffles, *size* how
many items an epoch reads, and *variant* 1 is the same shape over other data (another
dataset, another shard list), whose records the contract swaps in. Everything here is at
module level, so it pickles for process workers.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import tempfile
import threading
import time
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

import pipeflow as pf
from tests._resume_cases import OwnRng
from tests._sequences import Corpus
from tests._shards import write_shards

__all__ = ["PIPELINES", "Bounded", "Pipeline", "bounded", "plain"]


# -- data ----------------------------------------------------------------------------------------
class Numbers:
    """A map-style dataset: item ``i`` is ``base + i`` (*variant* moves the base)."""

    def __init__(self, n: int, variant: int) -> None:
        self.n, self.base = n, 1000 * (variant + 1)

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return self.base + i


class Counting:
    """A stateful source: each ``iter()`` counts from *first* to ``first + n`` with an
    iterator that saves where it is (as the one-shot iterators users resume do, but
    re-iterable, for the next epoch)."""

    def __init__(self, n: int, first: int = 0) -> None:
        self.n, self.first = n, first

    def __iter__(self) -> CountingIterator:
        return CountingIterator(self.n, self.first)

    def __len__(self) -> int:
        return self.n


class SplitStream:
    """A stateful stream split by pipeflow's worker info that keeps where it stands on
    itself (each thread worker reads its own copy, as each process does)."""

    def __init__(self, n: int, first: int = 0) -> None:
        self.n, self.first, self.done, self.skip = n, first, 0, 0

    def __iter__(self) -> Iterator[int]:
        info = pf.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        mine = range(self.first + start, self.first + self.n, step)
        self.done, self.skip = self.skip, 0
        for i in mine[self.done :]:
            self.done += 1
            yield i
        self.done = 0

    def state_dict(self) -> dict[str, int]:
        """Where this copy stands (the user's state)."""
        return {"done": self.done}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Go on from there at the next ``iter()``."""
        self.skip = state["done"]


@pf.stage()
def pairs(items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
    """A stage of the user's own (replayed when a pass resumes): items two by two."""
    held = []
    for item in items:
        held.append(item)
        if len(held) == 2:
            yield tuple(held)
            held = []


def key_or_item(item: Any) -> Any:
    """A sample's key (a dict read from a shard), else the item."""
    return item["__key__"] if isinstance(item, dict) else item


def kept_key(sample: dict[str, Any]) -> bool:
    """A filter's predicate over samples: about two thirds of them."""
    return sum(map(ord, sample["__key__"])) % 3 != 0


class CountingIterator:
    """One pass of :class:`Counting`, with its state."""

    def __init__(self, n: int, first: int) -> None:
        self.n, self.first, self.i = n, first, 0

    def __iter__(self) -> CountingIterator:
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.first + self.i - 1

    def state_dict(self) -> dict[str, int]:
        """The count so far (the user's state: the contract never tampers with it)."""
        return {"i": self.i}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Go on from a saved count."""
        self.i = state["i"]


def ident(x: int) -> int:
    """The identity, as a named function (a process worker pickles it)."""
    return x


def tagged(batch: list[int]) -> tuple[int, ...]:
    """A batch, sorted, as a tuple (work for a parallel map)."""
    return tuple(sorted(batch))


def sequence_sum(batch: list[Any]) -> list[int]:
    """Each sequence of a batch, summed (work for a parallel map after a sequence stage)."""
    return [int(np.asarray(s).sum()) for s in batch]


def packed_sum(row: dict[str, Any]) -> int:
    """A packed row's tokens, summed."""
    return int(np.asarray(row["tokens"]).sum())


class Jittered:
    """*fn*, taking 0, 4 or 8 ms by its input, so that an unordered ``parallel_map``
    delivers out of order (its state then records the extras)."""

    def __init__(self, fn: Callable[[Any], Any]) -> None:
        self.fn = fn

    def __call__(self, x: Any) -> Any:
        out = self.fn(x)
        time.sleep(0.004 * (zlib.crc32(repr(out).encode()) % 3))
        return out

    def __repr__(self) -> str:
        return f"Jittered({self.fn.__name__})"


def fails(i: int) -> int:
    """Fails on every item ``i % 5 == 2``."""
    if i % 5 == 2:
        raise OSError(i)
    return i


def draw(i: int, rng: Any) -> tuple[int, int]:
    """An item and a draw from its own generator (``random_map``)."""
    return i, int(rng.integers(1000))


def odd_or_three(i: int) -> bool:
    """A filter's predicate: keeps about half the items."""
    return i % 2 == 1 or i % 3 == 0


_FOLDER = tempfile.mkdtemp(prefix="pipeflow-contract-")
atexit.register(shutil.rmtree, _FOLDER, True)


@functools.cache
def shard_set(sizes: tuple[int, ...], kind: str, variant: int) -> list[str]:
    """Shards of *sizes* samples of *kind* written once into a folder of their own."""
    folder = os.path.join(_FOLDER, f"{kind}-{variant}-{'_'.join(map(str, sizes))}")
    os.makedirs(folder)
    return write_shards(folder, sizes, kind)


def _sizes(size: int, variant: int) -> tuple[int, ...]:
    """Shard sizes adding up to *size* (3 or 4 shards; *variant* 1 splits it otherwise)."""
    if variant:
        return (size // 4 + 1, size // 2, size - size // 4 - 1 - size // 2)
    return (size // 3, size // 4, size // 6 + 1, size - size // 3 - size // 4 - size // 6 - 1)


def _corpus(size: int, variant: int) -> Corpus:
    return Corpus([(i * 7 + 3 * variant) % 13 + 1 for i in range(size)])


def _tars(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    return pf.shards(shard_set(_sizes(size, variant), "tar", variant), seed=seed) | pf.read_tar()


# -- the pipelines -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Pipeline:
    """One pipeline of the contract.

    Attributes:
        name: Its name in test ids and reports.
        build: ``(seed, size, variant) -> Loader``; variant 1 is the same shape over other data.
        sizes: The sizes (items an epoch reads) that the contract may choose.
        ordered: Whether its output order is deterministic (``False``: compared as multisets).
        slow: Whether a pass starts processes (the contract then tries fewer cases).
    """

    name: str
    build: Callable[[int, int, int], pf.Loader[Any]]
    sizes: tuple[int, ...] = (12, 17, 24)
    ordered: bool = True
    slow: bool = False


def _map_style(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    data = Numbers(size, variant)
    out: pf.Loader[Any] = (
        pf.indices(size) | pf.shuffle(seed=seed) | pf.batch(3) | pf.fetch(data) | pf.collate()
    )
    return out


def _parallel(
    ordered: bool, backend: str = "thread", workers: int | str = 2
) -> Callable[[int, int, int], pf.Loader[Any]]:
    def build(seed: int, size: int, variant: int) -> pf.Loader[Any]:
        work = pf.fetch(Numbers(size, variant)) | pf.map(Jittered(tagged))
        stage = pf.parallel_map(work, workers=workers, backend=backend, ordered=ordered)
        out: pf.Loader[Any] = pf.indices(size) | pf.shuffle(seed=seed) | pf.batch(3) | stage
        return out

    return build


def _filter(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    data = Numbers(size, variant)
    out: pf.Loader[Any] = (
        pf.indices(size)
        | pf.shuffle(seed=seed)
        | pf.fetch(data)
        | pf.filter(odd_or_three)
        | pf.batch(2)
    )
    return out


def _ignore_errors(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    out: pf.Loader[Any] = (
        pf.indices(size)
        | pf.shuffle(seed=seed)
        | pf.fetch(Numbers(size, variant))
        | pf.map(fails)
        | pf.ignore_errors()
    )
    return out


def _buffer_shuffle(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    return (
        pf.from_iterable(range(1000 * variant, 1000 * variant + size))
        | pf.map(ident)
        | pf.shuffle(seed=seed, buffer_size=4)
        | pf.batch(2)
    )


def _sequences(stage: Callable[[int], Any], unordered: Callable[[], Any] | None = None) -> Any:
    def build(seed: int, size: int, variant: int) -> pf.Loader[Any]:
        corpus = _corpus(size, variant)
        loader = (
            pf.indices(corpus)
            | pf.shuffle(seed=seed)
            | pf.fetch(corpus, batched=False)
            | stage(seed)
        )
        out: pf.Loader[Any] = loader if unordered is None else loader | unordered()
        return out

    return build


def _pack(seed: int) -> Any:
    return pf.pack(16, window=3)


def _bucket(seed: int) -> Any:
    return pf.bucket([4, 12], length=len, batch_size=3, window=9, seed=seed + 1)


def _max_tokens(seed: int) -> Any:
    return pf.batch(max_tokens=32, length=len, window=6, seed=seed + 2)


def _unordered(fn: Callable[[Any], Any]) -> Callable[[], Any]:
    return lambda: pf.parallel_map(Jittered(fn), workers=2, backend="thread", ordered=False)


def _buffer_unordered(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    stage = pf.parallel_map(Jittered(tagged), workers=2, backend="thread", ordered=False)
    out: pf.Loader[Any] = _buffer_shuffle(seed, size, variant) | stage
    return out


def _read_tar(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    return _tars(seed, size, variant) | pf.batch(2)


def _read_jsonl(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    paths = shard_set(_sizes(size, variant), "jsonl", variant)
    return pf.shards(paths, seed=seed) | pf.read_jsonl() | pf.shuffle(seed=seed, buffer_size=3)


def _parallel_source(
    backend: str, workers: int | str = 2
) -> Callable[[int, int, int], pf.Loader[Any]]:
    def build(seed: int, size: int, variant: int) -> pf.Loader[Any]:
        inner = _tars(seed, size, variant)
        return pf.parallel_source(inner, workers=workers, backend=backend, seed=seed + 3)

    return build


def _mix(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    counting = pf.from_iterable(Counting(size // 2, 1000 * (variant + 1)))
    return pf.mix([_tars(seed, size, variant), counting], weights=[2, 1], seed=seed + 4)


def _mix_then_shuffle(stop: str) -> Callable[[int, int, int], pf.Loader[Any]]:
    def build(seed: int, size: int, variant: int) -> pf.Loader[Any]:
        counting = pf.from_iterable(Counting(size // 2, 1000 * (variant + 1)))
        mixed = pf.mix([_tars(seed, size, variant), counting], weights=[2, 1], seed=seed, stop=stop)
        return mixed | pf.shuffle(seed=seed + 5, buffer_size=3) | pf.batch(2)

    return build


def _unbatch_filter_own(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    return (
        _tars(seed, size, variant)
        | pf.batch(3)
        | pf.unbatch()
        | pf.filter(kept_key)
        | pf.map(key_or_item)
        | pairs()
    )


def _random_map_shard(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    out: pf.Loader[Any] = (
        pf.indices(size)
        | pf.shuffle(seed=seed)
        | pf.shard(variant, 2)
        | pf.random_map(draw, seed=seed)
        | pf.batch(2)
        | pf.collate()
    )
    return out


def _split_stream_thread(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    stream = pf.from_iterable(SplitStream(size, 1000 * variant))
    return pf.parallel_source(stream, workers=2, backend="thread", seed=seed) | pf.batch(2)


def _stateful_source(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    return pf.from_iterable(Counting(size, 1000 * variant)) | pf.batch(3)


def _stateful_dataset(seed: int, size: int, variant: int) -> pf.Loader[Any]:
    data = OwnRng(size + variant)
    out: pf.Loader[Any] = pf.indices(size + variant) | pf.shuffle(seed=seed) | pf.fetch(data)
    return out


def _cache_main(warm: bool) -> Callable[[int, int, int], pf.Loader[Any]]:
    """A cache in the main process after an ordered parallel map, a random stage after it;
    *warm*: the loader ran its first epoch already (its passes are cached ones)."""

    def build(seed: int, size: int, variant: int) -> pf.Loader[Any]:
        work = pf.fetch(Numbers(size, variant)) | pf.map(Jittered(ident))
        out: pf.Loader[Any] = (
            pf.indices(size)
            | pf.shuffle(seed=seed)
            | pf.parallel_map(work, workers=2)
            | pf.cache()
            | pf.random_map(draw, seed=seed)
            | pf.batch(3)
        )
        return _warmed(out) if warm else out

    return build


def _cache_workers(warm: bool, backend: str = "thread") -> Callable[[int, int, int], Any]:
    """A cache inside a parallel map's workers, over batches of indices."""

    def build(seed: int, size: int, variant: int) -> pf.Loader[Any]:
        work = pf.fetch(Numbers(size, variant)) | pf.cache() | pf.map(Jittered(tagged))
        stage = pf.parallel_map(work, workers=2, backend=backend)
        out: pf.Loader[Any] = pf.indices(size) | pf.shuffle(seed=seed) | pf.batch(3) | stage
        return _warmed(out) if warm else out

    return build


def _warmed(loader: pf.Loader[Any]) -> pf.Loader[Any]:
    """*loader* after one whole pass (its next pass is epoch 1)."""
    for _ in loader:
        pass
    return loader


#: Every pipeline of the contract, by name.
PIPELINES: dict[str, Pipeline] = {
    p.name: p
    for p in [
        Pipeline("map_style", _map_style),
        Pipeline("parallel_map_thread", _parallel(ordered=True)),
        Pipeline("parallel_map_thread_unordered", _parallel(ordered=False), ordered=False),
        Pipeline("parallel_map_process", _parallel(True, "process"), sizes=(10,), slow=True),
        Pipeline("parallel_map_auto_thread", _parallel(True, workers="auto")),
        Pipeline(
            "parallel_map_auto_thread_unordered",
            _parallel(False, workers="auto"),
            ordered=False,
        ),
        Pipeline(
            "parallel_map_auto_process",
            _parallel(True, "process", "auto"),
            sizes=(10,),
            slow=True,
        ),
        Pipeline("parallel_source_auto_thread", _parallel_source("thread", "auto")),
        Pipeline("filter", _filter),
        Pipeline("ignore_errors", _ignore_errors),
        Pipeline("buffer_shuffle", _buffer_shuffle),
        Pipeline("pack", _sequences(_pack)),
        Pipeline("bucket", _sequences(_bucket)),
        Pipeline("batch_max_tokens", _sequences(_max_tokens)),
        Pipeline("buffer_shuffle_unordered", _buffer_unordered, ordered=False),
        Pipeline("pack_unordered", _sequences(_pack, _unordered(packed_sum)), ordered=False),
        Pipeline(
            "batch_max_tokens_unordered",
            _sequences(_max_tokens, _unordered(sequence_sum)),
            ordered=False,
        ),
        Pipeline("read_tar", _read_tar),
        Pipeline("read_jsonl", _read_jsonl),
        Pipeline("parallel_source_thread", _parallel_source("thread")),
        Pipeline("parallel_source_process", _parallel_source("process"), sizes=(10,), slow=True),
        Pipeline("mix", _mix),
        Pipeline("mix_first_buffer_shuffle", _mix_then_shuffle("first")),
        Pipeline("mix_cycle_buffer_shuffle", _mix_then_shuffle("cycle")),
        Pipeline("unbatch_filter_own_stage", _unbatch_filter_own),
        Pipeline("random_map_shard_collate", _random_map_shard),
        Pipeline("split_stream_thread", _split_stream_thread),
        Pipeline("stateful_source", _stateful_source),
        Pipeline("stateful_dataset", _stateful_dataset),
        Pipeline("cache_main", _cache_main(warm=False)),
        Pipeline("cache_main_warm", _cache_main(warm=True)),
        Pipeline("cache_workers_thread", _cache_workers(warm=False)),
        Pipeline("cache_workers_thread_warm", _cache_workers(warm=True)),
        Pipeline(
            "cache_workers_process_warm",
            _cache_workers(True, "process"),
            sizes=(10,),
            slow=True,
        ),
    ]
}


# -- comparing and bounding ----------------------------------------------------------------------
def plain(x: Any) -> Any:
    """*x* as plain, comparable Python: arrays and tensors as lists, tuples as lists, dicts
    with their keys sorted.

    Args:
        x: An item a loader yielded.

    Returns:
        The same value made of lists, dicts, strings and numbers.
    """
    if hasattr(x, "tolist"):
        return x.tolist()
    if isinstance(x, dict):
        return {str(k): plain(v) for k, v in sorted(x.items(), key=lambda kv: str(kv[0]))}
    if isinstance(x, (list, tuple)):
        return [plain(v) for v in x]
    return x


@dataclass
class Bounded:
    """What a call run under a time limit did.

    Attributes:
        value: Its result, when it returned.
        error: What it raised, if it did.
        hung: Whether it was still running at the limit.
    """

    value: Any = None
    error: BaseException | None = None
    hung: bool = False


def bounded(fn: Callable[[], Any], timeout: float) -> Bounded:
    """Call *fn* in a daemon thread and wait at most *timeout* seconds for it.

    Args:
        fn: What to call.
        timeout: How long to wait, in seconds.

    Returns:
        Its value, its exception, or that it hung (the thread is then left behind).
    """
    out = Bounded(hung=True)

    def target() -> None:
        try:
            out.value = fn()
        except BaseException as e:  # reported, not raised: the caller judges it
            out.error = e
        out.hung = False

    thread = threading.Thread(target=target, daemon=True, name="contract-pass")
    thread.start()
    thread.join(timeout)
    return out


def items(loader: Iterable[Any]) -> list[Any]:
    """One pass of *loader*, each item made plain."""
    return [plain(x) for x in loader]
