"""The user's stateful objects: saved with a loader's state, restored where it resumes.

A dataset, a sampler or an iterable (and the iterator it returns) that has ``state_dict()``
and ``load_state_dict(state)`` — torchdata's ``Stateful`` protocol — is *stateful*. Its state is
taken where the consumer stood, not where prefetching had got to, and restored before the
resumed pass reads it, so that what it does next is what it would have done:

- the object's state (``obj.state_dict()``) is loaded before ``iter(obj)``;
- the iterator's state (``it.state_dict()``), when the iterator is not the object itself, is
  loaded right after ``iter(obj)``; when it is the object itself, only that state is kept,
  and it is loaded after ``iter(obj)``.

A producer of items (a source's iterator; a worker) keeps :class:`Snapshots`: the states at
the start of the pass, and, when the pipeline reads ahead of the consumer (a parallel stage,
a prefetching thread), after every item it produced (the latest :data:`KEEP`). A state then
holds the snapshot at the count of items the consumer's position stands for, or, when that
one is gone, the latest one before it and the number of items to read again after it: either
way the resumed pass continues exactly, provided the object does the same thing again from
the same state (which is what ``state_dict`` promises).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from typing import Any, Protocol, runtime_checkable

from pipeflow.resume.state import Form, Int, Record, Value, flag

__all__ = [
    "KEEP",
    "Snapshots",
    "Stateful",
    "is_stateful",
    "restore",
    "snapshot",
]

#: The most per-item snapshots a producer keeps (older ones give way; a state that needs one
#: of them reads the items after an earlier snapshot again instead).
KEEP = 4096


@runtime_checkable
class Stateful(Protocol):
    """What pipeflow saves and restores with a loader's state (torchdata's ``Stateful``):
    a dataset, sampler, iterable or iterator with these two methods.

    ``state_dict()`` must describe what the object does next: loading it into an object built
    the same way, in another process, makes that object do the same thing again.

    Examples:
        >>> import pipeflow as pf
        >>> class Counter:
        ...     def __init__(self):
        ...         self.n = 0
        ...     def __iter__(self):
        ...         return self
        ...     def __next__(self):
        ...         if self.n == 5:
        ...             raise StopIteration
        ...         self.n += 1
        ...         return self.n
        ...     def state_dict(self):
        ...         return {"n": self.n}
        ...     def load_state_dict(self, state):
        ...         self.n = state["n"]
        ...
        >>> isinstance(Counter(), pf.Stateful)
        True
        >>> loader = pf.from_iterable(Counter())
        >>> it = iter(loader)
        >>> next(it), next(it)
        (1, 2)
        >>> again = pf.from_iterable(Counter())
        >>> again.load_state_dict(loader.state_dict())
        >>> list(again)
        [3, 4, 5]
    """

    def state_dict(self) -> Any: ...

    def load_state_dict(self, state: Any) -> None: ...


def is_stateful(obj: Any) -> bool:
    """Whether *obj* has ``state_dict()`` and ``load_state_dict()``."""
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def snapshot(obj: Any, it: Any) -> dict[str, Any]:
    """The states of *obj* and of its iterator *it* (``None`` before ``iter()``) now."""
    out: dict[str, Any] = {"object": None, "iterator": None}
    if it is obj:
        out["iterator"] = obj.state_dict()
        return out
    if is_stateful(obj):
        out["object"] = obj.state_dict()
    if it is not None and is_stateful(it):
        out["iterator"] = it.state_dict()
    return out


def restore(obj: Any, saved: dict[str, Any] | None) -> Iterator[Any]:
    """``iter(obj)``, with *obj* and the iterator given the states in *saved* (a
    :func:`snapshot`), each where it belongs."""
    if saved is not None and saved.get("object") is not None:
        obj.load_state_dict(saved["object"])
    it: Iterator[Any] = iter(obj)
    if saved is not None and saved.get("iterator") is not None:
        if not is_stateful(it):
            msg = (
                f"load_state_dict: the state holds the state of {type(obj).__name__}'s "
                f"iterator, but its iterator ({type(it).__name__}) has no load_state_dict"
            )
            raise ValueError(msg)
        it.load_state_dict(saved["iterator"])  # type: ignore[attr-defined]
    return it


class Snapshots(Record):
    """A producer's snapshots in one pass, by the count of items it had produced.

    Attributes:
        obj: the stateful object.
        it: its iterator, once the pass has made it (``None`` before: a resumed pass makes
            it, restored, at its first ``next()``).
        produced: items produced so far in the epoch.
        history: whether a snapshot is taken after every item (the pipeline reads ahead).
    """

    __slots__ = ("at", "history", "it", "live", "obj", "produced")

    #: A :func:`snapshot` as of item ``"at"`` (at most the source's items the state's
    #: position consumed), restored ``"early"`` (as the pass starts) when it is a record from
    #: between passes.
    FORM = Form(
        {
            "at": Int(0, "consumed"),
            "object": Value(),
            "iterator": Value(),
            "early": Value(flag, True),
        }
    )

    def __init__(
        self, obj: Any, it: Any, produced: int, history: bool, saved: dict[str, Any] | None
    ) -> None:
        """*it* is ``iter(obj)`` (or ``None``, for :meth:`opened`), *produced* the items it
        stands after: where the snapshot *saved* was taken (a resumed pass), or the epoch's
        start."""
        self.obj = obj
        self.it = it
        self.live = it is not None  # the objects stand where ``produced`` says: ask them
        self.produced = produced
        self.history = history
        self.at: OrderedDict[int, dict[str, Any]] = OrderedDict()
        self.at[produced] = saved if saved is not None else snapshot(obj, it)

    def opened(self, opener: Any, skip: int) -> Iterator[Any]:
        """:meth:`tracking` of the iterator ``opener()`` makes at the first ``next()``: a
        resumed pass restores its objects after the draws a pass makes when it starts (a
        DataLoader's workers' base seed), as torch's and torchdata's iterators do."""
        self.it = opener()
        self.live = True
        yield from self.tracking(self.it, skip)

    def tracking(self, it: Iterator[Any], skip: int) -> Iterator[Any]:
        """*it*, after reading *skip* items again (what a snapshot did not cover), counting
        its items (and taking a snapshot after each, with history). Read with ``next()``
        only: an object that is its own iterator may start over in ``__iter__``."""
        step = it.__next__
        for _ in range(skip):
            try:
                step()
            except StopIteration:
                return
            self.produced += 1
        if skip:
            self.at[self.produced] = snapshot(self.obj, self.it)
        at, obj = self.at, self.obj
        while True:
            try:
                item = step()
            except StopIteration:
                return
            self.produced += 1
            if self.history:
                at[self.produced] = snapshot(obj, self.it)
                if len(at) > KEEP:
                    at.popitem(last=False)
            yield item

    def read_ahead(self) -> None:
        """A later stage reads ahead: a snapshot after every item."""
        self.history = True

    def after(self, needed: int) -> dict[str, Any]:
        """The record for a state whose resumed pass skips *needed* items: the snapshot at
        *needed* (taken now when nothing was read ahead), or the latest one before it."""
        if needed == self.produced and self.live:
            return {"at": needed, **snapshot(self.obj, self.it)}
        best = max((k for k in self.at if k <= needed), default=None)
        if best is None:
            msg = f"state_dict: no state of {type(self.obj).__name__} at or before item {needed}"
            raise RuntimeError(msg)
        return {"at": best, **self.at[best]}
