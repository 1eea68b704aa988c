"""The two protocols of a pipeline: :class:`Source`, where items enter, and :class:`Stage`.

A :class:`Stage` is an immutable recipe. Calling :meth:`Stage.apply` on an upstream iterator
returns a *fresh* iterator; nothing runs until that iterator is consumed. Two stages compose with
``|`` into a :class:`Stage` that holds the flat tuple of both, so composition is associative.
A :class:`Source` makes a fresh iterator of one epoch's items for every pass.
"""

from __future__ import annotations

import inspect
import reprlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any, Generic, Literal, TypeVar, overload

from pipeflow._hints import not_iterable, operand_error, pipeflow_kind
from pipeflow.engine._context import Context, Hooks
from pipeflow.resume._seeds import Seeded, config_slots, config_with_seeds
from pipeflow.resume.state import Rule

__all__ = ["Pipe", "Source", "Stage", "Traits", "or_stranger"]

In = TypeVar("In", contravariant=True)
Out = TypeVar("Out", covariant=True)
T = TypeVar("T")

#: How a stage changes the number of items: ``"same"`` (one out per one in), ``None`` (unknown
#: before running), or a function of the upstream count and the stage's configuration.
LengthRule = Literal["same"] | Callable[..., int] | None

_repr = reprlib.Repr()
_repr.maxstring = 40
_repr.maxother = 40
_repr.maxlist = 6


def _short(value: Any) -> str:
    """A readable, bounded repr of one configuration value."""
    if isinstance(value, Stage):
        return repr(value)  # nested stages in full
    if callable(value) and hasattr(value, "__qualname__"):
        return str(value.__qualname__)
    text = repr(value)
    if " object at 0x" in text:
        return f"<{type(value).__qualname__}>"  # the class, not a truncated address
    return text if len(text) <= 60 else _repr.repr(value)


#: The methods through which a stage answered the loader before it declared the answers as
#: data (its :class:`~pipeflow.state.Rule` and its :class:`Traits`), and what replaces each: a
#: subclass that still defines one is refused, so that its override is not silently ignored.
_GONE = {
    **dict.fromkeys(
        ("resumption", "new_record", "check_record", "identity", "reads_ahead"),
        "a stage declares how it resumes once, as data (Stage(..., skip=...) or "
        "resume=pipeflow.state.Rule(...)), and its function gets its record as its 'record' "
        "keyword",
    ),
    "computed": "declare it as traits=pipeflow.Traits(compute=...)",
    "context_after": "declare it as traits=pipeflow.Traits(publish=...)",
    "drops_failures": "declare it as traits=pipeflow.Traits(drops=...)",
    "without_torch": "declare it as traits=pipeflow.Traits(numpy=...)",
    "failures": "declare it as Stage(..., failures=...)",
    "dataset": "declare it as Stage(..., dataset=...)",
    "reads_in_runs": "declare it as traits=pipeflow.Traits(reads_in_runs=True)",
}


@dataclass(frozen=True)
class Traits:
    """What the engine knows of a stage besides its function, its length and its rule,
    declared once, as data. Most stages have the defaults; the functions get the stage's
    configuration as keywords.

    Attributes:
        failures: how the stage meets failed items (see :mod:`pipeflow.engine._failure`):
            ``"bypass"`` (the default: it never sees them; they go around it, out before its
            next item), ``"mark"`` (it never sees them, but yields failures of its own as
            values: ``fetch`` marks a failed sample), or ``"pass"`` (it gets them in its
            input and passes them on in order, or drops them: ``parallel_map``,
            ``pin_memory``, ``ignore_errors``).
        dataset: the dataset this stage reads by key (``fetch``): errors in the stages
            after it name the sample indices, and workers report it in ``WorkerInfo``.
        drops: the exception types whose failed items this stage drops
            (``ignore_errors``).
        reads_in_runs: whether the stage takes its input in runs (a parallel stage): right
            after a source whose iterator knows what it has left, it reads that iterator
            directly, unwatched, and the source's row in ``stats()`` counts what it took
            (see :mod:`pipeflow.engine._plan`).
        compute: ``compute(upstream, **config)``, the stage's output as the planning step
            computes it when its input is *upstream* (a description from
            :mod:`pipeflow.engine._plan`, such as ``Positions``), or ``None`` to run on its items;
            only pipeflow's own index stages (``shuffle``, ``shard``, ``batch``) compute.
        publish: ``publish(context, **config)``, the context the next stage sees, for a
            stage that publishes ``facts`` for the stages after it (a ``shard`` says how it
            numbers its outputs); ``None``: unchanged.
        numpy: ``numpy(**config)``, this stage as a worker that has not imported torch
            should run it (a numpy-only form that makes the tensors on arrival); ``None``:
            the same stage.
        memo: ``memo(segment, home, slot, **config)``, the store of a stage that keeps
            what the one-to-one stages right above it (its *segment*) made of each input
            (``cache``): the engine runs the segment only on the inputs the store lacks (see
            :mod:`pipeflow.engine._memo`); ``None`` for the other stages.

    Examples:
        >>> from pipeflow import Stage, Traits
        >>> Stage(lambda items: iter(items), "keep", traits=Traits(failures="pass")).traits
        Traits(failures='pass')
    """

    failures: Literal["bypass", "mark", "pass"] = "bypass"
    dataset: Any = None
    drops: tuple[type[BaseException], ...] = ()
    reads_in_runs: bool = False
    compute: Callable[..., Any] | None = None
    publish: Callable[..., Context] | None = None
    numpy: Callable[..., Stage[Any, Any]] | None = None
    memo: Callable[..., Any] | None = None

    def __repr__(self) -> str:
        changed = [
            f"{k}={_short(v)}" if callable(v) else f"{k}={v!r}"
            for k, v in vars(self).items()
            if not _same(v, _PLAIN_VALUES[k])
        ]
        return f"Traits({', '.join(changed)})"


#: The defaults of :class:`Traits`' fields, which its repr leaves out.
_PLAIN_VALUES = {f.name: f.default for f in fields(Traits)}
_PLAIN = Traits()


class Stage(Seeded, Generic[In, Out]):
    """A pipeline stage: a generator function and its frozen configuration.

    Most users never build a :class:`Stage` by hand: the factories (:func:`pipeflow.stages.batch`,
    :func:`pipeflow.map`, ...) and the :func:`stage` decorator return them.

    Args:
        fn: ``fn(upstream, **config)`` returning an iterator. When *fn* has a keyword-only
            parameter named ``epoch``, the loader passes the current epoch.
        name: the name shown in reprs, errors and statistics.
        config: the keyword configuration, already validated.
        length: how the stage changes the number of items (see ``LengthRule``).
        skip: when resuming skips this stage's first ``k`` outputs by skipping its first
            ``skip(k)`` inputs: ``"same"`` for a map, a function of ``k`` and the
            configuration for a batch, ``None`` (replay them) otherwise: the stage's
            :attr:`resume` rule, ``Rule.below(skip)`` or ``Rule.replay()``.
        resume: the stage's rule, given whole (instead of *skip*): a
            :class:`~pipeflow.state.Rule` that seeks, or keeps a record of each pass. The
            stage function gets what the loader keeps for it by declaring keyword-only
            parameters, as it gets ``context``: ``record`` (the pass's record, begun by the
            rule's record class), ``stats`` (its statistics' row, or ``None``), ``resources``
            (what it keeps across passes, by key) and ``delivered`` (the numbers of the
            items an out-of-order stage delivered before the pass resumed).
        dataset: shorthand for ``Traits(dataset=...)``: the dataset this stage reads by key.
        failures: shorthand for ``Traits(failures=...)``: how the stage meets failed items.
        compute: shorthand for ``Traits(compute=...)``: the stage's answer to the planning
            step.
        traits: what else the engine knows of the stage, whole (see :class:`Traits`);
            the three shorthands above replace their fields in it.

    Examples:
        >>> from pipeflow import from_iterable, stage
        >>> @stage(length="same")
        ... def double(items):
        ...     for x in items:
        ...         yield 2 * x
        ...
        >>> double()
        double()
        >>> list(from_iterable([1, 2, 3]) | double() | double())
        [4, 8, 12]
    """

    __slots__ = (
        "_config",
        "_factory",
        "_fn",
        "_length",
        "_name",
        "_resume",
        "_traits",
        "_wants",
    )

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        gone = sorted(set(vars(cls)) & set(_GONE))
        if gone:
            msg = (
                f"{cls.__qualname__} defines {gone[0]}, which pipeflow no longer asks a stage: "
                f"{_GONE[gone[0]]}; see the reference page 'Your own stages'"
            )
            raise TypeError(msg)

    def __init__(
        self,
        fn: Callable[..., Iterator[Any]],
        name: str,
        config: Mapping[str, Any] | None = None,
        *,
        length: LengthRule = None,
        skip: LengthRule = None,
        factory: Callable[..., Stage[Any, Any]] | None = None,
        dataset: Any = None,
        failures: Literal["bypass", "mark", "pass"] | None = None,
        compute: Callable[..., Any] | None = None,
        resume: Rule | None = None,
        traits: Traits = _PLAIN,
    ) -> None:
        if resume is None:
            resume = Rule.replay() if skip is None else Rule.below(skip)
        elif skip is not None:
            msg = f"stage {name!r}: give skip= or resume=, not both (got {skip!r} and {resume!r})"
            raise TypeError(msg)
        given = {"dataset": dataset, "failures": failures, "compute": compute}
        shorthands = {k: v for k, v in given.items() if v is not None}
        self._fn = fn
        self._traits = replace(traits, **shorthands) if shorthands else traits
        self._factory = factory
        self._resume = resume
        self._wants = tuple(k for k in _GIVEN if _takes_keyword(fn, k))
        self._name = name
        self._config: dict[str, Any] = dict(config or {})
        self._length = length  # set last: from here on the stage is frozen

    # -- the recipe -------------------------------------------------------------------------
    @property
    def name(self) -> str:
        """The stage's name, as shown in reprs, errors and statistics."""
        return self._name

    @property
    def config(self) -> Mapping[str, Any]:
        """A read-only view of the stage's configuration."""
        return dict(self._config)

    @property
    def stages(self) -> tuple[Stage[Any, Any], ...]:
        """The flat tuple of primitive stages this stage is made of (itself, here)."""
        return (self,)

    @property
    def traits(self) -> Traits:
        """What the engine knows of the stage besides its function (see :class:`Traits`)."""
        return self._traits

    @property
    def resume(self) -> Rule:
        """How a resumed pass skips this stage's first outputs (see :mod:`pipeflow.state`)."""
        return self._resume

    def apply(
        self, upstream: Iterable[Any], context: Context, hooks: Hooks | None = None
    ) -> Iterator[Out]:
        """Return a fresh iterator of this stage's output over *upstream*.

        *hooks* carries the loader's private handles (statistics, the pass's record, what
        the stage keeps across passes); the stage function gets those it declares as
        keyword-only parameters (see the class's text), as it gets ``context``.
        """
        wants = self._wants
        if not wants:
            extra: dict[str, Any] = {}
        elif wants == ("context",):  # the common case, per item in a worker: no lookups
            extra = {"context": context}
        else:
            extra = {k: _given(k, context, hooks) for k in wants}
        it = self._fn(upstream, **self._config, **extra)
        if not isinstance(it, Iterator):
            msg = (
                f"stage {self._name!r} must return an iterator, but its function returned "
                f"{type(it).__name__}; write it as a generator function (with `yield`)"
            )
            raise TypeError(msg)
        return it

    def length(self, n: int) -> int | None:
        """The number of items out for *n* items in, or ``None`` when it can't be known."""
        rule = self._length
        if rule is None:
            return None
        if rule == "same":
            return n
        return rule(n, **self._config)

    def close(self) -> None:
        """Release anything the stage holds across epochs (nothing, for most stages)."""

    # -- seeds (see pipeflow.resume._seeds) -------------------------------------------------
    def seed_slots(self) -> list[tuple[str, int]]:
        """Every seed in this stage's configuration, nested stages included, in order."""
        return config_slots(self._name, self._config)

    def with_seeds(self, seeds: Iterator[int]) -> Stage[In, Out]:
        """This stage with its seeds taken in order from *seeds* (as :meth:`seed_slots` lists
        them); itself when none changes."""
        config = config_with_seeds(self._config, seeds)
        if all(config[k] is self._config[k] for k in config):
            return self
        new = object.__new__(type(self))
        for cls in type(self).__mro__:
            for slot in getattr(cls, "__slots__", ()):
                if slot.startswith("_") and hasattr(self, slot):
                    object.__setattr__(new, slot, getattr(self, slot))
        object.__setattr__(new, "_config", config)
        return new

    # -- composition ------------------------------------------------------------------------
    @overload
    def __or__(self, other: Stage[Out, T]) -> Stage[In, T]: ...
    @overload
    def __or__(self, other: object) -> Any: ...
    def __or__(self, other: object) -> Any:
        if isinstance(other, Stage):
            return Pipe((*self.stages, *other.stages))
        return or_stranger(self, other)

    def __ror__(self, other: object) -> Any:
        # Only reached when the left operand is not a pipeflow object (sources and loaders
        # implement __or__ themselves) and its own `|` declined. Raw data never enters
        # through ``|``: the message says which source to start from.
        raise operand_error(other, self, stranger="left")

    #: A numpy array on the left of ``|`` leaves the operator to the stage (which refuses it,
    #: saying how data enters) instead of broadcasting it over its elements.
    __array_ufunc__ = None

    def __iter__(self) -> Iterator[Any]:
        # Defined only to say what to do: a stage is a recipe; a loader has the items.
        raise not_iterable(self)

    # -- value semantics --------------------------------------------------------------------
    def __repr__(self) -> str:
        args = ", ".join(f"{k}={_short(v)}" for k, v in self._config.items())
        return f"{self._name}({args})"

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Stage) or isinstance(other, Pipe):
            return NotImplemented
        return (
            self._fn is other._fn
            and self._name == other._name
            and self._config.keys() == other._config.keys()
            and all(_same(self._config[k], other._config[k]) for k in self._config)
        )

    def __hash__(self) -> int:
        return hash((self._fn, self._name, tuple(self._config)))

    def __setattr__(self, name: str, value: Any) -> None:
        if hasattr(self, "_length"):
            msg = f"stage {self._name!r} is immutable; build a new one instead"
            raise AttributeError(msg)
        object.__setattr__(self, name, value)

    def __reduce__(self) -> tuple[Any, ...]:
        if self._factory is not None:  # a @stage function: rebuilt by its factory
            return (_call_factory, (self._factory, self._config))
        state = (
            type(self),
            self._fn,
            self._name,
            self._config,
            self._length,
            self._resume,
            self._traits,
        )
        return (_rebuild, state)


def _call_factory(factory: Callable[..., Stage[Any, Any]], config: dict[str, Any]) -> Any:
    return factory(**config)


def _rebuild(
    cls: type[Stage[Any, Any]],
    fn: Callable[..., Iterator[Any]],
    name: str,
    config: dict[str, Any],
    length: LengthRule,
    resume: Rule,
    traits: Traits,
) -> Stage[Any, Any]:
    obj = cls.__new__(cls)
    Stage.__init__(obj, fn, name, config, length=length, resume=resume, traits=traits)
    return obj


def _same(a: Any, b: Any) -> bool:
    if a is b:
        return True
    try:
        return bool(a == b)
    except Exception:  # arrays and other objects without a boolean ==
        return False


class Pipe(Stage[In, Out]):
    """Stages composed with ``|``: a flat, associative sequence of primitive stages."""

    __slots__ = ("_stages",)
    _stages: tuple[Stage[Any, Any], ...]

    def __init__(self, stages: tuple[Stage[Any, Any], ...]) -> None:
        object.__setattr__(self, "_stages", stages)
        super().__init__(_no_fn, " | ".join(s.name for s in stages))

    @property
    def stages(self) -> tuple[Stage[Any, Any], ...]:
        """The flat tuple of primitive stages, in order."""
        return self._stages

    def apply(
        self, upstream: Iterable[Any], context: Context, hooks: Hooks | None = None
    ) -> Iterator[Out]:
        """Chain every primitive stage over *upstream* (a cache's segment only on the keys it
        lacks: see :mod:`pipeflow.engine._memo`)."""
        if any(s.traits.memo is not None for s in self._stages):
            from pipeflow.engine._memo import assemble, open_store

            home = context.facts.get("memo")
            contexts = contexts_of(self._stages, context)

            def each(i: int, s: Stage[Any, Any], it: Iterator[Any]) -> Iterator[Any]:
                return s.apply(it, contexts[i])

            def store(c: int, j: int) -> Any:
                slot = f"{context.facts.get('memo_at', 'pipe')}.{c}"
                return open_store(self._stages[c], self._stages[j:c], home, slot)

            return assemble(self._stages, iter(upstream), each, store)
        it: Iterable[Any] = upstream
        for s in self._stages:
            it = s.apply(it, context)
            context = context_after(s, context)
        return iter(it)

    def length(self, n: int) -> int | None:
        """Thread *n* through every stage's length rule."""
        out: int | None = n
        for s in self._stages:
            if out is None:
                return None
            out = s.length(out)
        return out

    def close(self) -> None:
        """Close every stage."""
        for s in self._stages:
            s.close()

    def seed_slots(self) -> list[tuple[str, int]]:
        """Every stage's seeds, in order."""
        return [slot for s in self._stages for slot in s.seed_slots()]

    def with_seeds(self, seeds: Iterator[int]) -> Stage[In, Out]:
        """Every stage with its seeds taken in order from *seeds*."""
        stages = tuple(s.with_seeds(seeds) for s in self._stages)
        return self if all(a is b for a, b in zip(stages, self._stages)) else Pipe(stages)

    def __repr__(self) -> str:
        return " | ".join(repr(s) for s in self._stages)

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Pipe):
            return self._stages == other._stages
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._stages)

    def __reduce__(self) -> tuple[Any, ...]:
        return (Pipe, (self._stages,))


def or_stranger(pipeflow: object, other: object) -> Any:
    """``pipeflow | other``, where *other* is not a stage: what *other*'s own reflected ``|``
    makes of it (a class that knows pipeflow's objects), else a TypeError with the fix.

    Python would ask ``other.__ror__`` itself after a ``NotImplemented``, and raise its own
    error, which names the private classes (``'_FullShuffle' and 'int'``) and no fix; asking
    it here gives the same answer, and pipeflow's words when it declines (``NotImplemented``,
    or a TypeError: a numpy array's ``|`` refuses an operand without ufuncs so).
    """
    if _has_ror(other) and pipeflow_kind(other) is None:  # not a stage, not a loader
        stranger: Any = other
        try:
            answer = stranger.__ror__(pipeflow)
        except TypeError:
            answer = NotImplemented
        if answer is not NotImplemented:
            return answer
    raise operand_error(pipeflow, other)


def _has_ror(other: object) -> bool:
    """Whether *other*'s type has a reflected ``|`` of its own (a set, a numpy array)."""
    # In the classes' own dicts: getattr on a class would find the metaclass's ``type.__ror__``
    # (``int | None``), which every class has.
    return any(vars(c).get("__ror__") is not None for c in type(other).__mro__)


def computed(stage: Stage[Any, Any], upstream: Any) -> Any:
    """*stage*'s output as the planning step computes it when its input is *upstream*, or
    ``None``: it runs on its items (see :attr:`Traits.compute`)."""
    compute = stage.traits.compute
    return None if compute is None else compute(upstream, **stage._config)


def context_after(stage: Stage[Any, Any], context: Context) -> Context:
    """The context the stage after *stage* sees (see :attr:`Traits.publish`)."""
    publish = stage.traits.publish
    return context if publish is None else publish(context, **stage._config)


def contexts_of(stages: tuple[Stage[Any, Any], ...], context: Context) -> list[Context]:
    """The context each of *stages* sees when the first sees *context* (a stage's published
    facts reach those after it), then the context after the last."""
    out = [context]
    for s in stages:
        out.append(out[-1] if s.traits.publish is None else context_after(s, out[-1]))
    return out


def without_torch(stage: Stage[Any, Any]) -> Stage[Any, Any]:
    """*stage* as a worker that has not imported torch should run it (see
    :attr:`Traits.numpy`)."""
    numpy = stage.traits.numpy
    return stage if numpy is None else numpy(**stage._config)


#: What the loader gives a stage function that declares it as a keyword-only parameter (see
#: :class:`Stage`), in this order.
_GIVEN = ("epoch", "context", "record", "stats", "resources", "delivered")


def _given(name: str, context: Context, hooks: Hooks | None) -> Any:
    """The value of the keyword *name* (one of :data:`_GIVEN`) for a stage function."""
    if name == "epoch":
        return context.epoch
    if name == "context":
        return context
    if hooks is None:
        return {} if name == "resources" else frozenset() if name == "delivered" else None
    if name == "record":
        return hooks.record
    if name == "stats":
        return hooks.stats
    if name == "resources":
        return hooks.resources
    return hooks.resume or frozenset()  # delivered


def _no_fn(upstream: Iterable[Any]) -> Iterator[Any]:  # pragma: no cover - never called
    raise AssertionError


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return p is not None and p.kind is inspect.Parameter.KEYWORD_ONLY


class Source(Seeded, Generic[Out]):
    """Where items enter a pipeline. Subclasses implement :meth:`iterate` and :meth:`length`."""

    name: str = "source"
    #: Whether :meth:`iterate` takes the loader's private hooks as a second argument (a
    #: parallel source keeps its persistent pool there).
    uses_hooks: bool = False
    #: How a resumed pass skips the source's first items, declared once, as a stage's is
    #: (a :class:`~pipeflow.state.Rule`): ``replay`` (the default: they are read again),
    #: ``seek`` (:meth:`iterate` starts at item ``context.start``), or ``recorded`` (it
    #: starts there from the record its pass kept: a stateful object's, a ``mix``'s).
    resume: Rule = Rule.replay()

    def iterate(self, context: Context) -> Iterator[Out]:
        """Return a fresh iterator over this epoch's items.

        A source whose :attr:`resume` rule seeks (or keeps a record) starts at item
        ``context.start`` (a resumed pass); the others always start at the beginning.
        """
        raise NotImplementedError

    def dataset_indices(self) -> bool:
        """Whether the items are indices of a dataset the user holds (``indices(dataset)``, a
        torch sampler): a pass of them with no stage that reads it warns (see
        :func:`pipeflow._hints.unread_indices`). ``False`` by default."""
        return False

    def computed(self) -> Any:
        """The source's items as the planning step describes them (``indices(n)``:
        ``Positions(n)``), or ``None`` (the default: they are only known by iterating)."""
        return None

    def length(self) -> int | None:
        """The number of items per epoch, or ``None`` when it can't be known up front."""
        return None

    def describe(self) -> str:
        """The source's repr inside a loader's repr."""
        return f"{self.name}()"

    def seed_slots(self) -> list[tuple[str, int]]:
        """The source's seeds (a parallel source's, and its loader's), in order."""
        return []

    def with_seeds(self, seeds: Iterator[int]) -> Source[Out]:
        """The source with its seeds taken in order from *seeds* (itself: none, by default)."""
        return self

    def close(self) -> None:
        """Release anything the source holds across epochs (nothing, for most sources)."""
