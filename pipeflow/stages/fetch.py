"""Fetching: indices in, samples out."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeflow._coroutines import refuse
from pipeflow.engine._context import Context
from pipeflow.engine._failure import Failure
from pipeflow.engine._stage import Stage
from pipeflow.errors import annotate
from pipeflow.resume._objects import Snapshots, is_stateful, snapshot
from pipeflow.resume.state import Form, Int, Rule, Value, flag

__all__ = ["fetch"]


def fetch(dataset: Any, *, batched: bool | None = None) -> Stage[Any, Any]:
    """Look indices up in a map-style dataset: ``dataset[i]``.

    A batch of indices (a ``list``, as :func:`~pipeflow.stages.batch` yields) becomes a list of
    samples, through one ``dataset.__getitems__(batch)`` call when the dataset has it (as torch
    does), else ``[dataset[i] for i in batch]``. Any other item is one key.

    Args:
        dataset: anything with ``__getitem__``.
        batched: ``None`` (the default) decides per item as above; ``False`` always passes the
            item as one key (so a list can be a key, as with torch's ``batch_size=None``);
            ``True`` requires batches.

    Raises:
        TypeError: if *dataset* has no ``__getitem__``.

    Examples:
        >>> import pipeflow as pf
        >>> words = ["zero", "one", "two", "three"]
        >>> list(pf.indices(4) | pf.batch(3) | pf.fetch(words))
        [['zero', 'one', 'two'], ['three']]
        >>> list(pf.from_iterable([2, 0]) | pf.fetch(words))
        ['two', 'zero']
    """
    if not hasattr(dataset, "__getitem__"):
        msg = f"fetch: dataset must support dataset[index] (got {type(dataset).__name__})"
        raise TypeError(msg)
    if batched is not None and not isinstance(batched, bool):
        msg = f"fetch: batched must be None or a bool (got {batched!r})"
        raise TypeError(msg)
    refuse("fetch", "dataset.__getitem__", getattr(type(dataset), "__getitem__", None))
    config = {"dataset": dataset, "batched": batched}
    fn: Callable[..., Iterator[Any]]
    if is_stateful(dataset):
        fn, resume = _fetch_stateful, _STATEFUL
    else:
        fn, resume = _fetch, Rule.below("same")
    return Stage(
        fn, "fetch", config, length="same", resume=resume, dataset=dataset, failures="mark"
    )


def _fetch_stateful(
    keys: Iterable[Any],
    dataset: Any,
    batched: bool | None,
    *,
    context: Context,
    record: _DatasetRecord | None,
) -> Iterator[Any]:
    """:func:`_fetch` over a stateful dataset, tracked in the pass's *record*: restored as
    a resumed pass starts (a record from between passes, ``"early"``), else once the pass's
    first index was drawn, so that a sampler drawing from the same generators (torch's
    global one) draws what it drew."""
    if record is None:
        return _fetch(keys, dataset, batched, context=context)
    saved = record.saved
    if saved is not None and saved.get("early"):  # as the pass starts
        if saved.get("object") is not None:
            dataset.load_state_dict(saved["object"])
        record.live = True
    elif saved is not None:  # where the consumer stood: once the first index has come
        keys = _restoring(keys, dataset, saved, record)
    out: Iterator[Any] = record.tracking(
        _fetch(keys, dataset, batched, context=context), context.start
    )
    return out


class _DatasetRecord(Snapshots):
    """The dataset's snapshots in a pass, by the count of outputs fetched in the epoch (a
    snapshot after each when a later stage reads ahead: the runner sets ``history``)."""

    __slots__ = ("first", "saved")

    #: The dataset's state (``"object"``; ``"iterator"`` is always ``None`` here) as of
    #: input ``"at"``, at most the inputs the consumed outputs took; ``"early"``: restored
    #: as the pass starts (a record from between passes).
    FORM = Form(
        {
            "inputs": Int(0, "total"),
            "start": Int(0, "consumed", True),
            "at": Int(0, "inputs"),
            "object": Value(required=True),
            "iterator": Value(),
            "early": Value(flag, True),
        }
    )

    @classmethod
    def begin(cls, stage: Any, context: Context, saved: dict[str, Any] | None) -> _DatasetRecord:
        return cls(stage.traits.dataset, context, saved)

    @classmethod
    def check(
        cls, stage: Any, record: Any, where: str, consumed: int | None, total: int | None
    ) -> dict[str, Any]:
        """Its :attr:`FORM`; or, from a run with workers, a ``parallel_map``'s record."""
        if isinstance(record, dict) and "workers" in record:
            from pipeflow.resume._check import map_record_inline

            return map_record_inline(record, where, consumed, total, stateful=True)
        return super().check(stage, record, where, consumed, total)

    def __init__(self, dataset: Any, context: Context, saved: dict[str, Any] | None) -> None:
        base = None if saved is None else {"object": saved["object"], "iterator": None}
        super().__init__(dataset, None, context.offset, False, base)  # the state as the
        self.live = saved is None  # pass starts; a restored dataset is at its first sample
        self.first = context.offset + context.start  # the pass's first output, in the epoch
        self.saved = saved

    def at_first(self) -> int:
        """The count the pass started at (its first snapshot's)."""
        first: int = next(iter(self.at))
        return first

    def unstarted(self) -> dict[str, Any]:
        """The record of a pass that has fetched nothing yet: the dataset as the pass found
        it, restored ``"early"`` (before the resumed pass draws anything, so that what the
        pass's start draws from shared generators is drawn again, as it was)."""
        if self.saved is not None:
            return dict(self.saved)
        snap = self.at[self.at_first()]
        return {"inputs": self.first, "at": self.first, **snap, "early": True}

    def ended_record(self) -> dict[str, Any]:
        """The record between this pass and the next: the dataset's state now, restored
        ``"early"``: before the next pass draws anything (its workers' base seed, its order),
        as the uninterrupted run's next pass found it."""
        return {"inputs": 0, "at": 0, **snapshot(self.obj, None), "early": True}

    def after(self, needed: int) -> dict[str, Any]:
        """``{"inputs": at, "start": n - at, ...the snapshot at at}`` once the consumer took
        *needed* of the pass's outputs (the epoch's first ``n``): a resumed pass skips the
        samples up to the snapshot, then fetches (and drops) the rest again."""
        total = self.first + needed
        if self.produced == self.first and self.produced == self.at_first():  # nothing fetched
            return self.unstarted()
        snap = super().after(total)
        out = {"inputs": snap["at"], **snap}
        if total > snap["at"]:
            out["start"] = total - snap["at"]
        return out


#: ``fetch`` over a stateful dataset (one with ``state_dict()``, see
#: :mod:`pipeflow.resume._objects`) that it reads in this process: the dataset is saved with the
#: loader's state, as of the samples the consumer received (the pass's record says where it
#: stood), and restored when a resumed pass fetches its first sample.
_STATEFUL = Rule.recorded(_DatasetRecord)


def _restoring(
    keys: Iterable[Any], dataset: Any, saved: dict[str, Any], snaps: Snapshots
) -> Iterator[Any]:
    """*keys*, the dataset restored once the first has come (or none will)."""
    it = iter(keys)
    first = next(it, _END)
    if saved.get("object") is not None:
        dataset.load_state_dict(saved["object"])
    snaps.live = True
    if first is _END:
        return
    yield first
    yield from it


_END = object()


def _fetch(
    keys: Iterable[Any], dataset: Any, batched: bool | None, *, context: Context
) -> Iterator[Any]:
    """One output per key. A key whose lookup raises becomes a failure in its place (see
    :mod:`pipeflow.engine._failure`), and the next key goes on. In a batch read sample by sample,
    when a later ``ignore_errors`` drops that kind of error, only the failed samples are
    dropped (marked as dropped failures) and the batch goes on with the rest."""
    getitem = dataset.__getitem__
    getitems = getattr(dataset, "__getitems__", None) or None
    ignoring = context.ignoring
    epoch = context.epoch
    for key in keys:
        index: Any = key
        try:
            if batched is False:
                yield getitem(key)
            elif type(key) is list or (batched and isinstance(key, (list, tuple, range))):
                if getitems is not None:  # one call for the batch: it fails as a whole
                    index = None
                    yield getitems(key)
                    continue
                out: list[Any] = []
                dropped: list[Failure] = []
                rest = iter(key)
                while True:  # the lookups run in C (map), and stop at a failed one
                    try:
                        out.extend(map(getitem, rest))  # keeps what it got before a failure
                        break
                    except Exception as e:
                        index = key[len(out) + len(dropped)]
                        if not isinstance(e, ignoring):
                            raise
                        _note(e, dataset, index, key, epoch)  # only the sample: a shorter batch
                        dropped.append(Failure(e, [index], dropped=True))
                if not out and dropped:  # nothing left: the batch failed as a whole
                    yield Failure(dropped[0].error, key)
                    continue
                yield out
                yield from dropped  # counted by ignore_errors, after the batch they left
            elif batched:
                msg = f"fetch: batched=True expects lists of indices (got {type(key).__name__})"
                raise TypeError(msg)
            else:
                yield getitem(key)
        except Exception as e:
            _note(e, dataset, index, key, epoch)
            yield Failure(e, key if type(key) is list else [index])


def _note(e: BaseException, dataset: Any, index: Any, key: Any, epoch: int) -> None:
    batch = key if type(key) is list else None
    hint = _length_hint(dataset, index) if isinstance(e, IndexError) else ""
    annotate(e, "fetch", epoch, index=index, batch=batch, extra=hint)


def _length_hint(dataset: Any, index: Any) -> str:
    try:
        n = len(dataset)
    except Exception:
        return ""
    if isinstance(index, int) and not -n <= index < n:
        return f"the dataset says its length is {n}, so index {index} is out of range"
    return f"the dataset says its length is {n}"
