"""The messages for a new user's first mistakes: what went wrong, and what to write instead.

Python's own messages for these say *what* (``'Stage' object is not iterable``,
``unsupported operand type(s) for |: 'Loader' and 'function'``); pipeflow knows the fix, so its
messages say it, as Python 3.12's "Did you mean" and attrs' and Grain's messages do:

- :func:`checked_keywords`: a misspelt keyword argument of a public function gets Python
  3.13's own suggestion (``Did you mean 'drop_last'?``) on every Python pipeflow runs on;
- :func:`operand_error`: ``|`` with something that is not a stage says what that thing is
  and how it enters a pipeline (a dataset through ``pf.fetch``, a factory by calling it);
- :func:`not_iterable`: iterating a stage says that a stage is a recipe, and where the data
  comes from.

Examples:
    >>> import pipeflow as pf
    >>> pf.batch(2, drop_lst=True)
    Traceback (most recent call last):
    ...
    TypeError: batch() got an unexpected keyword argument 'drop_lst'. Did you mean 'drop_last'?
    >>> pf.indices(4) | pf.batch
    Traceback (most recent call last):
    ...
    TypeError: unsupported operand type(s) for |: 'Loader' and 'function': pf.batch is a stage
    factory; call it: | pf.batch(...)
"""

from __future__ import annotations

import difflib
import functools
import inspect
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = ["checked_keywords", "did_you_mean", "mark_public", "not_iterable", "operand_error"]

F = TypeVar("F", bound=Callable[..., Any])

_NAMED = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def did_you_mean(word: str, options: Iterable[str]) -> str:
    """The sentence that ends a message about an unknown *word*: the closest of *options*
    (Python 3.13's ``" Did you mean 'x'?"``), or else all of them.

    Examples:
        >>> did_you_mean("sed", ["seed", "epoch"])
        " Did you mean 'seed'?"
        >>> did_you_mean("colour", ["size", "drop_last"])
        ' It takes: size, drop_last.'
    """
    options = list(options)
    by_case = {o.lower(): o for o in options}
    close = difflib.get_close_matches(word.lower(), list(by_case), n=1, cutoff=0.6)
    if close:
        return f" Did you mean {by_case[close[0]]!r}?"
    if not options:
        return " It takes no keyword arguments."
    return f" It takes: {', '.join(options)}."


def checked_keywords(fn: F, name: str | None = None) -> F:
    """*fn*, refusing an unknown keyword argument with a "Did you mean" before it runs.

    Python 3.13 suggests the closest parameter itself; pipeflow runs on 3.10 and later, so its
    public functions do it on every version, in 3.13's words. The signature (``inspect``,
    ``help()``) stays *fn*'s. A function that takes ``**kwargs`` is returned as it is.

    Args:
        fn: the function (or an ``__init__``: its first parameter, ``self``, is not offered).
        name: how the message names it; default ``fn.__name__``, ``"C"`` for ``C.__init__``.
    """
    params = list(inspect.signature(fn).parameters.values())
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params):
        return fn
    if fn.__name__ == "__init__":
        params = params[1:]
        name = name or fn.__qualname__.rsplit(".", 1)[0]
    accepted = [p.name for p in params if p.kind in _NAMED]
    known = frozenset(accepted)
    label = f"{name or fn.__name__}()"

    @functools.wraps(fn)
    def checked(*args: Any, **kwargs: Any) -> Any:
        if not known.issuperset(kwargs):
            word = next(k for k in kwargs if k not in known)
            msg = f"{label} got an unexpected keyword argument {word!r}."
            raise TypeError(msg + did_you_mean(word, accepted))
        return fn(*args, **kwargs)

    return checked  # type: ignore[return-value]


def operand_error(left: Any, right: Any, *, stranger: str = "right") -> TypeError:
    """The error for ``left | right`` where Python would say only the two type names: one of
    them is a pipeflow object, the other (on the *stranger* side) is not a stage, and has no
    ``|`` of its own."""
    head = (
        f"unsupported operand type(s) for |: {type(left).__name__!r} and {type(right).__name__!r}: "
    )
    if stranger == "left":  # something before a stage: data, a factory
        return TypeError(head + _as_left(left))
    return TypeError(head + _as_right(right))


def _as_right(thing: Any) -> str:
    """What *thing*, on the right of ``|``, is, and how to write what was meant."""
    factory = _factory_name(thing)
    if factory is not None:
        return f"{factory} is a stage factory; call it: | {factory}(...)"
    source: Any = getattr(thing, "source", None)
    if hasattr(source, "describe"):  # a pipeflow loader
        return (
            f"the right side is a loader, with a source of its own ({source.describe()}); "
            "only stages go after |. To draw items from several loaders, use "
            "pf.mix([loader_a, loader_b])"
        )
    if hasattr(thing, "__getitem__"):
        kind = type(thing).__name__
        return (
            f"to read a {kind} by index, put pf.fetch(...) in the pipeline: "
            f"pf.indices(dataset) | pf.fetch(dataset), where dataset is your {kind}"
        )
    if callable(thing):
        return (
            "to call a function on every item, wrap it: | pf.map(fn); a generator function "
            "becomes a stage with the @pf.stage decorator"
        )
    return "the right side of | must be a pipeflow stage, such as pf.batch(32) or pf.map(fn)"


def _as_left(thing: Any) -> str:
    """What *thing*, on the left of ``|`` before a stage, is, and how data enters."""
    factory = _factory_name(thing)
    if factory is not None:
        return f"{factory} is a factory; call it: {factory}(...) | ..."
    if hasattr(thing, "__getitem__") and hasattr(thing, "__len__"):
        return (
            "data enters a pipeline through a source: pf.indices(dataset) | pf.fetch(dataset) "
            "| ... reads a dataset by index, pf.from_iterable(items) | ... takes items in order"
        )
    return (
        "data enters a pipeline through a source: pf.from_iterable(items) | ..., or "
        "pf.indices(n) | ... for the numbers 0 to n - 1"
    )


def _factory_name(thing: Any) -> str | None:
    """How to write the call of a factory: ``"pf.batch"`` for one of pipeflow's public
    functions (marked by :func:`mark_public`), the name of a ``@pf.stage`` factory (marked
    ``True``), or ``None``."""
    mark = getattr(thing, "_pf_factory", None)
    if isinstance(mark, str):
        return mark
    if mark is True:
        return str(thing.__name__)
    return None


def mark_public(fn: F, name: str) -> F:
    """*fn*, known to the messages as ``pf.<name>``, its keywords checked."""
    checked = checked_keywords(fn)
    checked._pf_factory = f"pf.{name}"  # type: ignore[attr-defined]
    return checked


def not_iterable(stage: Any) -> TypeError:
    """The error for ``iter(stage)``: a stage is a recipe, without items of its own."""
    what = "a chain of stages" if len(stage.stages) > 1 else "a stage"
    msg = (
        f"{stage!r} is not iterable: it is {what}, a recipe with no items of its own. Put a "
        "source before it and iterate the loader that makes: "
        "pf.indices(n) | stage, pf.indices(dataset) | pf.fetch(dataset) | stage, or "
        "pf.from_iterable(items) | stage"
    )
    return TypeError(msg)
