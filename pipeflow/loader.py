"""The loader object: a source and its stages, re-iterable epoch after epoch."""

from __future__ import annotations

import itertools
import time
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar, overload

from pipeflow._stage import Stage
from pipeflow.errors import annotate
from pipeflow.stats import LoaderRecord, StageRecord, Stats

__all__ = ["Context", "Loader", "Source"]

T = TypeVar("T")
Out = TypeVar("Out", covariant=True)


@dataclass(frozen=True)
class Context:
    """What a pass of the loader tells its stages.

    Attributes:
        epoch: the epoch of this pass.
        base_seed: a seed for this pass's workers chosen by the caller, or a function that
            returns it (the DataLoader facade draws it from its ``generator``, as torch does);
            ``None`` lets stages derive one from their own seed and the epoch.
    """

    epoch: int
    base_seed: int | Callable[[], int] | None = None
    #: How many items before this stage's first input the pass skipped (a resumed pass
    #: starts mid-epoch): a stage that numbers its items starts counting here.
    offset: int = 0
    #: This stage's position in the loader (set per stage).
    stage_index: int = -1
    #: What out-of-order stages record during the pass, by stage position.
    records: dict[int, Any] = field(default_factory=dict)
    #: What resuming tells out-of-order stages, by stage position.
    resume: dict[int, Any] = field(default_factory=dict)
    #: Where this stage's statistics go (a :class:`pipeflow.stats.StageRecord`).
    record: Any = None
    #: The number of items the loader yields per epoch, when known (for progress bars).
    length: int | None = None
    #: How many items each stage yields per epoch (index 0: the source), when known.
    lengths: tuple[int | None, ...] = ()


class Source(Generic[Out]):
    """Where items enter a pipeline. Subclasses implement :meth:`iterate` and :meth:`length`."""

    name: str = "source"

    def iterate(self, context: Context) -> Iterator[Out]:
        """Return a fresh iterator over this epoch's items."""
        raise NotImplementedError

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
        self._progress: _Progress | None = None
        self._record: LoaderRecord | None = None
        self._recording = True
        self._active: weakref.WeakSet[Iterator[Any]] = weakref.WeakSet()

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
        if isinstance(epoch, bool) or not isinstance(epoch, int) or epoch < 0:
            msg = f"epoch must be an integer of at least 0 (got {epoch!r})"
            raise ValueError(msg)
        self._next_epoch = epoch
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
        lengths = [self._source.length()]
        for s in self._stages:
            n = lengths[-1]
            lengths.append(None if n is None else s.length(n))
        context = Context(
            epoch=epoch,
            base_seed=base_seed,
            resume=resume.get("stages", {}),
            length=lengths[-1],
            lengths=tuple(lengths),
        )
        progress = _Progress(epoch, resume.get("position", 0), context.records)
        if self._progress is not None:
            self._progress.superseded = True
        self._progress = progress
        if self._record is None:
            self._record = LoaderRecord([self._source.name, *(s.name for s in self._stages)])
        record = self._record if self._recording else None
        it = _run(self._source, self._stages, context, progress, record)
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
        it costs two clock reads per item per stage)."""
        self._recording = bool(enabled)

    # -- resumption -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Where this loader stands, as a small JSON-serialisable dict.

        Take it at any point — between epochs, mid-epoch, with workers running — and give it
        to :meth:`load_state_dict` on a freshly built, identical loader: its next pass yields
        exactly the rest of this epoch, then the following epochs, as if never interrupted.
        Starts no worker. See :mod:`pipeflow.state` for what is recorded.
        """
        from pipeflow.state import take

        return take(self, self._progress)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume where *state* (from :meth:`state_dict`) was taken.

        Raises:
            ValueError: if *state* comes from a different pipeline (another source length,
                stage list, batch size, seed...), naming what differs.
        """
        from pipeflow.state import check, stage_positions

        check(self, state)
        self._next_epoch = state["epoch"]
        self._next = {
            "position": state["position"],
            "stages": stage_positions(self, state.get("stages", {})),
        }
        if self._progress is not None:
            self._progress.superseded = True

    # -- resources --------------------------------------------------------------------------
    def close(self) -> None:
        """Stop every pass in progress and release what the stages hold."""
        for it in list(self._active):
            it.close()  # type: ignore[attr-defined]
        self._active.clear()
        self._source.close()
        for s in self._stages:
            s.close()

    def __enter__(self) -> Loader[Out]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Progress:
    """One pass, as resumption sees it: its epoch, where it started, what it delivered."""

    __slots__ = ("delivered", "done", "epoch", "records", "start", "superseded")

    def __init__(self, epoch: int, start: int, records: dict[int, Any]) -> None:
        self.epoch = epoch
        self.start = start  # outputs of this epoch skipped (a resumed pass)
        self.delivered = 0  # outputs yielded by this pass
        self.done = False
        self.superseded = False  # set_epoch / load_state_dict / a newer pass came after it
        self.records = records


def skip_plan(stages: tuple[Stage[Any, Any], ...], position: int) -> tuple[int, int]:
    """Where to skip *position* consumed outputs: ``(boundary, count)``.

    Skipping *count* items right after stage ``boundary - 1`` (``boundary`` 0: straight out
    of the source) skips exactly the first *position* outputs, and every stage from
    ``boundary`` on is a map or a batch, so nothing consumed is fetched, decoded or collated
    again. Stages before the boundary (a shuffle, a filter) replay the consumed items.
    """
    count = position
    for i in range(len(stages) - 1, -1, -1):
        inputs = stages[i].skipped_inputs(count)
        if inputs is None:
            return i + 1, count
        count = inputs
    return 0, count


def _run(
    source: Source[Any],
    stages: tuple[Stage[Any, Any], ...],
    context: Context,
    progress: _Progress | None = None,
    record: LoaderRecord | None = None,
) -> Iterator[Any]:
    """One epoch: build the chain of iterators now (as torch does at ``iter()``), drive it later."""
    chain: list[Iterator[Any]] = []
    name = source.name
    boundary, skip = 0, 0
    if context.resume:  # an out-of-order stage says what to skip below it
        index = min(context.resume)
        boundary, skip = skip_plan(stages[:index], context.resume[index]["prefix"])
    elif progress is not None and progress.start:
        boundary, skip = skip_plan(stages, progress.start)
    offset = 0  # items skipped before the current stage's input
    try:
        recs = record.stages if record is not None else [None] * (len(stages) + 1)
        it: Iterator[Any] = source.iterate(context)
        if boundary == 0 and skip:
            it, offset = itertools.islice(it, skip, None), skip
        chain.append(_watch(it, name, context, None, recs[0]))
        fetched: list[Any] | None = None
        for i, s in enumerate(stages):
            name = s.name
            upstream = chain[-1]
            if name == "fetch":  # remember what it fetched: the next stage's errors name it
                keys: list[Any] = [None]
                upstream = _remember(upstream, keys)
            it = s.apply(
                upstream, replace(context, offset=offset, stage_index=i, record=recs[i + 1])
            )
            if offset:  # the outputs this stage did not make because of the skip below it
                offset = offset if s.length(offset) is None else s.length(offset) or 0
            if boundary == i + 1 and skip:
                it, offset = itertools.islice(it, skip, None), skip
            chain.append(_watch(it, name, context, fetched, recs[i + 1]))
            fetched = keys if name == "fetch" else None
    except Exception as e:
        annotate(e, name, context.epoch)
        _close_all(chain)
        raise
    return _drive(chain, progress, record)


def _drive(
    chain: list[Iterator[Any]], progress: _Progress | None, record: LoaderRecord | None
) -> Iterator[Any]:
    if progress is None:
        try:
            yield from chain[-1]
        finally:
            _close_all(chain)
        return
    if record is None:  # statistics off: count what is delivered, for state_dict()
        try:
            for item in chain[-1]:
                progress.delivered += 1
                yield item
            progress.done = True
        finally:
            _close_all(chain)
        return
    clock = time.perf_counter_ns
    record.passes += 1
    waits = record.waits.append
    it = chain[-1]
    start = t = clock()
    try:
        for item in it:
            now = clock()
            waits(now - t)
            progress.delivered += 1
            yield item
            t = clock()
        waits(clock() - t)
        progress.done = True
    finally:
        record.wall_ns += clock() - start
        _close_all(chain)


def _close_all(chain: list[Iterator[Any]]) -> None:
    for link in reversed(chain):
        close = getattr(link, "close", None)
        if close is not None:
            close()


def _watch(
    it: Iterator[Any],
    name: str,
    context: Context,
    fetched: list[Any] | None = None,
    rec: StageRecord | None = None,
) -> Iterator[Any]:
    """Pass items through, timing the stage and naming it in any exception it starts.

    Right after a ``fetch``, *fetched* holds the key it fetched last: the note then names the
    sample indices of the batch that failed (a collate of ragged samples, say).
    """
    n = 0
    clock = time.perf_counter_ns
    try:
        if rec is None:
            for item in it:
                n += 1
                yield item
            return
        # Counted in locals, written to the record every 50 ms and at the end: the record is
        # at most 50 ms behind, and an item costs two clock reads and two additions.
        busy = 0
        flushed = n
        t = clock()
        next_flush = t + 50_000_000
        try:
            for item in it:
                now = clock()
                busy += now - t
                n += 1
                if now >= next_flush:
                    rec.busy_ns += busy
                    rec.items += n - flushed
                    busy, flushed, next_flush = 0, n, now + 50_000_000
                    rec.sample(now)
                yield item
                t = clock()
            now = clock()
            busy += now - t
        finally:
            rec.busy_ns += busy
            rec.items += n - flushed
            rec.sample(clock())
    except Exception as e:
        key = fetched[0] if fetched is not None else None
        if type(key) is list:
            annotate(e, name, context.epoch, batch=key)
        elif key is not None:
            annotate(e, name, context.epoch, index=key)
        else:
            annotate(e, name, context.epoch, item=n)
        raise


def _remember(keys: Iterator[Any], cell: list[Any]) -> Iterator[Any]:
    for key in keys:
        cell[0] = key
        yield key
