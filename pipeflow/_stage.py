"""Stages: generator functions bound to their configuration, composed with ``|``.

A :class:`Stage` is an immutable recipe. Calling :meth:`Stage.apply` on an upstream iterator
returns a *fresh* iterator; nothing runs until that iterator is consumed. Two stages compose with
``|`` into a :class:`Stage` that holds the flat tuple of both, so composition is associative.
"""

from __future__ import annotations

import functools
import inspect
import reprlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, Literal, TypeVar, overload

if TYPE_CHECKING:
    from pipeflow.loader import Context

__all__ = ["Stage", "stage"]

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


class Stage(Generic[In, Out]):
    """A pipeline stage: a generator function and its frozen configuration.

    Most users never build a :class:`Stage` by hand: the factories (:func:`pipeflow.batch`,
    :func:`pipeflow.map`, ...) and the :func:`stage` decorator return them.

    Args:
        fn: ``fn(upstream, **config)`` returning an iterator. When *fn* has a keyword-only
            parameter named ``epoch``, the loader passes the current epoch.
        name: the name shown in reprs, errors and statistics.
        config: the keyword configuration, already validated.
        length: how the stage changes the number of items (see ``LengthRule``).

    Examples:
        >>> from pipeflow import from_iterable, stage
        >>> @stage(length="same")
        ... def double(items):
        ...     for x in items:
        ...         yield 2 * x
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
        "_skip",
        "_wants_context",
        "_wants_epoch",
    )

    def __init__(
        self,
        fn: Callable[..., Iterator[Any]],
        name: str,
        config: Mapping[str, Any] | None = None,
        *,
        length: LengthRule = None,
        skip: LengthRule = None,
        factory: Callable[..., Stage[Any, Any]] | None = None,
    ) -> None:
        self._fn = fn
        self._factory = factory
        self._skip = skip
        self._wants_context = _takes_keyword(fn, "context")
        self._name = name
        self._config: dict[str, Any] = dict(config or {})
        self._wants_epoch = _takes_keyword(fn, "epoch")
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

    def apply(self, upstream: Iterable[Any], context: Context) -> Iterator[Out]:
        """Return a fresh iterator of this stage's output over *upstream*."""
        extra: dict[str, Any] = {}
        if self._wants_epoch:
            extra["epoch"] = context.epoch
        if self._wants_context:
            extra["context"] = context
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

    def skipped_inputs(self, k: int) -> int | None:
        """How many input items make the first *k* outputs, when skipping those inputs skips
        exactly those outputs (a map, a batch); ``None`` when it does not (a shuffle, a filter).

        Resumption uses it to skip consumed items below this stage instead of replaying them.
        """
        rule = self._skip
        if rule is None:
            return None
        if rule == "same":
            return k
        return rule(k, **self._config)

    def resume_state(self, record: Any, consumed: int) -> Any:
        """What a pass's *record* says about resuming after *consumed* outputs (for stages
        that deliver out of order); ``None`` for the rest."""
        return None

    def close(self) -> None:
        """Release anything the stage holds across epochs (nothing, for most stages)."""

    # -- composition ------------------------------------------------------------------------
    @overload
    def __or__(self, other: Stage[Out, T]) -> Stage[In, T]: ...
    @overload
    def __or__(self, other: object) -> Any: ...
    def __or__(self, other: object) -> Any:
        if isinstance(other, Stage):
            return Pipe((*self.stages, *other.stages))
        return NotImplemented

    def __ror__(self, other: object) -> Any:
        # Only reached when the left operand is not a pipeflow object (sources and loaders
        # implement __or__ themselves). Raw data never enters through ``|``: a numpy array on
        # the left would broadcast the operator element-wise.
        return NotImplemented

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
        state = (type(self), self._fn, self._name, self._config, self._length, self._skip)
        return (_rebuild, state)


def _call_factory(factory: Callable[..., Stage[Any, Any]], config: dict[str, Any]) -> Any:
    return factory(**config)


def _rebuild(
    cls: type[Stage[Any, Any]],
    fn: Callable[..., Iterator[Any]],
    name: str,
    config: dict[str, Any],
    length: LengthRule,
    skip: LengthRule = None,
) -> Stage[Any, Any]:
    obj = cls.__new__(cls)
    Stage.__init__(obj, fn, name, config, length=length, skip=skip)
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

    def apply(self, upstream: Iterable[Any], context: Context) -> Iterator[Out]:
        """Chain every primitive stage over *upstream*."""
        it: Iterable[Any] = upstream
        for s in self._stages:
            it = s.apply(it, context)
        return iter(it)

    def skipped_inputs(self, k: int) -> int | None:
        """Thread *k* back through every stage's skip rule."""
        out: int | None = k
        for s in reversed(self._stages):
            if out is None:
                return None
            out = s.skipped_inputs(out)
        return out

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


def _no_fn(upstream: Iterable[Any]) -> Iterator[Any]:  # pragma: no cover - never called
    raise AssertionError


def _takes_keyword(fn: Callable[..., Any], name: str) -> bool:
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False
    p = params.get(name)
    return p is not None and p.kind is inspect.Parameter.KEYWORD_ONLY


# -- the decorator --------------------------------------------------------------------------
@overload
def stage(fn: Callable[..., Iterator[Any]], /) -> Callable[..., Stage[Any, Any]]: ...
@overload
def stage(
    *, name: str | None = None, length: LengthRule = None, positional: bool = False
) -> Callable[[Callable[..., Iterator[Any]]], Callable[..., Stage[Any, Any]]]: ...
def stage(
    fn: Callable[..., Iterator[Any]] | None = None,
    /,
    *,
    name: str | None = None,
    length: LengthRule = None,
    positional: bool = False,
) -> Any:
    """Turn a generator function into a stage factory.

    The function's first parameter receives the upstream iterable; the others are the stage's
    configuration. Calling the factory checks the configuration against the signature at once
    (a misspelt or missing argument raises ``TypeError`` when the stage is built, not inside the
    training loop) and returns an immutable, picklable :class:`Stage`. A keyword-only parameter
    named ``epoch`` is filled in by the loader with the current epoch.

    Args:
        fn: the generator function (when used as ``@stage`` without parentheses).
        name: the stage's name; defaults to the function's name.
        length: ``"same"`` when the stage yields exactly one item per item in, a function
            ``length(n, **config) -> int`` when the count is otherwise computable, or ``None``
            (the default) when it can't be known — then the loader has no ``len()``.
        positional: each output is computed from the input at the same position alone (a
            map: no buffering, reordering, dropping). Resuming then skips consumed items
            below this stage instead of replaying them through it. Needs ``length="same"``.

    Raises:
        TypeError: if *fn* is not callable, or takes no upstream parameter.

    Examples:
        >>> import pipeflow as pf
        >>> @pf.stage(length="same")
        ... def add(items, *, amount=1):
        ...     for x in items:
        ...         yield x + amount
        >>> add(amount=10)
        add(amount=10)
        >>> list(pf.from_iterable(range(3)) | add(amount=10))
        [10, 11, 12]
        >>> add(amout=10)
        Traceback (most recent call last):
        ...
        TypeError: stage 'add': got an unexpected keyword argument 'amout'
    """
    if positional and length != "same":
        msg = f"@stage: positional=True needs length='same' (got length={length!r})"
        raise ValueError(msg)
    if fn is None:
        return functools.partial(_make_factory, name=name, length=length, positional=positional)
    return _make_factory(fn, name=name, length=length, positional=positional)


def _make_factory(
    fn: Callable[..., Iterator[Any]],
    *,
    name: str | None,
    length: LengthRule,
    positional: bool = False,
) -> Callable[..., Stage[Any, Any]]:
    if not callable(fn):
        msg = f"@stage needs a generator function (got {type(fn).__name__})"
        raise TypeError(msg)
    sig = inspect.signature(fn)
    params = list(sig.parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        msg = (
            f"@stage: {fn.__qualname__} must take the upstream iterable as its first "
            "positional parameter"
        )
        raise TypeError(msg)
    if length is not None and length != "same" and not callable(length):
        msg = f"@stage: length must be 'same', a function or None (got {length!r})"
        raise TypeError(msg)
    stage_name = name or fn.__name__
    config_sig = sig.replace(
        parameters=[p for p in params[1:] if p.name not in ("epoch", "context")]
    )

    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> Stage[Any, Any]:
        if "epoch" in kwargs and _takes_keyword(fn, "epoch"):
            msg = f"stage {stage_name!r}: 'epoch' is supplied by the loader; use set_epoch()"
            raise TypeError(msg)
        try:
            bound = config_sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"stage {stage_name!r}: {e}") from None
        bound.apply_defaults()
        # The stage pickles as "call this factory again": the factory has the function's
        # name in its module, so pickle finds it by reference.
        skip: LengthRule = "same" if positional else None
        return Stage(fn, stage_name, _flatten(bound), length=length, skip=skip, factory=factory)

    return factory


def _flatten(bound: inspect.BoundArguments) -> dict[str, Any]:
    config: dict[str, Any] = {}
    for pname, value in bound.arguments.items():
        kind = bound.signature.parameters[pname].kind
        if kind is inspect.Parameter.VAR_KEYWORD:
            config.update(value)
        elif kind is inspect.Parameter.VAR_POSITIONAL:
            if value:
                msg = f"stage parameters must be named; *{pname} is not supported"
                raise TypeError(msg)
        else:
            config[pname] = value
    return config
