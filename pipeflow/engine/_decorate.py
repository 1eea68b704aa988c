"""The :func:`stage` decorator: any generator function becomes a stage factory."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from typing import Any, overload

from pipeflow import _checks
from pipeflow._hints import did_you_mean
from pipeflow.engine._stage import LengthRule, Stage, _takes_keyword

__all__ = ["stage"]


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
        ...
        >>> add(amount=10)
        add(amount=10)
        >>> list(pf.from_iterable(range(3)) | add(amount=10))
        [10, 11, 12]
        >>> add(amout=10)
        Traceback (most recent call last):
        ...
        TypeError: stage 'add': got an unexpected keyword argument 'amout'. Did you mean 'amount'?
    """
    _check_options(name, length, positional)
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
    sig = _generator_signature(fn)
    _check_options(name, length, positional)
    stage_name = name or fn.__name__
    _upstream, *config = sig.parameters.values()
    config_sig = sig.replace(parameters=[p for p in config if p.name not in ("epoch", "context")])

    @functools.wraps(fn)
    def factory(*args: Any, **kwargs: Any) -> Stage[Any, Any]:
        if "epoch" in kwargs and _takes_keyword(fn, "epoch"):
            msg = f"stage {stage_name!r}: 'epoch' is supplied by the loader; use set_epoch()"
            raise TypeError(msg)
        _refuse_unknown(stage_name, config_sig, kwargs)
        try:
            bound = config_sig.bind(*args, **kwargs)
        except TypeError as e:
            raise TypeError(f"stage {stage_name!r}: {e}") from None
        bound.apply_defaults()
        # The stage pickles as "call this factory again": the factory has the function's
        # name in its module, so pickle finds it by reference.
        skip: LengthRule = "same" if positional else None
        return Stage(fn, stage_name, _flatten(bound), length=length, skip=skip, factory=factory)

    factory._pf_factory = True  # type: ignore[attr-defined]  # `| factory` says: call it
    return factory


def _refuse_unknown(stage_name: str, sig: inspect.Signature, kwargs: dict[str, Any]) -> None:
    """Refuse a keyword argument *sig* does not take, with Python 3.13's "Did you mean"."""
    params = sig.parameters.values()
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return
    names = [p.name for p in params if p.kind is not inspect.Parameter.POSITIONAL_ONLY]
    for word in kwargs:
        if word not in names:
            msg = f"stage {stage_name!r}: got an unexpected keyword argument {word!r}."
            raise TypeError(msg + did_you_mean(word, names))


def _generator_signature(fn: Any) -> inspect.Signature:
    """*fn*'s signature, once it is known to be a (sync) function taking the upstream first.

    Raises:
        TypeError: if it is not callable, is async, or takes no positional first parameter.
    """
    if not callable(fn):
        msg = f"@stage needs a generator function (got {type(fn).__name__})"
        raise TypeError(msg)
    if inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn):
        msg = (
            f"@stage needs a generator function, not an async one (got {fn.__qualname__}): "
            "nothing would await it. Write the per-item work as an async def and run it with "
            "pf.parallel_map(fn, workers=...)"
        )
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
    return sig


def _check_options(name: str | None, length: LengthRule, positional: bool) -> None:
    """Refuse a *name*, *length* or *positional* of the wrong type."""
    if name is not None and not isinstance(name, str):
        msg = f"@stage: name must be a string or None (got {name!r})"
        raise TypeError(msg)
    _checks.boolean("@stage", "positional", positional)
    same = isinstance(length, str) and length == "same"
    if length is not None and not same and not callable(length):
        msg = f"@stage: length must be 'same', a function or None (got {length!r})"
        raise TypeError(msg)
    if positional and not same:
        msg = f"@stage: positional=True needs length='same' (got length={length!r})"
        raise ValueError(msg)


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
