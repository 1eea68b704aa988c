"""``pf.DataLoader`` against ``torch.utils.data.DataLoader`` itself, where issue 14 found them apart.

Each test runs the same code on both classes and compares what a user sees: the batches (types,
dtypes, values), the errors (type and torch's words) and the warnings. Worker tests run with
fork; the spawn variants are marked ``slow``.
"""

from __future__ import annotations

import gc
import multiprocessing
import os
import re
import time
import warnings
import weakref
from typing import Any

import numpy as np
import pytest
import torch
import torch.utils.data as tud
from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests.test_dataloader import assert_same

SPAWN = pytest.param("spawn", marks=[pytest.mark.slow, pytest.mark.timeout(300)])
CONTEXTS = ["fork", SPAWN]


@pytest.fixture(autouse=True)
def _torch_iterators_shut_down(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Shut torch's worker iterators down as each test ends. One left to the garbage collector
    (a failed pass's, which its exception's traceback keeps in a cycle) joins each of its
    workers for 5 s (its queues are finalized first, so the workers never hear "stop"): 10 s
    a test, somewhere later in the run. Explicitly, it takes milliseconds."""
    made: list[weakref.ref[Any]] = []
    original = tud.DataLoader._get_iterator

    def tracked(self: Any) -> Any:
        it = original(self)
        made.append(weakref.ref(it))
        return it

    monkeypatch.setattr(tud.DataLoader, "_get_iterator", tracked)
    yield
    for ref in made:
        it = ref()
        if it is not None and hasattr(it, "_shutdown_workers"):
            it._shutdown_workers()


def run_both(dataset: Any, epochs: int = 1, **kwargs: Any) -> tuple[list[Any], list[Any]]:
    """Every batch of *epochs* epochs from pipeflow's class and from torch's, same settings."""
    out = []
    for cls in (pf.DataLoader, tud.DataLoader):
        dl = cls(dataset, generator=torch.Generator().manual_seed(7), **kwargs)
        out.append([b for _ in range(epochs) for b in dl])
        del dl
    return out[0], out[1]


# -- point 2: len(dataset) is never called on an IterableDataset while iterating ---------------
class NoLenStream(tud.IterableDataset):
    """A stream whose ``__len__`` raises, as a stream with an unknown length may; sharded."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))

    def __len__(self) -> int:
        raise TypeError("this stream has no length")


@pytest.mark.parametrize("context", [None, *CONTEXTS])
def test_iterable_dataset_len_never_called(context: str | None) -> None:
    workers = {} if context is None else {"num_workers": 2, "multiprocessing_context": context}
    ours, ref = run_both(NoLenStream(9), batch_size=2, **workers)
    assert_same(ours, ref)


# -- point 7: argument types torch accepts --------------------------------------------------
@pytest.mark.parametrize(
    "kwargs",
    [
        {"num_workers": np.int64(2)},
        {"num_workers": 2, "prefetch_factor": np.int64(3)},
        {"num_workers": 2, "persistent_workers": 1},
        {"num_workers": 1, "in_order": 0},
        {"num_workers": np.int32(2), "timeout": np.float64(30.0)},
    ],
    ids=repr,
)
def test_argument_types_torch_accepts(kwargs: dict[str, Any]) -> None:
    ours, ref = run_both(torch.arange(10.0), epochs=2, batch_size=3, shuffle=True, **kwargs)
    assert_same(ours, ref)


def test_argument_types_torch_accepts_iterable() -> None:
    stream = NoLenStream(9)
    ours, ref = run_both(stream, batch_size=4, drop_last=True, num_workers=np.int64(1))
    assert_same(ours, ref)


# -- point 8: two live iterators draw the sampler's order at iter(), as torch's do -------------
@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("seeded", [True, False], ids=["generator", "global"])
def test_two_live_iterators(context: str, seeded: bool) -> None:
    got = []
    for cls in (pf.DataLoader, tud.DataLoader):
        gen = torch.Generator().manual_seed(11) if seeded else None
        torch.manual_seed(11)
        dl = cls(
            torch.arange(12),
            batch_size=4,
            shuffle=True,
            num_workers=2,
            multiprocessing_context=context,
            generator=gen,
        )
        got.append(list(zip(dl, dl)))
        del dl
    assert_same(got[0], got[1])


def test_two_live_iterators_without_workers() -> None:
    got = []
    for cls in (pf.DataLoader, tud.DataLoader):
        dl = cls(torch.arange(12), batch_size=4, shuffle=True,
                 generator=torch.Generator().manual_seed(5))  # fmt: skip
        got.append(list(zip(dl, dl)))
    assert_same(got[0], got[1])


# -- point 5: an OSError in worker_init_fn reaches the user with its type and traceback ----------
def open_missing_database(worker_id: int) -> None:
    raise FileNotFoundError(2, "No such file or directory", f"/nonexistent/db-{worker_id}.sqlite")


@pytest.mark.parametrize("context", CONTEXTS)
def test_worker_init_oserror(context: str) -> None:
    errors = []
    for cls in (pf.DataLoader, tud.DataLoader):
        dl = cls(torch.arange(6), batch_size=2, num_workers=2, multiprocessing_context=context,
                 worker_init_fn=open_missing_database)  # fmt: skip
        with pytest.raises(FileNotFoundError) as info:
            next(iter(dl))
        errors.append(info.value)
        del dl
    ours, ref = errors
    assert type(ours) is type(ref) is FileNotFoundError
    assert re.search(r"/nonexistent/db-\d\.sqlite", str(ref))
    assert re.search(r"/nonexistent/db-\d\.sqlite", str(ours))
    # the worker-side traceback comes along, naming the user's function
    assert "open_missing_database" in str(ours.__cause__)


# -- point 4: persistent workers restart the round-robin at worker 0 each epoch ------------------
class WhoAndDraw(tud.Dataset):
    """Which worker served each sample, and a draw from the worker's seeded generator."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, i: int) -> tuple[int, int, torch.Tensor]:
        info = tud.get_worker_info()
        return i, -1 if info is None else info.id, torch.rand(1)


@pytest.mark.parametrize("context", CONTEXTS)
def test_persistent_workers_round_robin_each_epoch(context: str) -> None:
    # 10 samples in batches of 2: 5 batches, not a multiple of 2 workers
    ours, ref = run_both(WhoAndDraw(), epochs=3, batch_size=2, num_workers=2,
                         persistent_workers=True, multiprocessing_context=context)  # fmt: skip
    assert len(ours) == 15
    assert_same(ours, ref)


# -- point 10: torch's words in the messages -----------------------------------------------------
class Sleepy(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 0:
            import time

            time.sleep(3)
        return i


@pytest.mark.parametrize("context", CONTEXTS)
def test_timeout_message(context: str) -> None:
    for cls in (tud.DataLoader, pf.DataLoader):
        dl = cls(Sleepy(), batch_size=2, num_workers=1, timeout=1, multiprocessing_context=context)
        with pytest.raises(RuntimeError, match=r"DataLoader timed out after 1 seconds") as info:
            next(iter(dl))
        del dl
    assert "timeout=1" in str(info.value)  # pipeflow's detail is kept


class KillSelf(tud.Dataset):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> int:
        if i == 2:
            import os
            import signal

            os.kill(os.getpid(), signal.SIGKILL)
        return i


class ExitSelf(KillSelf):
    def __getitem__(self, i: int) -> int:
        if i == 2:
            import os

            os._exit(3)
        return i


@pytest.mark.parametrize("context", CONTEXTS)
def test_killed_worker_message(context: str) -> None:
    dl = pf.DataLoader(KillSelf(), batch_size=2, num_workers=1, multiprocessing_context=context)
    with pytest.raises(RuntimeError) as info:
        list(dl)
    # the phrase torch's test_segfault asserts, then pipeflow's detail
    assert re.search(
        r"DataLoader worker \(pid \d+\) is killed by signal: Killed\.", str(info.value)
    )
    assert "while holding" in str(info.value)
    assert info.value.exitcode == -9


@pytest.mark.parametrize("context", CONTEXTS)
def test_exited_worker_message(context: str) -> None:
    dl = pf.DataLoader(ExitSelf(), batch_size=2, num_workers=1, multiprocessing_context=context)
    with pytest.raises(RuntimeError) as info:
        list(dl)
    assert re.search(r"DataLoader worker \(pid\(s\) \d+\) exited unexpectedly", str(info.value))
    assert "exited with code 3" in str(info.value)


class LongerThanSaid(tud.IterableDataset):
    def __iter__(self):
        return iter(range(6))

    def __len__(self) -> int:
        return 4

    def __repr__(self) -> str:
        return "LongerThanSaid()"


@pytest.mark.parametrize("workers", [0, 1])
def test_length_exceeded_warning(workers: int) -> None:
    messages = []
    for cls in (pf.DataLoader, tud.DataLoader):
        dl = cls(LongerThanSaid(), batch_size=None, num_workers=workers)
        assert len(dl) == 4
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            list(dl)
        messages.append([str(w.message) for w in caught if "Length of" in str(w.message)])
        del dl
    assert messages[0] == messages[1]
    assert len(messages[0]) == 2
    assert ("For multiprocessing data-loading" in messages[0][0]) == (workers > 0)


# -- point 3: nested tensors come back from process workers -------------------------------------
def clone_collate(batch: list[torch.Tensor]) -> list[torch.Tensor]:
    return [x.clone() for x in batch]


@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors:UserWarning")
@pytest.mark.parametrize("context", CONTEXTS)
def test_nested_tensors_from_workers(context: str) -> None:
    gen = torch.Generator().manual_seed(0)
    dataset = [torch.nested.nested_tensor([torch.randn(5, generator=gen)]) for _ in range(6)]
    got = []
    for cls in (pf.DataLoader, tud.DataLoader):
        dl = cls(dataset, batch_size=1, num_workers=2, collate_fn=clone_collate,
                 multiprocessing_context=context)  # fmt: skip
        got.append([b[0].unbind() for b in dl])
        # the default collate refuses them, in torch's words
        dl = cls(dataset, batch_size=1, num_workers=2, multiprocessing_context=context)
        with pytest.raises(RuntimeError, match="not currently supported by the default collate_fn"):
            next(iter(dl))
        del dl
    assert_same(got[0], got[1])


# -- point 6: collate inside workers, with torch's dtype rules -------------------------------------
class MixedDtypes(tud.Dataset):
    """Sample 1 differs from the others: another dtype, or a tensor that requires grad."""

    def __init__(self, odd: str) -> None:
        self.odd = odd

    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> dict[str, Any]:
        x = torch.full((2,), float(i))
        if i == 1 and self.odd == "float64":
            x = x.double()
        elif i == 1 and self.odd == "requires_grad":
            x = x.requires_grad_()
        elif i == 0 and self.odd == "int32_first":
            x = x.int()
        return {"x": x, "y": np.float32(i) if self.odd != "numpy" or i != 1 else np.float64(i)}


WORKERS = [(0, None), (2, "fork"), pytest.param(2, "spawn", marks=SPAWN.marks, id="2-spawn")]


@pytest.mark.parametrize(("workers", "context"), WORKERS)
@pytest.mark.parametrize("odd", ["float64", "numpy", "requires_grad", "int32_first"])
def test_collate_dtypes_as_torch(odd: str, workers: int, context: str | None) -> None:
    outcomes = []
    for cls in (pf.DataLoader, tud.DataLoader):
        dl = cls(
            MixedDtypes(odd), batch_size=4, num_workers=workers, multiprocessing_context=context
        )
        try:
            outcomes.append([{k: v.detach() for k, v in b.items()} for b in dl])
        except (RuntimeError, TypeError) as e:  # torch's own words and type
            outcomes.append(type(e))
        del dl
    ours, ref = outcomes
    if isinstance(ref, type):
        assert ours is ref
    else:
        assert_same(ours, ref)


# -- point 9 (part): an IterableDataset that is its own iterator and starts over in __iter__ ------
class Resettable(tud.IterableDataset):
    def __init__(self, n: int) -> None:
        self.n = n
        self.i = 0

    def __iter__(self) -> Resettable:
        self.i = 0
        return self

    def __next__(self) -> int:
        if self.i >= self.n:
            raise StopIteration
        self.i += 1
        return self.i - 1


@pytest.mark.parametrize(("workers", "context"), WORKERS)
def test_resettable_iterator_dataset(workers: int, context: str | None) -> None:
    ours, ref = run_both(
        Resettable(5), epochs=2, batch_size=2, num_workers=workers, multiprocessing_context=context
    )
    assert_same(ours, ref)


# -- a failed batch leaves no worker behind, without waiting for the garbage collector -----------
def _first_error(loader: Any) -> type[BaseException] | None:
    try:
        # a comprehension's frame holds its iterator (the pass) as a local: the exception's
        # traceback keeps that frame
        [len(b) for b in loader]
    except (RuntimeError, TypeError) as e:  # dropped here, as a training loop's handler would
        return type(e)
    return None


@pytest.mark.parametrize("context", CONTEXTS)
def test_failed_batch_leaves_no_worker(context: str) -> None:
    errors = []
    gc.disable()  # a reference cycle would keep the pass (and its workers) until a collection
    try:
        # torch's first: its iterator keeps its workers until a collection (a cycle of its
        # own), so only the processes started after this snapshot are pipeflow's
        for cls in (tud.DataLoader, pf.DataLoader):
            before = set(multiprocessing.active_children())
            dl = cls(MixedDtypes("requires_grad"), batch_size=2, num_workers=2,
                     multiprocessing_context=context)  # fmt: skip
            errors.append(_first_error(dl))
            del dl
        deadline = time.monotonic() + 2.0  # RELIABILITY.md: reaped within 2 seconds
        while (left := set(multiprocessing.active_children()) - before) and (
            time.monotonic() < deadline
        ):
            time.sleep(0.05)
    finally:
        gc.enable()
    assert errors[0] is errors[1] is RuntimeError  # torch's error, and ours
    assert not left, f"pipeflow's workers alive after the failed loop: {left}"


# -- point 9: DataPipes are sharded per worker and shuffled from one seed per epoch --------------
def shuffled_pipe(n: int) -> tud.IterDataPipe:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(n)).shuffle(buffer_size=5).sharding_filter()


def seeded_epochs(cls: type, dataset: Any, seeds: list[int], **kwargs: Any) -> list[Any]:
    """An epoch after each ``torch.manual_seed(s)``, from one loader."""
    dl = cls(dataset, **kwargs)
    out = []
    for s in seeds:
        torch.manual_seed(s)
        out.append(list(dl))
    del dl
    return out


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize(
    ("workers", "persistent"), [(0, False), (1, False), (2, False), (2, True)], ids=str
)
def test_datapipe_sharded_and_seeded(context: str, workers: int, persistent: bool) -> None:
    kwargs: dict[str, Any] = {"num_workers": workers, "shuffle": True, "batch_size": 3}
    if workers:
        kwargs.update(persistent_workers=persistent, multiprocessing_context=context)
    seeds = [123, 123, 321]
    ours = seeded_epochs(pf.DataLoader, shuffled_pipe(20), seeds, **kwargs)
    ref = seeded_epochs(tud.DataLoader, shuffled_pipe(20), seeds, **kwargs)
    assert_same(ours, ref)
    for epoch in ours:  # every item once: the workers split the pipe
        assert sorted(torch.cat(epoch).tolist()) == list(range(20))
    assert_same(ours[0], ours[1])  # torch.manual_seed before an epoch reproduces its shuffle
    assert not torch.equal(torch.cat(ours[0]), torch.cat(ours[2]))


def test_datapipe_seed_from_generator() -> None:
    ours, ref = run_both(shuffled_pipe(12), epochs=3, batch_size=4, shuffle=True, num_workers=2,
                         persistent_workers=True)  # fmt: skip
    assert_same(ours, ref)


class ShardAware(tud.MapDataPipe):
    """A map-style DataPipe that shows the share ``apply_sharding`` gave its copy, and
    whether the user's ``worker_init_fn`` ran too."""

    def __init__(self) -> None:
        self.share = (1, 0)

    def apply_sharding(self, num_of_instances: int, instance_id: int) -> None:
        self.share = (num_of_instances, instance_id)

    def __len__(self) -> int:
        return 6

    def __getitem__(self, i: int) -> tuple[int, int, int, int]:
        return (i, *self.share, INIT_RAN)


INIT_RAN = 0


def record_worker(worker_id: int) -> None:
    global INIT_RAN
    INIT_RAN = 1


@pytest.mark.parametrize("context", CONTEXTS)
def test_map_datapipe_sharded_in_workers(context: str) -> None:
    ours, ref = run_both(ShardAware(), batch_size=2, num_workers=2, worker_init_fn=record_worker,
                         multiprocessing_context=context)  # fmt: skip
    assert_same(ours, ref)
    # batch k from worker k % 2, which sharded its copy as worker k % 2 of 2, then ran the init
    assert [[int(x[0]) for x in b[1:]] for b in ours] == [[2, 0, 1], [2, 1, 1], [2, 0, 1]]


# -- point 11: iter(loader)._workers, the pass's worker processes ---------------------------------
class WhoServes(tud.Dataset):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> tuple[int, int, int]:
        info = tud.get_worker_info()
        assert info is not None
        return i, info.id, os.getpid()


@pytest.mark.parametrize("context", CONTEXTS)
@pytest.mark.parametrize("persistent", [False, True], ids=["fresh", "persistent"])
def test_iterator_workers(context: str, persistent: bool) -> None:
    for cls in (tud.DataLoader, pf.DataLoader):
        dl = cls(WhoServes(), batch_size=2, num_workers=3, persistent_workers=persistent,
                 multiprocessing_context=context)  # fmt: skip
        it = iter(dl)
        first = next(it)
        alive = list(it._workers)  # pipeflow: those started by the first batch
        assert alive and all(w.is_alive() for w in alive)
        batches = [first, *it]
        workers = it._workers
        # worker k is the process that served the batches worker k's info names (torch's
        # test_get_worker_info), and each is a live multiprocessing.Process
        assert len(workers) == 3
        assert all(isinstance(w, multiprocessing.process.BaseProcess) for w in workers)
        for _, wid, pid in batches:
            assert int(pid[0]) == workers[int(wid[0])].pid
        del it, dl, batches, first  # and then they exit cleanly (torch's iterable-dataset test)
        for w in workers:
            w.join(10)
            assert not w.is_alive()
            assert w.exitcode == 0


# -- a dataset holding multiprocessing objects, with spawn and forkserver workers -------------
class Shared(tud.Dataset):
    """A dataset holding an Event and a shared counter, as a dataset that signals its workers'
    progress may: only a starting process may pickle them (multiprocessing's rule)."""

    def __init__(self, context: str) -> None:
        ctx = multiprocessing.get_context(context)
        self.seen = ctx.Event()
        self.count = ctx.Value("i", 0)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> int:
        self.seen.set()
        with self.count.get_lock():
            self.count.value += 1
        return i


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_dataset_holding_an_event_and_a_value(context: str) -> None:
    got = {}
    for cls in (pf.DataLoader, tud.DataLoader):
        ds = Shared(context)
        batches = list(cls(ds, batch_size=4, num_workers=2, multiprocessing_context=context))
        got[cls] = (batches, ds.seen.is_set(), ds.count.value)
    (ours, our_seen, our_count), (ref, ref_seen, ref_count) = (
        got[pf.DataLoader],
        got[tud.DataLoader],
    )
    assert_same(ours, ref)
    assert (our_seen, our_count) == (ref_seen, ref_count) == (True, 8)


# -- issue 24, item 5: however an epoch ends, the generator is left where torch's leaves it -------
class FailsAt(tud.Dataset):
    """A map-style dataset of *n* ints whose item *bad* raises (none when *bad* is -1)."""

    def __init__(self, n: int, bad: int = -1) -> None:
        self.n, self.bad = n, bad

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        if i == self.bad:
            raise KeyError(i)
        return i


class Counting(tud.IterableDataset):
    """0 .. n-1, split between the workers by torch's get_worker_info."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self):
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(range(start, self.n, step))


def _batch_or_error(it: Any) -> Any:
    try:
        return next(it).tolist()
    except StopIteration:
        return "end"
    except KeyError:  # the dataset's error, raised at its turn (the words differ: torch's
        return "KeyError"  # name its worker process, pipeflow's the stage and the index)


def _stop_after(cls: type, dataset: Any, stop: int, **kwargs: Any) -> tuple[list[Any], Any]:
    """Read *stop* batches of an epoch (an error counts as one), drop the iterator, then read
    the next epoch's first batch; what was read, and the generator's state after it."""
    g = torch.Generator().manual_seed(11)
    dl = cls(dataset, generator=g, **kwargs)
    seen: list[Any] = []
    it = iter(dl)
    for _ in range(stop):
        seen.append(_batch_or_error(it))
        if seen[-1] == "end":
            break
    del it
    seen.append(_batch_or_error(iter(dl)))
    return seen, g.get_state()


@given(
    n=st.integers(1, 40),
    batch_size=st.integers(1, 6),
    workers=st.integers(1, 3),
    prefetch=st.integers(1, 3),
    stop=st.integers(0, 12),
    persistent=st.booleans(),
    shuffle=st.booleans(),
    drop_last=st.booleans(),
    bad=st.integers(-1, 40),
)
# the case: torch's next epoch starts [24, 26, 17, 32], pipeflow's started [9, 38, 7, 26]
@example(
    n=40, batch_size=4, workers=2, prefetch=2, stop=7,
    persistent=False, shuffle=True, drop_last=False, bad=-1,
)  # fmt: skip
@settings(max_examples=15)
def test_an_epoch_that_ends_early_draws_as_torchs(
    n: int, batch_size: int, workers: int, prefetch: int, stop: int,
    persistent: bool, shuffle: bool, drop_last: bool, bad: int,
) -> None:  # fmt: skip
    kwargs = dict(
        batch_size=batch_size, num_workers=workers, prefetch_factor=prefetch,
        persistent_workers=persistent, shuffle=shuffle, drop_last=drop_last,
    )  # fmt: skip
    ours, ours_state = _stop_after(pf.DataLoader, FailsAt(n, bad), stop, **kwargs)
    theirs, their_state = _stop_after(tud.DataLoader, FailsAt(n, bad), stop, **kwargs)
    assert ours == theirs
    assert torch.equal(ours_state, their_state)


@given(stop=st.integers(0, 8), workers=st.integers(1, 3), persistent=st.booleans())
@settings(max_examples=12)
def test_an_iterable_epoch_that_ends_early_draws_as_torchs(
    stop: int, workers: int, persistent: bool
) -> None:
    kwargs = dict(batch_size=2, num_workers=workers, persistent_workers=persistent)
    ours, ours_state = _stop_after(pf.DataLoader, Counting(20), stop, **kwargs)
    theirs, their_state = _stop_after(tud.DataLoader, Counting(20), stop, **kwargs)
    assert ours == theirs
    assert torch.equal(ours_state, their_state)


# -- issue 24, item 3: persistent spawn/forkserver workers share the dataset's shared tensors ----
class EpochInSharedMemory(tud.Dataset):
    """Each sample is the epoch the main process wrote into a shared-memory tensor."""

    def __init__(self) -> None:
        self.epoch = torch.zeros((), dtype=torch.int64).share_memory_()

    def __len__(self) -> int:
        return 2

    def __getitem__(self, i: int) -> int:
        return int(self.epoch)


class ShuffledBySetEpoch(tud.IterableDataset):
    """How a Hugging Face iterable dataset's ``shuffle(seed).set_epoch(e)`` reaches workers:
    the epoch is a shared-memory tensor (``_maybe_share_with_torch_persistent_workers``)
    that ``set_epoch`` updates in place, and each worker shuffles with ``seed + epoch``."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed
        self._epoch = torch.tensor(0).share_memory_()

    def set_epoch(self, epoch: int) -> None:
        self._epoch += epoch - self._epoch

    def __iter__(self):
        order = torch.randperm(
            self.n, generator=torch.Generator().manual_seed(self.seed + int(self._epoch))
        )
        info = tud.get_worker_info()
        start, step = (0, 1) if info is None else (info.id, info.num_workers)
        return iter(order[start::step].tolist())


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_persistent_workers_see_the_main_process_write_shared_tensors(context: str) -> None:
    got = []
    for cls in (pf.DataLoader, tud.DataLoader):
        ds = EpochInSharedMemory()
        dl = cls(ds, batch_size=None, num_workers=2, persistent_workers=True,
                 multiprocessing_context=context)  # fmt: skip
        epochs = []
        for epoch in range(3):
            ds.epoch.fill_(epoch)
            epochs.append(list(dl))
        got.append(epochs)
        del dl
    assert got[0] == got[1] == [[0, 0], [1, 1], [2, 2]]


@pytest.mark.parametrize("context", ["spawn", "forkserver"])
def test_set_epoch_reshuffles_persistent_spawned_workers(context: str) -> None:
    firsts = []
    for cls in (pf.DataLoader, tud.DataLoader):
        ds = ShuffledBySetEpoch(16, seed=42)
        dl = cls(ds, batch_size=4, num_workers=2, persistent_workers=True,
                 multiprocessing_context=context)  # fmt: skip
        epochs = []
        for epoch in range(3):
            ds.set_epoch(epoch)
            epochs.append([b.tolist() for b in dl])
        firsts.append(epochs)
        del dl
    assert firsts[0] == firsts[1]
    assert len({str(e[0]) for e in firsts[0]}) == 3  # a new first batch every epoch
