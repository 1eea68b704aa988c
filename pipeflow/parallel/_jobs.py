"""What a worker does with one task: apply a function or a one-to-one stage (``MapJob``), or
take the next item of its own replica of a loader (``SourceJob``)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

from pipeflow._context import Context
from pipeflow._failure import Failure, WithDropped
from pipeflow._stage import Stage
from pipeflow.errors import annotate
from pipeflow.loader import Loader
from pipeflow.worker_info import get_worker_info, set_replica

__all__ = ["Exhausted", "MapJob", "PassNote", "SourceJob", "describe_item"]


class Exhausted(Exception):
    """A source job has no more items this epoch."""


def describe_item(item: Any, seq: int) -> dict[str, Any]:
    """How an error note names an item: a sample index, a batch of them, or its position."""
    if type(item) is int:
        return {"index": item}
    if type(item) is list and all(type(i) is int for i in item[:64]):
        return {"batch": item}
    return {"item": seq}


class MapJob:
    """Apply a function, or a one-to-one stage, to one item at a time."""

    def __init__(
        self,
        fn: Callable[[Any], Any] | Stage[Any, Any],
        name: str,
        ignoring: tuple[type[BaseException], ...] = (),
        facts: dict[str, Any] | None = None,
    ) -> None:
        self.fn = fn
        self.name = name
        self.stages = fn.stages if isinstance(fn, Stage) else None
        self.ignoring = ignoring  # what a later ignore_errors drops (fetch drops samples)
        # What the stages above told this pass (how a shard numbers its items, so that a
        # random_map in the workers keys its draws as one in the loader would); not what
        # described this stage's own input.
        self.facts = {k: v for k, v in (facts or {}).items() if k != "input"}

    def without_torch(self) -> None:
        """In a worker that has not imported torch: the stages' numpy-only forms."""
        if self.stages is not None:
            self.stages = tuple(s.without_torch() for s in self.stages)

    @property
    def dataset(self) -> Any:
        """The dataset the stages read by key, for ``WorkerInfo.dataset``."""
        return next((s.dataset for s in self.stages or () if s.dataset is not None), None)

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        if self.stages is None:
            try:
                return self.fn(item)  # type: ignore[operator]
            except Exception as e:
                annotate(e, self.name, epoch, **describe_item(item, seq))
                raise
        failed: list[str] = []
        # The item's place in the pass, and what the pass was told.
        context = Context(epoch, offset=seq, ignoring=self.ignoring, facts=self.facts)
        dropped: list[Failure] = []
        it: Iterator[Any] = iter((item,))
        for s in self.stages:
            it = _track(s.apply(it, context), s.name, failed)
            if s.failures == "mark":  # failures it yields: raised, or kept when dropped
                it = _unmark(it, dropped)
            context = s.context_after(context)
        try:
            out = next(it)
        except StopIteration:
            msg = (
                f"stage {(failed or [self.name])[0]!r} yielded nothing for one item; "
                "parallel_map runs one-to-one stages only"
            )
            raise ValueError(msg) from None
        except Exception as e:
            annotate(e, failed[0] if failed else self.name, epoch, **describe_item(item, seq))
            raise
        for _ in it:  # let the stages finish the item (a dropped failure may follow)
            pass
        return WithDropped(out, dropped) if dropped else out


def _unmark(it: Iterator[Any], dropped: list[Failure]) -> Iterator[Any]:
    for value in it:
        if value.__class__ is Failure:
            if not value.dropped:
                raise value.error
            dropped.append(value)
        else:
            yield value


def _track(it: Iterator[Any], name: str, failed: list[str]) -> Iterator[Any]:
    try:
        yield from it
    except Exception:
        if not failed:
            failed.append(name)
        raise


class PassNote(NamedTuple):
    """What a pass tells source workers with each task (a DataPipe's shuffle seed): the
    source's ``pass_note()`` in the main process, its ``begin_pass(value)`` in the worker."""

    value: Any


class SourceJob:
    """Run a whole loader in each worker, one item per task (an ``IterableDataset`` replica)."""

    def __init__(self, loader: Loader[Any], name: str) -> None:
        self.loader = loader
        self.name = name
        self._epoch: int | None = None
        self._it: Iterator[Any] | None = None

    @property
    def dataset(self) -> Any:
        return getattr(self.loader.source, "iterable", None)

    def without_torch(self) -> None:
        """In a worker that has not imported torch: the stages' numpy-only forms."""
        stages = tuple(s.without_torch() for s in self.loader.stages)
        self.loader = Loader(self.loader.source, stages)

    def clone(self) -> SourceJob:
        """A replica with its own iterator (one per thread worker)."""
        return SourceJob(Loader(self.loader.source, self.loader.stages), self.name)

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        info = get_worker_info()
        if info is not None:  # shard() inside reads this worker's share
            set_replica(True, thread=info.backend == "thread")
        if self._epoch != epoch:
            if self._it is not None:
                self._it.close()  # type: ignore[attr-defined]
            self.loader.set_epoch(epoch)
            if isinstance(item, PassNote):
                self.loader.source.begin_pass(item.value)  # type: ignore[attr-defined]
            self._it = iter(self.loader)
            self._epoch = epoch
        assert self._it is not None
        try:
            return next(self._it)
        except StopIteration:
            raise Exhausted from None
