"""``pipeflow.DataLoader``: torch's ``DataLoader``, running on pipeflow stages.

The class *is* a ``torch.utils.data.DataLoader`` (a subclass): the constructor, its validation,
the public attributes and which of them are frozen are torch's own, so frameworks that read a
loader's attributes and rebuild it (Lightning, Accelerate) keep working. Only iteration differs:
it runs the pipeline that :meth:`DataLoader.pipeline` builds from pipeflow's public stages.

This module imports torch; ``import pipeflow`` loads it on first access to
``pipeflow.DataLoader``.
"""

from __future__ import annotations

import functools
import inspect
import operator
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

import torch
import torch.utils.data as tud
from torch.utils.data.dataloader import _DatasetKind

from pipeflow._hints import checked_keywords
from pipeflow.engine._stage import Stage
from pipeflow.engine.loader import Loader
from pipeflow.facade import _facade_state
from pipeflow.facade._facade import (
    _REPLICA_HINT,
    _collate_in_worker,
    _Sampled,
    _Stream,
    _WorkerIter,
    _Workers,
    check_settings,
    in_order_flag,
)
from pipeflow.parallel import parallel_map, parallel_source
from pipeflow.resume._check import check_loader
from pipeflow.stages.batch import batch
from pipeflow.stages.collate import collate, default_collate, default_convert
from pipeflow.stages.device import _accelerator, pin_memory
from pipeflow.stages.fetch import fetch
from pipeflow.stages.ignore import ignore_errors, is_ignore_errors
from pipeflow.stats import DATALOADER_KNOBS, Stats

__all__ = ["DataLoader"]

T_co = TypeVar("T_co", covariant=True)

# torch < 2.6 has neither `in_order` nor `torch.accelerator`: the facade keeps its own
# `in_order` there (pipeflow delivers out of order on any torch) and asks CUDA instead.
_TORCH_HAS_IN_ORDER = "in_order" in inspect.signature(tud.DataLoader.__init__).parameters

# torch's collate functions are swapped for ours, which give the same batches faster.
_FASTER: dict[Callable[..., Any], Callable[..., Any]] = {
    tud.default_collate: default_collate,
    tud.default_convert: default_convert,
}


class DataLoader(tud.DataLoader[T_co]):
    """A drop-in ``torch.utils.data.DataLoader`` whose iteration runs on pipeflow stages.

    Same signature, same validation, same attributes and the same batches as torch's (with the
    same seeded ``generator``) — see torch's documentation for every argument. What changes is
    what runs underneath: the pipeline :meth:`pipeline` returns. One keyword-only argument
    comes after torch's, and changes nothing unless it is given:

    Args:
        ignore_errors: skip bad samples instead of raising: ``True`` drops every sample whose
            ``dataset[i]`` (or ``collate_fn``) raised an ``Exception``, and the batch goes on
            shorter; ``pf.ignore_errors(exceptions=..., max_count=..., max_fraction=...)``
            chooses the exception types and a budget per epoch. Drops are counted in
            :meth:`stats` and logged once per epoch (see :func:`pipeflow.ignore_errors`).
            ``False`` (the default): a failed batch raises at its turn, as with torch.

    Examples:
        >>> import torch, pipeflow as pf
        >>> ds = torch.arange(10.0)
        >>> dl = pf.DataLoader(ds, batch_size=4, shuffle=True,
        ...                    generator=torch.Generator().manual_seed(0))
        >>> ref = torch.utils.data.DataLoader(ds, batch_size=4, shuffle=True,
        ...                                   generator=torch.Generator().manual_seed(0))
        >>> all(torch.equal(a, b) for a, b in zip(dl, ref))
        True
        >>> isinstance(dl, torch.utils.data.DataLoader), len(dl)
        (True, 3)
        >>> class Files(torch.utils.data.Dataset):
        ...     def __len__(self):
        ...         return 6
        ...     def __getitem__(self, i):
        ...         if i == 2:
        ...             raise OSError(f"file {i} is cut short")
        ...         return i
        ...
        >>> [b.tolist() for b in pf.DataLoader(Files(), batch_size=4, ignore_errors=True)]
        [[0, 1, 3], [4, 5]]
    """

    @checked_keywords
    def __init__(
        self,
        dataset: tud.Dataset[T_co],
        batch_size: int | None = 1,
        shuffle: bool | None = None,
        sampler: tud.Sampler[Any] | Iterable[Any] | None = None,
        batch_sampler: tud.Sampler[list[Any]] | Iterable[list[Any]] | None = None,
        num_workers: int = 0,
        collate_fn: Callable[[list[Any]], Any] | None = None,
        pin_memory: bool = False,
        drop_last: bool = False,
        timeout: float = 0,
        worker_init_fn: Callable[[int], None] | None = None,
        multiprocessing_context: Any = None,
        generator: torch.Generator | None = None,
        *,
        prefetch_factor: int | None = None,
        persistent_workers: bool = False,
        pin_memory_device: str = "",
        in_order: bool = True,
        ignore_errors: bool | Stage[Any, Any] = False,
    ) -> None:
        super().__init__(
            dataset,
            batch_size=batch_size,
            shuffle=shuffle,
            sampler=sampler,
            batch_sampler=batch_sampler,
            num_workers=num_workers,
            collate_fn=collate_fn,
            pin_memory=pin_memory,
            drop_last=drop_last,
            timeout=timeout,
            worker_init_fn=worker_init_fn,
            multiprocessing_context=multiprocessing_context,
            generator=generator,
            prefetch_factor=prefetch_factor,
            persistent_workers=persistent_workers,
            pin_memory_device=pin_memory_device,
            **({"in_order": in_order} if _TORCH_HAS_IN_ORDER else {}),
        )
        if not _TORCH_HAS_IN_ORDER:  # pragma: no cover - torch < 2.6
            self.in_order = in_order
        self._pf_setup(ignore_errors)

    def _pf_setup(self, ignore_errors: bool | Stage[Any, Any]) -> None:
        """pipeflow's part of the constructor: its state, its own argument, its checks."""
        self._pf_drawn = False
        self._pf_base_seed: int | None = None  # the workers' base seed, drawn at a pass start
        self._pf_rng_at_start: dict[str, Any] | None = None
        self._pf_pass_epoch: int | None = None  # the epoch of the pass last started
        self._pf_pass_draws = True  # the pass in progress drew its workers' base seed
        self._pf_key: tuple[Any, ...] | None = None
        self._pf_loader: Loader[Any] | None = None
        self._pf_sampled: _Sampled | None = None
        self._pf_stream: _Stream | None = None
        self.ignore_errors = skipping(ignore_errors)
        check_settings(self)  # what torch's checks let through, that no pass could run with

    # -- the pipeline ----------------------------------------------------------------------
    def pipeline(self) -> Loader[Any]:
        """The pipeflow loader this DataLoader runs, built from its current attributes.

        It is about twenty lines of public stages: a source (the batch sampler, the sampler,
        or the iterable dataset), ``fetch``, ``batch`` for iterable datasets, ``collate``, and
        with workers, ``parallel_map`` (map-style) or ``parallel_source`` (iterable-style).
        """
        key = (
            self.collate_fn,
            self.pin_memory,
            self.num_workers,
            self.prefetch_factor,
            self.in_order,
            self.timeout,
            self.worker_init_fn,
            self.multiprocessing_context,
            self.ignore_errors,
        )
        if self._pf_loader is not None and key == self._pf_key:
            return self._pf_loader
        collate_fn = self._faster_collate()
        workers = self._worker_settings()
        self._pf_sampled = None
        if self._dataset_kind == _DatasetKind.Iterable:
            loader = self._iterable_pipeline(collate_fn, workers)
        else:
            loader = self._map_pipeline(collate_fn, workers)
        dropping = skipping(self.ignore_errors)
        if dropping is not False:  # after the workers: they mark failed samples, it drops
            loader = loader | (ignore_errors() if dropping is True else dropping)
        if self.pin_memory and _accelerator():
            loader = loader | pin_memory()  # in a background thread, as torch does
        if self._pf_loader is not None:  # keep the epoch count across a rebuild
            loader.set_epoch(self._pf_loader.epoch)
            self._pf_loader.close()
        self._pf_key, self._pf_loader = key, loader
        return loader

    def _faster_collate(self) -> Callable[..., Any]:
        """``collate_fn``, torch's own swapped for ours (run in the workers when there are)."""
        collate_fn = _FASTER.get(self.collate_fn, self.collate_fn)
        if collate_fn is default_collate and operator.index(self.num_workers) > 0:
            collate_fn = _collate_in_worker
        return collate_fn

    def _worker_settings(self) -> dict[str, Any]:
        """The arguments of ``parallel_map`` / ``parallel_source``, from torch's attributes.

        What torch accepts (numpy integers, 0/1 for flags) is normalised here, so pipeflow's
        stages, which check strictly, see plain ints and bools.
        """
        num_workers = operator.index(self.num_workers)
        prefetch = 0 if self.prefetch_factor is None else operator.index(self.prefetch_factor)
        worker_init = self.worker_init_fn
        datapipe = isinstance(self.dataset, (tud.IterDataPipe, tud.MapDataPipe))
        if datapipe and num_workers > 0:  # each worker shards its copy first, as in torch
            from pipeflow.facade._datapipes import shard_in_worker

            worker_init = shard_in_worker(worker_init)
        return {
            "workers": num_workers,
            "backend": "process",
            "ordered": in_order_flag(self.in_order, num_workers),
            "max_in_flight": max(1, prefetch * num_workers),
            "mp_context": self.multiprocessing_context,
            "worker_init": worker_init,
            "timeout": float(self.timeout) or None,
            "persistent": bool(self.persistent_workers),
        }

    def _iterable_pipeline(
        self, collate_fn: Callable[..., Any], workers: dict[str, Any]
    ) -> Loader[Any]:
        """An iterable dataset's pipeline: the dataset, ``batch``, ``collate``; with workers,
        all of it in ``parallel_source``."""
        if isinstance(self.dataset, tud.IterDataPipe):  # its workers get a seed per pass
            from pipeflow.facade._datapipes import DataPipeStream

            self._pf_stream = DataPipeStream(self.dataset)
        else:
            self._pf_stream = _Stream(self.dataset)  # type: ignore[arg-type]
        loader: Loader[Any] = Loader(self._pf_stream)
        if self.batch_size is not None:
            size = operator.index(self.batch_size)
            loader = loader | batch(size, drop_last=bool(self.drop_last))
        loader = loader | collate(collate_fn)
        if workers["workers"] > 0:  # every worker iterates its own replica, as in torch
            loader = parallel_source(loader, **workers)
        return loader

    def _map_pipeline(self, collate_fn: Callable[..., Any], workers: dict[str, Any]) -> Loader[Any]:
        """A map-style dataset's pipeline: the sampler, ``batch`` (for torch's own batch
        sampler, which batches the same way: the sampler is then the source, so a stateful
        one is saved and restored), ``fetch`` and ``collate``; with workers (or out of
        order), those two in ``parallel_map``."""
        size = self.batch_size if type(self.batch_sampler) is tud.BatchSampler else None
        sampler = self._index_sampler if size is None else self.sampler
        self._pf_sampled = _Sampled(sampler, primed=self.num_workers > 0)
        loader: Loader[Any] = Loader(self._pf_sampled)
        if size is not None:
            loader = loader | batch(operator.index(size), drop_last=bool(self.drop_last))
        work = fetch(self.dataset, batched=self._auto_collation) | collate(collate_fn)
        if workers["workers"] > 0 or not workers["ordered"]:  # batch k to worker k % workers
            work = parallel_map(work, round_robin=True, **workers)
        out: Loader[Any] = loader | work
        return out

    def __iter__(self) -> Iterator[Any]:  # type: ignore[override]
        if self.timeout != 0 and self.num_workers == 0:
            # torch's single-process iterator asserts the same.
            msg = f"timeout is only supported with num_workers > 0 (got timeout={self.timeout})"
            raise AssertionError(msg)
        self._warn_pin_memory()
        # torch draws the workers' base seed from `generator` when an iterator starts, after
        # iter(sampler): draw it at the same point, so the generator's stream (and so every
        # later shuffle) stays identical to torch's.
        # With persistent workers torch makes one iterator and resets it for later epochs, so
        # it draws only once; so do we (the workers keep their first seeds either way).
        draw = functools.cache(self._draw_base_seed)
        reuse = self._reuses_base_seed()
        self._pf_pass_draws = not reuse
        self._pf_rng_at_start = _facade_state.generators(self)  # what state_dict() replays from
        if isinstance(self.dataset, (tud.IterDataPipe, tud.MapDataPipe)):
            self._prepare_datapipe()
        it = self.pipeline().start(base_seed=self._pf_base_seed if reuse else draw)
        self._pf_pass_epoch = self.pipeline().epoch  # the pass state_dict() may stand in
        if not reuse:
            draw()
            self._pf_drawn = True
            if self.num_workers > 0 and isinstance(self.dataset, tud.IterDataPipe):
                # torch's worker iterator then resets itself once, which draws a second
                # shuffle seed (for the main process's copy only): draw it too, so that the
                # generator's later draws stay torch's
                from pipeflow.facade._datapipes import share_seed

                share_seed(self.dataset, self.generator, self)
        paced = None
        if self._pf_sampled is not None and self.num_workers > 0:
            # torch's worker iterator puts prefetch_factor * num_workers batches of indices
            # in its queues before iter() returns: the sampler's order is drawn there, after
            # the base seed. Two live iterators (zip(dl, dl)) then see what torch's see; and
            # the pass goes on reading the sampler as torch's does (see _PrimedIter).
            ahead = operator.index(self.prefetch_factor or 0) * self.num_workers
            per = self.batch_size if type(self.batch_sampler) is tud.BatchSampler else 1
            paced = self._pf_sampled.prime(ahead, per or 1)
        if (
            self._dataset_kind == _DatasetKind.Iterable
            and self._IterableDataset_len_called is not None
        ):
            it = self._count_against_len(it, self._IterableDataset_len_called)
        if self.num_workers > 0:
            loader = self.pipeline()
            return _WorkerIter(it, self.timeout, _Workers(loader.resources, loader.epoch), paced)
        return it

    def stats(self) -> Stats:
        """Per-stage counts and times of the pipeline this DataLoader runs, and the bottleneck.

        ``print(dl.stats())`` shows a table, one row per stage of :meth:`pipeline` (the
        sampler, ``batch``, ``fetch`` and ``collate``, or ``parallel_map`` that runs those two
        in the workers), the time the training loop waited, and what to try, in this class's
        words (``num_workers``, ``prefetch_factor``). See :meth:`pipeflow.Loader.stats` and
        the how-to "Find the bottleneck with stats()".

        Examples:
            >>> import torch, pipeflow as pf
            >>> dl = pf.DataLoader(torch.arange(10.0), batch_size=4)
            >>> _ = list(dl)
            >>> [(s.name, s.items) for s in dl.stats().stages]
            [('from_sampler', 10), ('batch', 3), ('fetch', 3), ('collate', 3)]
        """
        return self.pipeline().stats().advising(DATALOADER_KNOBS)

    # -- resumption (torchdata's StatefulDataLoader interface) ---------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands: give it to :meth:`load_state_dict` of a DataLoader built
        the same way, in this process or a new one.

        It holds the pipeline's state (see :meth:`pipeflow.Loader.state_dict`: the position,
        the seeds, the user's stateful dataset, sampler and iterators, the workers' states),
        what the DataLoader is in torch's words, the state of the random generators the
        samplers draw from as it was when the pass began (so the resumed pass draws the same
        order), and persistent workers' base seed. It is JSON-serialisable when the user's
        objects' states are. Map-style datasets resume across worker counts.
        """
        position = self.pipeline().state_dict()
        # Mid-pass, the resumed pass must draw what this pass drew: the generators as they
        # were when the pass began. Between passes (the end of one is the start of the next:
        # the state is the next epoch's), as they are now.
        in_pass = position["epoch"] == self._pf_pass_epoch
        if in_pass and self._pf_rng_at_start is not None:  # the pass re-draws what it drew
            gens, draws = self._pf_rng_at_start, self._pf_pass_draws
        else:  # the next pass draws its workers' base seed unless it reuses persistent ones
            gens, draws = _facade_state.generators(self), not self._reuses_base_seed()
        state = {
            "pipeflow_dataloader": _facade_state.VERSION,
            "dataloader": _facade_state.identity(self),
            "loader": position,
            "generators": gens,
            "base_seed": self._pf_base_seed if self.persistent_workers else None,
            "draws_base_seed": draws,
        }
        state["digest"] = _facade_state.digest_of(state)
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next ``iter()`` yield exactly the rest of the epoch *state* was taken in,
        then the following epochs as the uninterrupted run would.

        Everything is checked before anything changes: a refused state leaves the
        DataLoader as it was.

        Raises:
            ValueError: if *state* is malformed, or from a DataLoader that differs in what
                decides the rest of the epoch (``batch_size``, ``shuffle``, the dataset's
                length, ...), naming it.
        """
        gens, base_seed, draws = _facade_state.check(self, state)
        loader = self.pipeline()
        check_loader(loader, state["loader"])  # refused in its own words before the digest's
        _facade_state.check_digest(state)
        loader.load_state_dict(state["loader"])
        _facade_state.set_generators(self, gens)
        self._pf_rng_at_start = None
        self._pf_base_seed = base_seed
        self._pf_drawn = not draws  # a resumed pass draws (the same seed) as the first one did

    def _prepare_datapipe(self) -> None:
        """Before a pass over a DataPipe, what torch's iterator does first: draw the pass's
        shuffle seed (told to the workers with their tasks) and, without workers, shard."""
        from pipeflow.facade._datapipes import DataPipeStream, shard_here, share_seed

        seed = share_seed(self.dataset, self.generator, self)
        if self.num_workers == 0:
            shard_here(self.dataset)
        self.pipeline()  # built (or rebuilt) now: the stream told is the one that will run
        if isinstance(self._pf_stream, DataPipeStream):
            self._pf_stream.seed = seed

    def _reuses_base_seed(self) -> bool:
        """Whether the next pass reuses its persistent workers' base seed (not drawing)."""
        return bool(self.persistent_workers and self.num_workers > 0 and self._pf_drawn)

    def _draw_base_seed(self) -> int:
        seed = torch.empty((), dtype=torch.int64).random_(generator=self.generator).item()
        self._pf_base_seed = int(seed)
        return int(seed)

    def _warn_pin_memory(self) -> None:
        if self.pin_memory and self.pin_memory_device:
            warnings.warn(
                "pin_memory_device is deprecated, the current accelerator will be used as the "
                f"device, ignore pin_memory_device='{self.pin_memory_device}'.",
                stacklevel=3,
            )
        if self.pin_memory and not _accelerator():
            warnings.warn(
                "'pin_memory' argument is set as true but no accelerator is found, then device "
                "pinned memory won't be used.",
                stacklevel=3,
            )

    def _count_against_len(self, it: Iterator[Any], length: int) -> Iterator[Any]:
        for n, item in enumerate(it, 1):
            if n > length:
                # torch's words, its missing space included: users filter warnings by them.
                msg = (
                    f"Length of IterableDataset {self.dataset} was reported to be {length}"
                    f"(when accessing len(dataloader)), but {n} samples have been fetched. "
                )
                if self.num_workers > 0:
                    msg += _REPLICA_HINT
                warnings.warn(msg, stacklevel=2)
            yield item


def skipping(value: Any) -> bool | Stage[Any, Any]:
    """*value*, which ``ignore_errors=`` takes: a bool, or a ``pf.ignore_errors(...)`` stage."""
    if isinstance(value, bool) or is_ignore_errors(value):
        return value
    msg = (
        "DataLoader: ignore_errors must be True, False or pf.ignore_errors(...) "
        f"(got {value!r}); pf.ignore_errors(exceptions=OSError, max_count=10) drops only "
        "OSErrors, at most 10 an epoch"
    )
    raise TypeError(msg)
