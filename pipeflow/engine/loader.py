"""The loader object: a source and its stages, re-iterable epoch after epoch."""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Iterator, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pipeflow import _checks
from pipeflow._hints import not_an_iterator, operand_error, unread_indices, warn_unread
from pipeflow._random import DrawnSeed
from pipeflow.engine._chain import run
from pipeflow.engine._context import Context
from pipeflow.engine._layout import layout
from pipeflow.engine._memo import Home, has_memo, release, tallies
from pipeflow.engine._memo import check as check_memo
from pipeflow.engine._plan import PassPlan, plan
from pipeflow.engine._stage import Source, Stage, or_stranger
from pipeflow.resume._check import Loaded, check_loader, length
from pipeflow.resume._seeds import Seeded, replaced, slots
from pipeflow.resume.state import Progress, flat_index, light, reread_after_unordered, take
from pipeflow.stats import LoaderRecord, Stats

__all__ = ["Context", "Loader", "Source"]

T = TypeVar("T")
Out = TypeVar("Out", covariant=True)

_WIDTH = 88  # a stage's line in a loader's repr longer than this is opened up


class Loader(Seeded, Generic[Out]):
    """A source followed by stages: re-iterable, epoch-aware, sized when it can be.

    Every ``iter()`` rebuilds the chain of generators and starts the next epoch, so two plain
    passes over a shuffled loader see two different orders (as with torch's ``DataLoader``);
    :meth:`set_epoch` chooses the epoch of the next pass. Build one with a source and ``|``.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.indices(5) | pf.batch(2)
        >>> loader
        indices(5)
        | batch(size=2, drop_last=False)
        # computed as one source: indices → batch
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
        "_home",
        "_next",
        "_next_epoch",
        "_plan",
        "_progress",
        "_record",
        "_recording",
        "_resources",
        "_source",
        "_stages",
        "_unread",
    )

    def __init__(self, source: Source[Any], stages: tuple[Stage[Any, Any], ...] = ()) -> None:
        if not isinstance(source, Source):
            msg = (
                f"Loader: source must be a pipeflow source (got {type(source).__name__}); "
                "start from pf.indices, pf.from_iterable or pf.from_sampler"
            )
            raise TypeError(msg)
        self._source = source
        self._stages = _flat_stages(stages)
        why = reread_after_unordered(self._stages)
        if why is not None:  # refused now, not at the job's first checkpoint
            raise ValueError(f"Loader: {why}")
        check_memo(self._stages)  # a cache that would freeze random draws: refused now
        self._home: Home | None = None  # where its caches live, once a pass needs them
        # Whether its items can only be a dataset's indices, unread (pf.fetch forgotten): the
        # first item of a pass is then checked, until one warns (see _hints.unread_indices).
        self._unread = unread_indices(source, self._stages)
        self._next_epoch = 0
        self._next: dict[str, Any] = {}  # where the next pass starts, when resuming
        self._epoch: int | None = None
        self._progress: Progress | None = None
        self._record: LoaderRecord | None = None
        self._recording = True
        self._plan: PassPlan | None = None
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
        return or_stranger(self, other)  # Python would only name the two types

    def __ror__(self, other: object) -> Any:
        # Reached when the left operand's own `|` declined: a stage (a source after a stage)
        # or data, which never enters through `|`; the message says where it goes.
        if isinstance(other, Stage):
            raise operand_error(other, self)
        raise operand_error(other, self, stranger="left")

    #: A numpy array on the left of ``|`` leaves the operator to the loader (which refuses
    #: it, saying how data enters) instead of broadcasting it over its elements.
    __array_ufunc__ = None

    def plan(self) -> PassPlan:
        """What this loader's passes run: the planning step's answer (:mod:`pipeflow.engine._plan`).

        The longest prefix of the pipeline that can be computed instead of run (``indices``,
        a full ``shuffle``, ``shard``, ``batch``) becomes one source; ``str()`` of the plan
        lists what runs.

        Examples:
            >>> import pipeflow as pf
            >>> loader = pf.indices(10) | pf.shuffle(seed=0) | pf.batch(4) | pf.map(len)
            >>> print(loader.plan())
            source: indices(10) → shuffle(seed=0) → batch(size=4, drop_last=False)
            stage: map(fn=len)
            (2 of the loader's stages computed by the source)
            >>> loader.plan().names()
            ['indices → shuffle → batch (computed)', 'map']
        """
        if self._plan is None:
            self._plan = plan(self._source, self._stages)
        return self._plan

    def __repr__(self) -> str:
        text = layout([self._source.describe(), *(repr(s) for s in self._stages)], _WIDTH)
        notes = [self.plan().note(), *self._sized()]
        return "\n# ".join([text, *filter(None, notes)])

    def _sized(self) -> list[str]:
        """What each ``workers="auto"`` stage chose once it ran, a line each
        (``parallel_map: auto: 2 processes (the budget: 2 CPUs)``)."""
        names = [self._source.name, *(s.name for s in self._stages)]
        out = []
        for at in sorted(self._resources):
            tuner = self._resources[at].get("auto")
            if tuner is not None:
                name = names[at + 1] if 0 <= at + 1 < len(names) else "parallel stage"
                out.append(f"{name}: {tuner.text()}")
        return out

    def __reduce__(self) -> tuple[Any, ...]:
        return (Loader, (self._source, self._stages))

    # -- seeds (see pipeflow.resume._seeds) -------------------------------------------------
    def seed_slots(self) -> list[tuple[str, int]]:
        """Every seed of the pipeline (the source's, then each stage's), in order."""
        return slots([self._source, *self._stages])

    def with_seeds(self, seeds: Iterator[int]) -> Loader[Out]:
        """A new loader of the same pipeline, its seeds taken in order from *seeds* (a
        recipe: for a loader nested in a stage, such as ``parallel_source``'s)."""
        source, *stages = replaced([self._source, *self._stages], seeds)
        if source is self._source and all(a is b for a, b in zip(stages, self._stages)):
            return self
        return Loader(source, tuple(stages))

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

    if not TYPE_CHECKING:  # at run time only: to type checkers a loader is no Iterator

        def __next__(self):
            """``next(loader)``: refused, saying to call ``iter(loader)`` first (Python's
            own words would be "'Loader' object is not an iterator")."""
            raise not_an_iterator(self)

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
        record = self._stats_record() if self._recording else None
        context = Context(epoch, base_seed=base_seed, facts=self._facts())
        first = self._check_first if self._unread else None
        it = run(self.plan(), context, resume, progress, record, self._resources, first)
        self._active.add(it)
        return it

    def _facts(self) -> Mapping[str, Any]:
        """What the loader tells every stage of a pass: where its caches live, if it has any
        (its own, its workers')."""
        if not has_memo(self._stages):
            return MappingProxyType({})
        if self._home is None:
            self._home = Home.new(self._source.length())
            weakref.finalize(self, release, self._home)
        return MappingProxyType({"memo": self._home})

    def _check_first(self, item: Any) -> None:
        """Look at the first item of a pass of a loader whose items can only be a dataset's
        indices: warn that ``pf.fetch`` is missing (once; the items after it go unchecked)."""
        if self._unread and warn_unread(self._source, item):
            self._unread = False

    # -- statistics -------------------------------------------------------------------------
    def stats(self) -> Stats:
        """Per-stage counts and times since the loader was built, and the bottleneck.

        ``print(loader.stats())`` shows a table; the returned :class:`~pipeflow.stats.Stats`
        holds the same numbers as data (``.to_dict()`` for JSON), and ``.plot(path)`` draws
        them.
        """
        from pipeflow.stats import summarize, with_caches

        stats = summarize(self._stats_record())
        if self._home is None:
            return stats
        planned = self.plan()
        counts = tallies(planned.stages, self._home, planned.fused)  # in every process
        return with_caches(stats, {i + 1: c for i, c in counts.items()})

    def _stats_record(self) -> LoaderRecord:
        """Where the passes record statistics: one row per node of the plan."""
        if self._record is None:
            self._record = LoaderRecord(self.plan().names())
        return self._record

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
            length(self),
            self._progress,
            (self._next_epoch, self._next),
        )

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Make the next pass resume where *state* (from :meth:`state_dict`) was taken.

        Everything is checked before anything changes: a refused state leaves the loader as
        it was. Seeds this loader drew itself (a stage built with ``seed=None``) take the
        state's, so a loader built afresh by the same code, in a new process, resumes.

        Raises:
            ValueError: if *state* is malformed, or comes from a different pipeline (another
                source length, stage list, batch size, seed the user gave...), naming the key
                or the setting.
        """
        self._apply(check_loader(self, state))

    def _apply(self, loaded: Loaded) -> None:
        """Apply a checked state (the second half of :meth:`load_state_dict`)."""
        self._adopt(loaded.seeds)
        # Workers kept between passes hold what ran before (their generators, their copies
        # of the dataset): the resumed pass starts new ones, restored from the state.
        _close_resources(self._resources)
        self._next = loaded.resume
        self._next_epoch = loaded.epoch
        if self._progress is not None:
            self._progress.superseded = True

    def _adopt(self, seeds: list[int]) -> None:
        """Take *seeds* (in :meth:`seed_slots` order) for the seeds this loader drew."""
        mine = self.seed_slots()
        if all(int(a) == b for (_, a), b in zip(mine, seeds)):
            return
        values = iter(
            DrawnSeed(t) if isinstance(s, DrawnSeed) else s for (_, s), t in zip(mine, seeds)
        )
        source, *stages = replaced([self._source, *self._stages], values)
        self.close()  # what ran on the old seeds (kept worker pools) stops
        self._source, self._stages, self._plan = source, tuple(stages), None

    def pass_record(self, delivered: int | None = None) -> dict[str, Any] | None:
        """Where the pass in progress stands, without the pipeline's identity (a worker's
        replica reports it; see :func:`pipeflow.state.light`); as of *delivered* of its
        outputs when given (a loader read by another source, ``mix``, whose own consumer
        may stand behind it)."""
        progress = self._progress
        if delivered is not None and progress is not None and not progress.done:
            progress = copy.copy(progress)
            progress.delivered = delivered - progress.start
        return light(self._source, self._stages, progress)

    def resume_from(self, epoch: int, record: dict[str, Any]) -> None:
        """Make the next pass epoch *epoch*, resumed where *record* (a :meth:`pass_record`
        of this same pipeline, checked already) says."""
        by_flat = {flat_index(self._stages, i): i for i in range(len(self._stages))}
        stages = {by_flat[int(k)]: v for k, v in record.get("stages", {}).items()}
        self._next = {"position": record.get("position", 0), "stages": stages}
        if record.get("source") is not None:
            self._next["source"] = record["source"]
        self._next_epoch = epoch

    # -- resources --------------------------------------------------------------------------
    @property
    def resources(self) -> Mapping[int, Mapping[Any, Any]]:
        """What the stages keep across passes (persistent worker pools), by stage position
        (``-1``: the source), as a live read-only view; :meth:`close` releases it."""
        return MappingProxyType(self._resources)

    def close(self) -> None:
        """Stop every pass in progress and release what the stages hold."""
        for it in list(self._active):
            it.close()  # type: ignore[attr-defined]
        self._active.clear()
        self._source.close()
        for s in self._stages:
            s.close()
        _close_resources(self._resources)
        if self._home is not None:  # the caches go: a later pass starts them afresh
            release(self._home)
            self._home = None

    def __enter__(self) -> Loader[Out]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _close_resources(resources: dict[int, dict[Any, Any]]) -> None:
    for kept in resources.values():
        for thing in list(kept.values()):
            thing.close()
        kept.clear()


def _flat_stages(stages: Any) -> tuple[Stage[Any, Any], ...]:
    """*stages* (a tuple or list of stages, each maybe a pipeline of them), flattened."""
    if not isinstance(stages, (tuple, list)) or not all(isinstance(s, Stage) for s in stages):
        shown = (
            type(stages).__name__
            if not isinstance(stages, (tuple, list))
            else (", ".join(type(s).__name__ for s in stages if not isinstance(s, Stage)))
        )
        msg = f"Loader: stages must be a tuple of pipeflow stages (got {shown})"
        raise TypeError(msg)
    return tuple(s for st in stages for s in st.stages)
