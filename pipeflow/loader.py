"""The loader object: a source and its stages, re-iterable epoch after epoch."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Iterator
from typing import Any, Generic, TypeVar, overload

from pipeflow import _checks
from pipeflow._chain import run
from pipeflow._context import Context
from pipeflow._stage import Stage
from pipeflow.state import Progress, check, take
from pipeflow.stats import LoaderRecord, Stats

__all__ = ["Context", "Loader", "Source"]

T = TypeVar("T")
Out = TypeVar("Out", covariant=True)


class Source(Generic[Out]):
    """Where items enter a pipeline. Subclasses implement :meth:`iterate` and :meth:`length`."""

    name: str = "source"
    #: Whether :meth:`iterate` takes the loader's private hooks as a second argument (a
    #: parallel source keeps its persistent pool there).
    uses_hooks: bool = False

    def iterate(self, context: Context) -> Iterator[Out]:
        """Return a fresh iterator over this epoch's items.

        A source whose :meth:`positions` is not ``None`` starts at item ``context.start``
        (a resumed pass); the others always start at the beginning.
        """
        raise NotImplementedError

    def positions(self) -> int | None:
        """``n`` when this source yields exactly ``0, 1, ..., n - 1`` (and can start
        anywhere in them, cheaply); ``None`` for other sources."""
        return None

    def length(self) -> int | None:
        """The number of items per epoch, or ``None`` when it can't be known up front."""
        return None

    def describe(self) -> str:
        """The source's repr inside a loader's repr."""
        return f"{self.name}()"

    def close(self) -> None:
        """Release anything the source holds across epochs (nothing, for most sources)."""


class Loader(Generic[Out]):
    """A source followed by stages: re-iterable, epoch-aware, sized when it can be.

    Every ``iter()`` rebuilds the chain of generators and starts the next epoch, so two plain
    passes over a shuffled loader see two different orders (as with torch's ``DataLoader``);
    :meth:`set_epoch` chooses the epoch of the next pass. Build one with a source and ``|``.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.indices(5) | pf.batch(2)
        >>> loader
        indices(5) | batch(size=2, drop_last=False)
        >>> len(loader)
        3
        >>> list(loader)
        [[0, 1], [2, 3], [4]]
        >>> shuffled = pf.indices(5) | pf.shuffle(seed=0)
        >>> list(shuffled) != list(shuffled)  # a new permutation each epoch
        True
        >>> shuffled.set_epoch(0)
        >>> list(shuffled) == list(pf.indices(5) | pf.shuffle(seed=0))
        True
    """

    __slots__ = (
        "__weakref__",
        "_active",
        "_epoch",
        "_next",
        "_next_epoch",
        "_progress",
        "_record",
        "_recording",
        "_resources",
        "_source",
        "_stages",
    )

    def __init__(self, source: Source[Any], stages: tuple[Stage[Any, Any], ...] = ()) -> None:
        if not isinstance(source, Source):
            msg = f"a loader starts with a pipeflow source (got {type(source).__name__})"
            raise TypeError(msg)
        self._source = source
        self._stages = tuple(s for st in stages for s in st.stages)
        self._next_epoch = 0
        self._next: dict[str, Any] = {}  # where the next pass starts, when resuming
        self._epoch: int | None = None
        self._progress: Progress | None = None
        self._record: LoaderRecord | None = None
        self._recording = True
        self._active: weakref.WeakSet[Iterator[Any]] = weakref.WeakSet()
        # What stages keep across passes (persistent worker pools), by stage position: they
        # belong to this loader's runs, not to the stages, which stay immutable recipes.
        self._resources: dict[int, dict[Any, Any]] = {}
        weakref.finalize(self, _close_resources, self._resources)

    # -- structure --------------------------------------------------------------------------
    @property
    def source(self) -> Source[Any]:
        """The source the items come from."""
        return self._source

    @property
    def stages(self) -> tuple[Stage[Any, Any], ...]:
        """The flat tuple of stages after the source, in order."""
        return self._stages

    @overload
    def __or__(self, other: Stage[Out, T]) -> Loader[T]: ...
    @overload
    def __or__(self, other: object) -> Any: ...
    def __or__(self, other: object) -> Any:
        if isinstance(other, Stage):
            return Loader(self._source, (*self._stages, *other.stages))
        return NotImplemented

    def __repr__(self) -> str:
        return " | ".join([self._source.describe(), *(repr(s) for s in self._stages)])

    def __reduce__(self) -> tuple[Any, ...]:
        return (Loader, (self._source, self._stages))

    # -- epochs -----------------------------------------------------------------------------
    @property
    def epoch(self) -> int:
        """The epoch of the pass in progress (or the last one started; before any, the next)."""
        return self._next_epoch if self._epoch is None else self._epoch

    def set_epoch(self, epoch: int) -> None:
        """Make the next pass epoch *epoch*.

        Raises:
            ValueError: if *epoch* is negative.
        """
        self._next_epoch = _checks.integer("set_epoch", "epoch", epoch, low=0)
        self._next = {}
        if self._progress is not None:
            self._progress.superseded = True

    def __len__(self) -> int:
        n = self._source.length()
        if n is None:
            msg = f"this loader has no length: its source {self._source.describe()} has none"
            raise TypeError(msg)
        for s in self._stages:
            out = s.length(n)
            if out is None:
                msg = (
                    f"this loader has no length: stage {s.name!r} changes the number of items "
                    "by an amount that is only known by running it"
                )
                raise TypeError(msg)
            n = out
        return n

    def __iter__(self) -> Iterator[Out]:
        return self.start()

    def start(self, *, base_seed: int | Callable[[], int] | None = None) -> Iterator[Out]:
        """Start the next pass, like ``iter(loader)``, choosing the workers' base seed."""
        epoch = self._next_epoch
        resume, self._next = self._next, {}
        self._next_epoch = epoch + 1
        self._epoch = epoch
        progress = Progress(epoch, resume.get("position", 0))
        if self._progress is not None:
            self._progress.superseded = True
        self._progress = progress
        if self._record is None:
            self._record = LoaderRecord([self._source.name, *(s.name for s in self._stages)])
        record = self._record if self._recording else None
        it = run(
            self._source,
            self._stages,
            epoch=epoch,
            base_seed=base_seed,
            resume=resume,
            progress=progress,
            record=record,
            resources=self._resources,
        )
        self._active.add(it)
        return it

    # -- statistics -------------------------------------------------------------------------
    def stats(self) -> Stats:
        """Per-stage counts and times since the loader was built, and the bottleneck.

        ``print(loader.stats())`` shows a table; the returned :class:`~pipeflow.stats.Stats`
        holds the same numbers as data (``.to_dict()`` for JSON), and ``.plot(path)`` draws
        them.
        """
        from pipeflow.stats import summarize

        if self._record is None:
            self._record = LoaderRecord([self._source.name, *(s.name for s in self._stages)])
        return summarize(self._record)

    def reset_stats(self) -> None:
        """Start the statistics afresh (say, after a warm-up epoch)."""
        self._record = None

    def set_stats(self, enabled: bool) -> None:
        """Turn the recording of statistics on or off for the next passes (on by default;
        it counts every item and times a sample of them)."""
        self._recording = bool(enabled)

    # -- resumption -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as a small JSON-serialisable dict.

        Take it at any point — between epochs, mid-epoch, with workers running — and give it
        to :meth:`load_state_dict` on a freshly built, identical loader: its next pass yields
        exactly the rest of this epoch, then the following epochs, as if never interrupted.
        Starts no worker. See :mod:`pipeflow.state` for what is recorded.
        """
        return take(
            self._source,
            self._stages,
            self._length(),
            self._progress,
            (self._next_epoch, self._next),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume where *state* (from :meth:`state_dict`) was taken.

        Raises:
            ValueError: if *state* comes from a different pipeline (another source length,
                stage list, batch size, seed...), naming what differs.
        """
        self._next = check(self._source, self._stages, self._length(), state)
        self._next_epoch = state["epoch"]
        if self._progress is not None:
            self._progress.superseded = True

    def _length(self) -> int | None:
        try:
            return len(self)
        except TypeError:
            return None

    # -- resources --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every pass in progress and release what the stages hold."""
        for it in list(self._active):
            it.close()  # type: ignore[attr-defined]
        self._active.clear()
        self._source.close()
        for s in self._stages:
            s.close()
        _close_resources(self._resources)

    def __enter__(self) -> Loader[Out]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_resources(resources: dict[int, dict[Any, Any]]) -> None:
    for kept in resources.values():
        for thing in list(kept.values()):
            thing.close()
        kept.clear()
