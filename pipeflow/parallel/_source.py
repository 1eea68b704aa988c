"""``parallel_source``: a copy of a loader in each worker, their items interleaved."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from pipeflow._context import Context, Hooks
from pipeflow.loader import Loader, Source
from pipeflow.parallel._run import run_parallel
from pipeflow.parallel._settings import Settings, settings
from pipeflow.parallel._wire import PassNote
from pipeflow.parallel._worker import SourceJob

__all__ = ["parallel_source"]

T = TypeVar("T")


class _ParallelSource(Source[Any]):
    name = "parallel_source"
    uses_hooks = True  # its persistent pool is kept by the loader, between passes

    def __init__(self, loader: Loader[Any], config: Settings) -> None:
        self.loader = loader
        self.config = config

    def iterate(self, context: Context, hooks: Hooks | None = None) -> Iterator[Any]:
        job = SourceJob(self.loader, "parallel_source")
        # Read now, as the pass starts (not at its first item): what this pass tells workers.
        tell = getattr(self.loader.source, "pass_note", None)
        value = tell() if tell is not None else None
        note = None if value is None else PassNote(value)
        return run_parallel(job, self.config, "parallel_source", None, context, hooks, note)

    def describe(self) -> str:
        return self.config.describe("parallel_source", repr(self.loader))

    def __reduce__(self) -> tuple[Any, ...]:
        return (_ParallelSource, (self.loader, self.config))


def parallel_source(
    loader: Loader[T],
    *,
    workers: int,
    backend: str = "process",
    ordered: bool = True,
    max_in_flight: int | None = None,
    mp_context: Any = None,
    worker_init: Callable[[int], Any] | None = None,
    timeout: float | None = None,
    persistent: bool = False,
    seed: int | None = None,
) -> Loader[T]:
    """Run a copy of *loader* in each worker and interleave their outputs, round-robin.

    This is how torch's ``DataLoader`` runs an ``IterableDataset`` with workers: each worker
    iterates its own replica, so the dataset must split itself by
    :func:`~pipeflow.get_worker_info` (or ``torch.utils.data.get_worker_info``, which answers
    too) to avoid duplicates. With ``ordered=True`` the items come worker 0, worker 1, ...,
    worker 0, ...; a worker that runs out drops out of the rotation. Arguments as for
    :func:`parallel_map`.

    A worker process that dies ends the pass with :class:`~pipeflow.WorkerDiedError` (its
    replica's stream can't be taken up where it stopped, so there is no ``restarts``), and
    :func:`~pipeflow.ignore_errors` never drops it, nor an error that ended a replica's
    stream: the items the replica would have made after it were never made.

    Examples:
        >>> import pipeflow as pf
        >>> class Shard:
        ...     def __iter__(self):
        ...         info = pf.get_worker_info()
        ...         start, step = (0, 1) if info is None else (info.id, info.num_workers)
        ...         return iter(range(start, 7, step))
        >>> list(pf.parallel_source(pf.from_iterable(Shard()), workers=2, backend="thread"))
        [0, 1, 2, 3, 4, 5, 6]
    """
    if not isinstance(loader, Loader):
        msg = f"parallel_source: loader must be a pipeflow loader (got {type(loader).__name__})"
        raise TypeError(msg)
    config = settings(
        "parallel_source",
        workers=workers,
        backend=backend,
        ordered=ordered,
        max_in_flight=max_in_flight,
        mp_context=mp_context,
        worker_init=worker_init,
        timeout=timeout,
        persistent=persistent,
        seed=seed,
        round_robin=True,
    )
    return Loader(_ParallelSource(loader, config))
