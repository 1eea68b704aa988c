"""Sources: where a pipeline's items come from.

Each factory returns a :class:`~pipeflow.engine.loader.Loader` with no stages yet, so a source is
already iterable, and ``source | stage`` extends it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sized
from itertools import islice
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._context import Context, Hooks
from pipeflow.engine._plan import Positions
from pipeflow.engine._stage import Source, Stage, _short
from pipeflow.engine.loader import Loader
from pipeflow.errors import PipeflowError
from pipeflow.resume._objects import Snapshots, is_stateful, restore, snapshot
from pipeflow.resume.state import Rule
from pipeflow.sources._samplers import describe_sampler

__all__ = ["from_iterable", "from_sampler", "indices"]

T = TypeVar("T")


class _Indices(Source[int]):
    name = "indices"
    resume = Rule.seek()

    def __init__(self, n: int, of_dataset: bool = False) -> None:
        self.n = n
        self.of_dataset = of_dataset  # built from the dataset itself, not from a number

    def dataset_indices(self) -> bool:
        return self.of_dataset

    def iterate(self, context: Context) -> Iterator[int]:
        return iter(range(min(context.start, self.n), self.n))

    def computed(self) -> Positions:
        return Positions(self.n)

    def length(self) -> int:
        return self.n

    def describe(self) -> str:
        return f"indices({self.n})"


def indices(n_or_sized: int | Sized) -> Loader[int]:
    """The indices ``0, 1, ..., n - 1`` of a map-style dataset, once per epoch.

    Given a dataset, the items are its indices until ``pf.fetch(dataset)`` reads them: a pass
    whose every stage only reorders or groups them (``shuffle``, ``batch``, ``collate``...)
    warns at its first item that ``pf.fetch`` is missing. Given a number, the items are
    numbers, and it never warns.

    Args:
        n_or_sized: the number of indices, or an object with ``__len__`` (a dataset).

    Raises:
        ValueError: if the number is negative.
        TypeError: if it is neither an integer nor sized.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.indices(4))
        [0, 1, 2, 3]
        >>> list(pf.indices(["a", "b"]))
        [0, 1]
        >>> pf.indices(-1)
        Traceback (most recent call last):
        ...
        ValueError: indices: n_or_sized must be at least 0 (got -1)
    """
    n = _count("indices", n_or_sized)
    return Loader(_Indices(n, of_dataset=_has_length(n_or_sized)))


def _count(stage: str, n_or_sized: Any) -> int:
    """*n_or_sized* as a number of indices: the length of a sized object (a dataset, an array,
    a tensor), or an integer (numpy's, a 0-d integer tensor's)."""
    what = f"{stage}: n_or_sized must be an integer or a sized dataset"
    if isinstance(n_or_sized, bool):
        raise TypeError(f"{what} (got {n_or_sized!r})")
    n = _length_or_index(n_or_sized)
    if n is None:
        msg = f"{what} (got {type(n_or_sized).__name__}); use from_iterable() for a stream"
        raise TypeError(msg)
    if n < 0:
        msg = f"{stage}: n_or_sized must be at least 0 (got {n})"
        raise ValueError(msg)
    return n


def _has_length(value: Any) -> bool:
    """Whether *value* counts its items with ``len()`` (a dataset, an array), unlike a number."""
    if isinstance(value, int) or not isinstance(value, Sized):
        return False
    try:
        len(value)
    except TypeError:  # a 0-d tensor or array: a number
        return False
    return True


def _length_or_index(value: Any) -> int | None:
    if isinstance(value, int):
        return value
    if isinstance(value, Sized):
        try:
            return len(value)
        except TypeError:  # a 0-d tensor or array: it has a length method, and no length
            pass
    try:
        return int(value.__index__()) if hasattr(type(value), "__index__") else None
    except Exception:  # a float tensor, an array of many elements
        return None


class _ObjectSnapshots(Snapshots):
    """A source's snapshots of the user's object and its iterator (see :class:`Snapshots`)."""

    __slots__ = ()

    @classmethod
    def check(
        cls, source: Any, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """As :meth:`Record.check`; and a record for a stateful object's source must hold
        the state of its object or of its iterator."""
        checked = super().check(source, record, where, consumed, total)
        if is_stateful(source.obj) and checked["object"] is None and checked["iterator"] is None:
            msg = f"load_state_dict: {where} holds no state of its object or iterator"
            raise ValueError(msg)
        return checked


def _holds_state(source: _Restoring) -> bool:
    """Whether a state that consumed some of *source*'s items must hold its record."""
    return is_stateful(source.obj)


def _between_passes(source: _Restoring) -> dict[str, Any] | None:
    """The record of a state taken between passes: the object's state now, restored
    ``"early"`` (as the next pass starts, before it draws anything)."""
    if not is_stateful(source.obj):
        return None
    return {"at": 0, **snapshot(source.obj, None), "early": True}


class _Restoring(Source[Any]):
    """A source that reads a user object's iterator: a stateful object (and iterator) is
    restored where a resumed pass starts, and tracked for ``state_dict()`` (see
    :mod:`pipeflow.resume._objects`); the others are read again up to there."""

    uses_hooks = True  # the loader hands it what a resumed pass starts from, and its record
    #: It reads up to ``context.start`` itself (from a snapshot, when saved).
    resume = Rule.recorded(_ObjectSnapshots, must_hold=_holds_state, idle=_between_passes)

    def __init__(self, obj: Any) -> None:
        self.obj = obj

    def _iterator(self, context: Context, hooks: Hooks | None) -> Iterator[Any]:
        """``iter(obj)``, reading up to ``context.start`` at its first ``next()`` (as a
        sampler draws its order there: the generators it draws from see the same draws as an
        uninterrupted run); in a resumed pass the object and its iterator are restored at
        that first ``next()`` too, from the source's record."""
        saved = hooks.saved if hooks is not None else None
        if saved is not None and hooks is not None and saved.get("early"):  # between passes:
            saved = {**saved, "early": False}  # restored now, before the pass draws anything
            it: Iterator[Any] = restore(self.obj, saved)
            snaps = _ObjectSnapshots(self.obj, it, 0, hooks.history, None)
            hooks.record = snaps
            return snaps.tracking(it, context.start)
        if saved is not None and hooks is not None:
            skip = max(context.start - saved["at"], 0)  # what the snapshot does not cover
            snaps = _ObjectSnapshots(
                self.obj, None, min(saved["at"], context.start), hooks.history, saved
            )
            hooks.record = snaps
            return snaps.opened(lambda: restore(self.obj, saved), skip)
        it = iter(self.obj)
        if hooks is None or not (is_stateful(self.obj) or is_stateful(it)):
            return islice(it, context.start, None) if context.start else it
        snaps = _ObjectSnapshots(self.obj, it, 0, hooks.history, None)
        hooks.record = snaps
        return snaps.tracking(it, context.start)


class _FromSampler(_Restoring):
    name = "from_sampler"

    def __init__(self, sampler: Iterable[Any], set_epoch: bool) -> None:
        super().__init__(sampler)
        self.sampler = sampler
        self.set_epoch = set_epoch

    def iterate(self, context: Context, hooks: Hooks | None = None) -> Iterator[Any]:
        if self.set_epoch:
            hook = getattr(self.sampler, "set_epoch", None)
            if callable(hook):
                hook(context.epoch)
        return self._iterator(context, hooks)

    def length(self) -> int | None:
        return len(self.sampler) if isinstance(self.sampler, Sized) else None

    def dataset_indices(self) -> bool:
        """A torch ``Sampler`` draws a dataset's indices (told without importing torch)."""
        return any(
            c.__name__ == "Sampler" and c.__module__ == "torch.utils.data.sampler"
            for c in type(self.sampler).__mro__
        )

    def describe(self) -> str:
        return f"from_sampler({describe_sampler(self.sampler)})"


def from_sampler(sampler: Iterable[T], *, set_epoch: bool = True) -> Loader[T]:
    """Indices (or batches of indices) from a re-iterable sampler, torch's samplers included.

    Args:
        sampler: anything iterable more than once: a ``torch.utils.data.Sampler``, a
            ``BatchSampler``, a list.
        set_epoch: call ``sampler.set_epoch(epoch)`` before each pass when the sampler has
            it (``DistributedSampler`` does), so its shuffle follows the loader's epoch.

    Raises:
        TypeError: if *sampler* is not iterable, or is a one-shot iterator.

    Examples:
        >>> import pipeflow as pf
        >>> list(pf.from_sampler([3, 1, 2]))
        [3, 1, 2]
    """
    _not_a_stage("from_sampler", "sampler", sampler)
    if not isinstance(sampler, Iterable):
        msg = f"from_sampler: sampler must be iterable (got {type(sampler).__name__})"
        raise TypeError(msg)
    if _one_shot(sampler):
        msg = (
            "from_sampler: sampler must be re-iterable, but got a one-shot iterator "
            f"({type(sampler).__name__}); pass the sampler itself, not iter(sampler)"
        )
        raise TypeError(msg)
    _sized_or_not("from_sampler", "sampler", sampler)
    _checks.boolean("from_sampler", "set_epoch", set_epoch)
    return Loader(_FromSampler(sampler, set_epoch))


def _one_shot(value: Any) -> bool:
    """Whether *value* is an iterator (its ``__iter__`` returns itself): not a loader, which
    has ``__next__`` only to say that ``iter()`` starts its passes."""
    return isinstance(value, Iterator) and not isinstance(value, Loader)


def _not_a_stage(source: str, name: str, value: Any) -> None:
    """Refuse a stage as a source's data (it has ``__iter__`` only to say it has no items)."""
    if isinstance(value, Stage):
        msg = (
            f"{source}: {name} must hold items, and {value!r} is a stage, a recipe with none; "
            f"put it after the source: pf.{source}(items) | stage"
        )
        raise TypeError(msg)


def _sized_or_not(stage: str, name: str, value: Any) -> None:
    """Refuse an object whose ``len()`` the pass would ask and that has none to give (a 0-d
    tensor: it has ``__len__``, which raises), now rather than at the first ``next()``."""
    if isinstance(value, Sized):
        try:
            len(value)
        except TypeError as e:
            msg = f"{stage}: {name} must be iterable (got {type(value).__name__}: {e})"
            raise TypeError(msg) from None


class _FromIterable(_Restoring):
    name = "from_iterable"

    def __init__(self, iterable: Iterable[Any]) -> None:
        super().__init__(iterable)
        self.iterable = iterable
        self.one_shot = _one_shot(iterable)
        self.used_by: int | None = None

    def iterate(self, context: Context, hooks: Hooks | None = None) -> Iterator[Any]:
        if self.one_shot:
            if self.used_by is not None:
                msg = (
                    f"from_iterable: the source is a one-shot iterator "
                    f"({type(self.iterable).__name__}) already consumed by epoch "
                    f"{self.used_by}, so epoch {context.epoch} would be silently empty; pass a "
                    "re-iterable (a list, a dataset, an object whose __iter__ starts afresh)"
                )
                raise PipeflowError(msg)
            self.used_by = context.epoch
        return self._iterator(context, hooks)

    def length(self) -> int | None:
        if isinstance(self.iterable, Sized):
            return len(self.iterable)
        return None

    def describe(self) -> str:
        return f"from_iterable({_short(self.iterable)})"


def from_iterable(iterable: Iterable[T]) -> Loader[T]:
    """Items from any iterable; each epoch iterates it afresh.

    A one-shot iterator (a generator, ``iter(list)``) serves one epoch; a second pass raises
    :class:`~pipeflow.PipeflowError` (a ``RuntimeError``) instead of silently yielding nothing.

    Raises:
        TypeError: if *iterable* is not iterable.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.from_iterable(x * x for x in range(3))
        >>> list(loader)
        [0, 1, 4]
        >>> list(loader)
        Traceback (most recent call last):
        ...
        pipeflow.errors.PipeflowError: from_iterable: the source is a one-shot iterator ...
    """
    _not_a_stage("from_iterable", "iterable", iterable)
    if not isinstance(iterable, Iterable):
        try:  # the sequence protocol (__getitem__ from 0): iter() calls none of it yet
            iter(iterable)
        except TypeError:
            msg = f"from_iterable: iterable must be iterable (got {type(iterable).__name__})"
            raise TypeError(msg) from None
    _sized_or_not("from_iterable", "iterable", iterable)
    return Loader(_FromIterable(iterable))
