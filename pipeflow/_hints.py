"""The messages for a new user's first mistakes: what went wrong, and what to write instead.

Python's own messages for these say *what* (``'Stage' object is not iterable``,
``unsupported operand type(s) for |: 'Loader' and 'function'``); pipeflow knows the fix, so its
messages say it, as Python 3.12's "Did you mean" and attrs' and Grain's messages do:

- :func:`checked_keywords`: a misspelt keyword argument of a public function gets Python
  3.13's own suggestion (``Did you mean 'drop_last'?``) on every Python pipeflow runs on;
- :func:`operand_error`: ``|`` with something that is not a stage says what that thing is
  and how it enters a pipeline (a dataset through ``pf.fetch``, a factory by calling it);
- :func:`not_iterable`: iterating a stage says that a stage is a recipe, and where the data
  comes from; :func:`not_an_iterator`: ``next(loader)`` says to call ``iter(loader)``;
- :func:`unread_indices` and :func:`warn_unread`: a pipeline that hands a dataset's indices to
  the training loop because no stage reads the dataset (``pf.fetch`` forgotten) warns once.

Examples:
    >>> import pipeflow as pf
    >>> pf.batch(2, drop_lst=True)
    Traceback (most recent call last):
    ...
    TypeError: batch() got an unexpected keyword argument 'drop_lst'. Did you mean 'drop_last'?
    >>> pf.indices(4) | pf.batch
    Traceback (most recent call last):
    ...
    TypeError: unsupported operand type(s) for |: 'Loader' and 'function' (indices(4) |
    pf.batch): pf.batch is a stage factory; call it: | pf.batch(...)
"""

from __future__ import annotations

import difflib
import functools
import inspect
import reprlib
import sys
import warnings
from collections.abc import Callable, Iterable
from typing import Any, TypeVar

__all__ = [
    "checked_keywords",
    "did_you_mean",
    "mark_public",
    "not_an_iterator",
    "not_iterable",
    "operand_error",
    "pipeflow_kind",
    "unread_indices",
    "warn_unread",
]

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
    them is a pipeflow object, the other (on the *stranger* side) is not a stage, and its own
    ``|`` (if any) declined.

    The types are named by their public names (``'Stage'``, ``'Loader'``; never a private
    class such as ``_FullShuffle``), and the two operands as the user wrote them: a stage by
    its repr (``shuffle(seed=0)``), a loader by its stage next to the ``|``.
    """
    head = (
        f"unsupported operand type(s) for |: {_public_type(left)!r} and "
        f"{_public_type(right)!r} ({_written(left, 'left')} | {_written(right, 'right')}): "
    )
    if stranger == "left":  # something before a stage: data, a factory
        return TypeError(head + _as_left(left))
    return TypeError(head + _as_right(right))


#: pipeflow's public classes that meet ``|``, by module (told by name: this module is imported
#: by theirs).
_KINDS = frozenset(
    {
        ("pipeflow.engine._stage", "Stage"),
        ("pipeflow.engine.loader", "Loader"),
        ("pipeflow.engine._stage", "Source"),
    }
)


def pipeflow_kind(thing: Any) -> str | None:
    """``"Stage"`` for every pipeflow stage (``_FullShuffle``, ``Pipe``...), ``"Loader"`` for
    a loader, ``"Source"`` for a loader's source (``_Indices``...), ``None`` for anything
    else."""
    for c in type(thing).__mro__:
        if (c.__module__, c.__name__) in _KINDS:
            return c.__name__
    return None


def _public_type(thing: Any) -> str:
    """The name of *thing*'s type as a user knows it: ``Stage`` for every pipeflow stage,
    ``Loader``, ``Source``; other types by their own name."""
    return pipeflow_kind(thing) or type(thing).__name__


_shown = reprlib.Repr()
_shown.maxstring = 30
_shown.maxother = 30
_shown.maxlist = _shown.maxtuple = _shown.maxset = _shown.maxdict = 4


def _written(thing: Any, side: str) -> str:
    """*thing* as the user wrote it on *side* of ``|``, in a few words: a stage by its repr,
    a loader or a chain by its part next to the ``|``, a factory by its name, other values by
    a bounded repr."""
    kind = pipeflow_kind(thing)
    if kind == "Source":
        return str(thing.describe())
    if kind is not None:
        parts = [repr(s) for s in thing.stages]
        if kind == "Loader":
            parts.insert(0, thing.source.describe())
        if len(parts) == 1:
            return parts[0]
        return f"… | {parts[-1]}" if side == "left" else f"{parts[0]} | …"
    factory = _factory_name(thing)
    if factory is not None:
        return factory
    if callable(thing) and hasattr(thing, "__qualname__"):
        return str(thing.__qualname__)
    if getattr(type(thing), "__repr__", None) is object.__repr__:  # the class, not an address
        return f"<{type(thing).__qualname__}>"
    return _shown.repr(thing)


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


def not_an_iterator(loader: Any) -> TypeError:
    """The error for ``next(loader)``: a loader is re-iterable; ``iter()`` starts a pass."""
    msg = (
        f"{type(loader).__name__!r} object is not an iterator: a loader is re-iterable, and "
        "each iter(loader) starts a new pass (the next epoch). Call iter() first: "
        "it = iter(loader); batch = next(it), or loop over it: for batch in loader: ..."
    )
    return TypeError(msg)


# -- items that are a dataset's indices, unread -----------------------------------------------
#: pipeflow's stages that never look into an item: they reorder, select, group, convert or move
#: what they get, so after them a dataset's indices are still indices (``collate`` turns a
#: batch of them into an index tensor). Any other stage (``map``, ``filter``, ``fetch``, a
#: ``@pf.stage`` of the user's...) may read the dataset, or make integers of its own.
_KEEP_INDICES = frozenset(
    {
        "batch",
        "collate",
        "ignore_errors",
        "pin_memory",
        "progress",
        "shard",
        "shuffle",
        "to_device",
        "unbatch",
    }
)


def unread_indices(source: Any, stages: Iterable[Any]) -> bool:
    """Whether a loader of *source* and *stages* can only yield a dataset's indices, unread:
    the rule for the "pf.fetch forgotten" warning (:func:`warn_unread`).

    It holds when the source gives the indices of a dataset the user has
    (``pf.indices(dataset)`` given the dataset itself, or ``pf.from_sampler`` given a torch
    ``Sampler``: :meth:`~pipeflow.Source.dataset_indices`), and stages follow it, each one of
    pipeflow's own that never look into an item (``shuffle``, ``shard``, ``batch``,
    ``collate`` without a function of the user's, ``pin_memory``...). Whoever wants the
    numbers says so: ``pf.indices(len(dataset))`` or ``pf.indices(10)`` never warns, nor does
    a pipeline with a stage that runs a function of the user's (``map``, ``filter``,
    ``@pf.stage``...), a ``fetch``, or any other stage (their integers may be data), nor a
    source alone (``list(pf.indices(dataset))``: a look at the indices, not a pipeline).
    """
    stages = list(stages)
    return bool(stages and source.dataset_indices()) and all(map(_keeps_indices, stages))


def _keeps_indices(stage: Any) -> bool:
    fn = getattr(stage, "_fn", None)
    return (
        stage.name in _KEEP_INDICES
        and stage.traits.dataset is None
        and getattr(fn, "__module__", "").startswith("pipeflow.")
        and not any(_users(v) for v in stage.config.values())
    )


def _users(value: Any) -> bool:
    """Whether *value* is a function of the user's (not pipeflow's)."""
    if not callable(value):
        return False
    return not str(getattr(value, "__module__", None) or "").startswith("pipeflow")


#: Where the consumer's ``next()`` passes through pipeflow before the check (not a consumer).
_RUNNER = frozenset({"pipeflow._hints", "pipeflow.engine._wrappers", "pipeflow.engine.loader"})


def warn_unread(source: Any, item: Any) -> bool:
    """Warn that *item*, the first of a pass of a loader from *source*, is a dataset's
    indices (for a loader :func:`unread_indices` holds for); ``True`` when it warned.

    Called on the first item of a pass only (nothing runs for the items after it). It stays
    quiet when the item holds no integers (a failure, an empty batch), and when the code that
    asked for it is pipeflow's own: a loader read by ``pf.mix``, by a ``parallel_source``'s
    workers or by ``pf.DataLoader`` is a part of a larger pipeline, which checks its own end.
    """
    if not _integers(item):
        return False
    frame, level = sys._getframe(1), 2  # stacklevel 2: the caller's frame
    while frame.f_back is not None and frame.f_globals.get("__name__") in _RUNNER:
        frame, level = frame.f_back, level + 1
    consumer = str(frame.f_globals.get("__name__", ""))
    if consumer == "pipeflow" or consumer.startswith("pipeflow."):
        return False
    wanted = (
        "give pf.indices their number: pf.indices(len(dataset))"
        if source.name == "indices"
        else "silence this: warnings.filterwarnings('ignore', 'pipeflow: the items of')"
    )
    msg = (
        f"pipeflow: the items of {source.describe()} | ... are dataset indices, not samples "
        f"(the first is {_what(item)}): no stage reads the dataset. Add pf.fetch(dataset) "
        "after the index stages: pf.indices(dataset) | pf.shuffle(seed=0) | pf.batch(32) | "
        f"pf.fetch(dataset) | pf.collate(). If the indices are what you want, {wanted}"
    )
    warnings.warn(msg, UserWarning, stacklevel=level)
    return True


def _integers(item: Any, depth: int = 0) -> bool:
    """Whether *item* is an integer, a non-empty list or tuple of them, or an integer array
    or tensor (told by its dtype's name: torch is not imported)."""
    if isinstance(item, int):
        return not isinstance(item, bool)
    if isinstance(item, (list, tuple)):
        head = item[:8]  # a batch's first items say it (the check runs once per pass)
        return len(head) > 0 and depth < 2 and all(_integers(x, depth + 1) for x in head)
    dtype = getattr(item, "dtype", None)
    return dtype is not None and "int" in str(dtype)


def _what(item: Any) -> str:
    if isinstance(item, int):
        return f"the int {item}"
    if isinstance(item, (list, tuple)):
        return f"a {type(item).__name__} of {len(item)} ints"
    return f"a {type(item).__name__} of {item.dtype}"
