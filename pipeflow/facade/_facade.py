"""The pieces ``pipeflow.DataLoader`` adds to pipeflow's stages to behave as torch's does:
collate inside workers by torch's dtype rules, an iterable dataset read without ``len()``,
a sampler drawn at ``iter()``, and torch's words in worker errors."""

from __future__ import annotations

import numbers
import signal
import sys
import threading
from collections import deque
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any, overload

import torch
import torch.utils.data as tud

from pipeflow.errors import WorkerDiedError, WorkerTimeoutError
from pipeflow.parallel._kept import pass_pool
from pipeflow.sources._basic import _FromIterable, _FromSampler
from pipeflow.stages.collate import default_collate


def _collate_worker_rules(batch: Any) -> Any:
    """``default_collate`` as torch's runs inside a worker.

    There torch stacks into a shared-memory tensor of the first sample's dtype: a float64
    sample among float32 ones gives a float32 batch, and mixes it cannot cast to that dtype
    (int32 then float32) or samples that require grad are refused. Batches whose tensors all
    agree (nearly all) take pipeflow's faster collate, which gives the same batch; the others
    go to torch's own, in the worker, so they get torch's dtype or torch's error.
    """
    if _uniform(batch):
        return default_collate(batch)
    return tud.default_collate(batch)


class _InWorkerCollate:
    """``default_collate`` as torch's workers apply it; it shows (and fingerprints) as
    ``default_collate``, so a saved state moves between runs with and without workers."""

    def __call__(self, batch: Any) -> Any:
        return _collate_worker_rules(batch)

    def __repr__(self) -> str:
        return "default_collate"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _InWorkerCollate)

    def __hash__(self) -> int:
        return hash(_InWorkerCollate)


_collate_in_worker = _InWorkerCollate()


def _uniform(batch: Any) -> bool:
    """Whether every tensor or array position of *batch* has one dtype and no grad."""
    if not isinstance(batch, (list, tuple)) or not batch:
        return True
    first = batch[0]
    if isinstance(first, torch.Tensor):
        return all(
            isinstance(x, torch.Tensor) and x.dtype == first.dtype and not x.requires_grad
            for x in batch
        )
    dtype = getattr(first, "dtype", None)
    if dtype is not None and hasattr(first, "__array__"):  # numpy arrays and scalars
        return all(getattr(x, "dtype", None) == dtype for x in batch)
    if isinstance(first, dict):
        try:
            return all(_uniform([x[k] for x in batch]) for k in first)
        except (KeyError, TypeError):
            return False
    if isinstance(first, (list, tuple)):
        size = len(first)
        if not all(isinstance(x, (list, tuple)) and len(x) == size for x in batch):
            return False
        return all(_uniform(list(column)) for column in zip(*batch))
    return True


_REPLICA_HINT = (
    "For multiprocessing data-loading, this could be caused by not properly configuring the "
    "IterableDataset replica at each worker. Please see "
    "https://pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset for examples."
)


class _Stream(_FromIterable):
    """An ``IterableDataset`` as a source that never asks for its length.

    torch never calls ``len(dataset)`` while iterating (only ``len(dataloader)`` does), and a
    stream's ``__len__`` may raise or be costly; pipeflow's ``from_iterable`` asks a sized
    iterable for its length to size the pass.
    """

    def __init__(self, dataset: Iterable[Any]) -> None:
        super().__init__(dataset)
        # torch calls iter(dataset) every epoch and trusts it: an IterableDataset that is its
        # own iterator and starts over in __iter__ (DataPipes do) is not a one-shot stream.
        self.one_shot = False

    def length(self) -> int | None:
        return None


class _Sampled(_FromSampler):
    """The facade's source for a map-style dataset: its sampler, read as torch's worker
    iterator reads it (see :class:`_PrimedIter`) when *primed* (with workers; without, torch
    reads the sampler as batches are made, as a plain pass does)."""

    def __init__(self, sampler: Iterable[Any], primed: bool) -> None:
        super().__init__(sampler, set_epoch=False)  # torch never calls set_epoch itself
        self.primed = primed
        self.last: _PrimedIter | None = None

    def iterate(self, context: Any, hooks: Any = None) -> Iterator[Any]:
        if not self.primed:  # a wrapper per index costs a 0-worker loader a quarter of its rate
            return super().iterate(context, hooks)
        self.last = _PrimedIter(super().iterate(context, hooks))
        return self.last

    def prime(self, ahead: int, per: int = 1) -> _PrimedIter | None:
        """Draw *ahead* batches of the pass just started now, as torch's iterator does (a
        batch is *per* of this source's items: the sampler's indices, batched after it);
        the pass's iterator, to :meth:`_PrimedIter.pace` as batches go out."""
        last, self.last = self.last, None
        if last is not None:
            last.ahead_of_use, last.per = ahead, per
            last.reach(ahead * per)
        return last


class _PrimedIter:
    """A pass over the sampler that draws what torch's worker iterator would have drawn.

    torch puts ``prefetch_factor * num_workers`` batches of indices out at ``iter()``, and one
    more each time it hands a batch over (its ``_try_put_index``): when batch *k* goes out it
    has asked the sampler for ``k + ahead`` of them. What a sampler draws from the loader's
    ``generator`` depends on how far it was read (``RandomSampler`` draws a second permutation
    when it is read to its end), so a pass that ends early (a ``break``) leaves the generator
    where torch's would only if the sampler was read as far: :meth:`pace` reads it so far,
    keeping what it read for the pass, which never reads further than torch (it keeps at
    most ``ahead`` batches out, counting those not yet handed over).
    """

    __slots__ = ("ahead", "ahead_of_use", "done", "it", "lock", "per", "taken")

    def __init__(self, it: Iterator[Any]) -> None:
        self.it = it
        self.ahead: deque[Any] = deque()  # drawn, not yet taken by the pass
        self.ahead_of_use = 0
        self.per = 1  # the sampler's items in a batch
        self.taken = 0  # drawn from the sampler in all
        self.done = False  # it ran out (or raised: the error waits in `ahead`)
        self.lock = threading.Lock()  # a pin-memory thread may run the pass

    def pace(self, delivered: int) -> None:
        """*delivered* batches have gone out (or raised): read as far as torch has."""
        self.reach((delivered + self.ahead_of_use) * self.per)

    def reach(self, count: int) -> None:
        """Draw until *count* items were drawn in all (or the sampler ran out)."""
        with self.lock:
            while self.taken < count and not self.done:
                try:
                    self.ahead.append(next(self.it))
                except StopIteration:
                    self.done = True
                except Exception as e:  # the pass raises it at its turn, not here
                    self.ahead.append(_Raise(e))
                    self.done = True
                else:
                    self.taken += 1

    def __iter__(self) -> _PrimedIter:
        return self

    def __next__(self) -> Any:
        with self.lock:
            if self.ahead:
                item = self.ahead.popleft()
                if item.__class__ is _Raise:
                    self.done = False  # as the sampler's own next() would, ask it again
                    raise item.error
                return item
            if self.done:
                raise StopIteration
            try:
                item = next(self.it)
            except StopIteration:
                self.done = True
                raise
            self.taken += 1
            return item


class _Raise:
    """A sampler's error, drawn ahead of the pass: raised when the pass gets to it."""

    __slots__ = ("error",)

    def __init__(self, error: Exception) -> None:
        self.error = error


class _Workers(Sequence[Any]):
    """torch's ``iter(loader)._workers``: the pass's worker processes (``Process`` objects).

    pipeflow starts a pass's workers at its first ``next()``, not at ``iter()`` (the first
    batch is made while the others start), so this is a live view: each use lists the
    processes the pass's pool has started by then. Once the pass has run, it keeps them, so
    they can be joined and their exit codes read after the pass ended, as torch's tests do.
    """

    def __init__(self, resources: Mapping[Any, Mapping[Any, Any]], epoch: int) -> None:
        self._resources = resources
        self._epoch = epoch
        self._pool: Any = None

    def find(self) -> None:
        """Look the pass's pool up (the iterator does after each item, until found)."""
        if self._pool is None:
            self._pool = pass_pool(self._resources, self._epoch)
            if hasattr(self._pool, "keep_processes"):  # usable after the pass, as torch's
                self._pool.keep_processes = True

    def _procs(self) -> list[Any]:
        self.find()
        return [p for p in getattr(self._pool, "procs", ()) if p is not None]

    @overload
    def __getitem__(self, i: int) -> Any: ...
    @overload
    def __getitem__(self, i: slice) -> list[Any]: ...
    def __getitem__(self, i: int | slice) -> Any:
        return self._procs()[i]

    def __len__(self) -> int:
        return len(self._procs())

    def __repr__(self) -> str:
        return repr(self._procs())


class _WorkerIter:
    """The iterator of a DataLoader with workers: pipeflow's pass, with torch's words added to
    the errors users grep their logs and write ``except`` filters for, and torch's
    ``_workers``.

    Threads may share it, as they may share torch's: one ``next()`` at a time runs the pass
    (a lock per batch, nothing next to a batch's trip through a worker), so two threads
    reading it get every batch once between them.
    """

    __slots__ = ("_delivered", "_it", "_lock", "_paced", "_timeout", "_workers")

    def __init__(
        self,
        it: Iterator[Any],
        timeout: float,
        workers: _Workers,
        paced: _PrimedIter | None = None,
    ) -> None:
        self._it = it
        self._timeout = timeout
        self._workers = workers
        self._lock = threading.Lock()
        self._paced = paced  # the pass's sampler, read as far as torch's iterator reads it
        self._delivered = 0

    def __iter__(self) -> _WorkerIter:
        return self

    def __next__(self) -> Any:
        lock = self._lock
        lock.acquire()
        try:
            item = next(self._it)
            if self._workers._pool is None:
                self._workers.find()
            if self._paced is not None:
                self._delivered += 1
                self._paced.pace(self._delivered)
            return item
        except StopIteration:
            raise
        except BaseException as e:
            if self._paced is not None:  # torch reads the sampler before it re-raises
                self._delivered += 1
                self._paced.pace(self._delivered)
            self._workers.find()  # a pass that failed at once ran on workers too
            if isinstance(e, WorkerDiedError):
                _torch_words(e, _died_words(e))
            elif isinstance(e, WorkerTimeoutError):
                _torch_words(e, f"DataLoader timed out after {self._timeout} seconds")
            error = e
        finally:
            lock.release()
        try:
            raise error
        finally:  # the traceback keeps this frame: it must not keep the pass (and its
            del error, self  # workers) alive after a failed batch

    def close(self) -> None:
        close = getattr(self._it, "close", None)
        if callable(close):
            close()

    def __getattr__(self, name: str) -> Any:  # state, stats... of the pass underneath
        if name in _WorkerIter.__slots__:  # not set (a copy made without __init__)
            raise AttributeError(name)
        return getattr(self._it, name)


def _died_words(e: WorkerDiedError) -> str:
    pid, code = getattr(e, "pid", None), getattr(e, "exitcode", None)
    if pid is not None and code is not None and code < 0:
        try:
            name = signal.strsignal(-code) or f"signal {-code}"
        except ValueError:
            name = f"signal {-code}"
        return f"DataLoader worker (pid {pid}) is killed by signal: {name}."
    return f"DataLoader worker (pid(s) {pid if pid is not None else '?'}) exited unexpectedly"


def _torch_words(e: BaseException, words: str) -> None:
    text = str(e)
    if not text.startswith("DataLoader "):
        e.args = (f"{words} ({text})",)


# -- what torch accepts when built and no pass could run with ------------------------------------
def check_settings(dl: Any) -> None:
    """Refuse, when a DataLoader is built, the values torch's constructor lets through that no
    pass could run with (torch fails on them at ``iter()``, in a worker, or not at all): the
    message names torch's parameter. What torch refuses itself it has refused already, with
    its own words; what torch runs with (``num_workers=True``, ``timeout=0``) passes."""
    from pipeflow import _checks
    from pipeflow.parallel._settings import MAX_WORKERS

    workers = _whole(dl.num_workers, "num_workers", high=MAX_WORKERS)
    if workers and dl.prefetch_factor is not None:
        prefetch = _whole(dl.prefetch_factor, "prefetch_factor")
        if prefetch == 0:  # torch's worker iterator asserts it at iter()
            msg = (
                "DataLoader: prefetch_factor must be at least 1 with num_workers > 0 (got "
                f"{dl.prefetch_factor!r}): each worker needs a batch to work on"
            )
            raise ValueError(msg)
        if prefetch * workers > sys.maxsize:
            msg = (
                "DataLoader: prefetch_factor * num_workers must be at most sys.maxsize (got "
                f"prefetch_factor={prefetch}, num_workers={workers})"
            )
            raise ValueError(msg)
    if dl.batch_size is not None:
        _whole(dl.batch_size, "batch_size", high=sys.maxsize)
    timeout = dl.timeout
    if isinstance(timeout, numbers.Real) and not 0 <= float(timeout) <= threading.TIMEOUT_MAX:
        msg = (  # torch refused a negative one already: this is inf (or past a wait), or NaN
            f"DataLoader: timeout must be at most {threading.TIMEOUT_MAX:.0f} seconds (got "
            f"{timeout!r}); pass 0 to wait forever"
        )
        raise ValueError(msg)
    for name in ("collate_fn", "worker_init_fn"):
        _checks.function("DataLoader", name, getattr(dl, name), optional=True)


def _whole(value: Any, name: str, high: int | None = None) -> int:
    from pipeflow import _checks

    if isinstance(value, bool):  # torch runs with True as 1
        return int(value)
    return _checks.integer("DataLoader", name, value, low=0, high=high)


def in_order_flag(value: Any, workers: int) -> bool:
    """``in_order`` as a bool. torch reads it only with workers: without, one that has no truth
    value (a tensor of many elements) is ignored, as torch ignores it."""
    try:
        return bool(value)
    except Exception:
        if workers:
            raise
        return True
