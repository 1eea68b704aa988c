"""Fetching: indices in, samples out."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from pipeflow._context import Context
from pipeflow._coroutines import refuse
from pipeflow._failure import Failure
from pipeflow._stage import Stage
from pipeflow.errors import annotate

__all__ = ["fetch"]


def fetch(dataset: Any, *, batched: bool | None = None) -> Stage[Any, Any]:
    """Look indices up in a map-style dataset: ``dataset[i]``.

    A batch of indices (a ``list``, as :func:`~pipeflow.batch` yields) becomes a list of
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
    return Stage(
        _fetch, "fetch", config, length="same", skip="same", dataset=dataset, failures="mark"
    )


def _fetch(
    keys: Iterable[Any], dataset: Any, batched: bool | None, *, context: Context
) -> Iterator[Any]:
    """One output per key. A key whose lookup raises becomes a failure in its place (see
    :mod:`pipeflow._failure`), and the next key goes on. In a batch read sample by sample,
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
