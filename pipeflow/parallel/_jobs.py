"""What a ``parallel_source`` worker does with one task: take the next item of its own replica
of a loader (``SourceJob``); and the names every worker shares (``Exhausted``, how an error
note names an item). A ``parallel_map`` worker's job, ``MapJob``, is in :mod:`._worker`."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple

from pipeflow.loader import Loader
from pipeflow.worker_info import get_worker_info, set_replica

__all__ = ["Exhausted", "PassNote", "SourceJob", "describe_item"]


class Exhausted(Exception):
    """A source job has no more items this epoch."""


def describe_item(item: Any, seq: int) -> dict[str, Any]:
    """How an error note names an item: a sample index, a batch of them, or its position."""
    if type(item) is int:
        return {"index": item}
    if type(item) is list and all(type(i) is int for i in item[:64]):
        return {"batch": item}
    return {"item": seq}


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
