"""The collate stage: every batch of samples becomes tensors.

The collate functions themselves, drop-in and faster versions of torch's, live in
:mod:`pipeflow.stages._collate_torch` (``default_collate``) and :mod:`pipeflow.stages._convert`
(``default_convert``); both are exported here and from ``pipeflow``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from pipeflow import _checks
from pipeflow.engine._stage import Stage, Traits
from pipeflow.errors import _add_note
from pipeflow.stages._collate_torch import default_collate
from pipeflow.stages._convert import default_convert
from pipeflow.stages.pad import padded_collate

__all__ = ["collate", "default_collate", "default_convert"]


def _numpy_default() -> Stage[Any, Any]:
    """``collate()`` in a worker that has not imported torch: stack in numpy, make tensors on
    arrival."""
    from pipeflow.stages._pending import collate_pending

    return Stage(_collate_with, "collate", {"fn": collate_pending}, length="same", skip="same")


#: ``collate()`` with :func:`default_collate` has a numpy-only form for workers.
_DEFAULT = Traits(numpy=_numpy_default)


def collate(
    fn: Callable[[Any], Any] | None = None,
    *,
    pad: Any = None,
    pad_to_multiple_of: int | None = None,
    lengths: bool = False,
    mask: bool = False,
) -> Stage[Any, Any]:
    """Turn every batch of samples into tensors with *fn* (default: :func:`default_collate`),
    or pad ragged samples into tensors with *pad*.

    With *pad*, samples of different lengths (token ids, audio frames, boxes) are padded and
    stacked: *pad* is the value that fills the rest (a number for every array, or a dict of
    values by field, a tuple by position; ``None`` for a field collates it as
    ``default_collate`` does). See :mod:`pipeflow.stages.pad` for the rules, and
    :class:`~pipeflow.Padded` for what *lengths* and *mask* return.

    Args:
        fn: the collate function; any callable taking one batch (a list of samples).
        pad: the pad value(s); ``None``: no padding (the default).
        pad_to_multiple_of: with *pad*, round the padded length (the first dimension of each
            item) up to a multiple of this (8 or 64 suit tensor cores).
        lengths: with *pad*, return each padded field as ``Padded(values, lengths, mask)``
            with the items' lengths.
        mask: with *pad*, the same with a boolean mask, ``True`` on the items' own entries.

    Raises:
        TypeError: if *fn* is neither callable nor ``None``, or *pad* is not a number, a dict
            or tuple of them, or ``None``.
        ValueError: if *pad* is given with *fn*, or the padding options without *pad*.

    Examples:
        >>> import pipeflow as pf
        >>> data = [(1.0, 0), (2.0, 1), (3.0, 0)]
        >>> x, y = next(iter(pf.indices(3) | pf.batch(2) | pf.fetch(data) | pf.collate()))
        >>> x, y
        (tensor([1., 2.], dtype=torch.float64), tensor([0, 1]))
        >>> pf.collate()
        collate()
        >>> samples = [{"ids": [5, 6, 7], "label": 0}, {"ids": [8], "label": 1}]
        >>> batch = next(iter(pf.from_iterable([samples]) | pf.collate(pad=0, mask=True)))
        >>> batch["ids"].values, batch["ids"].mask, batch["label"]
        (tensor([[5, 6, 7],
                [8, 0, 0]]), tensor([[ True,  True,  True],
                [ True, False, False]]), tensor([0, 1]))
    """
    if pad is not None:
        if fn is not None:
            msg = f"collate: pad pads with pipeflow's own collate; drop fn (got fn={fn!r})"
            raise ValueError(msg)
        return padded_collate(pad, pad_to_multiple_of, lengths, mask)
    options = {"pad_to_multiple_of": pad_to_multiple_of, "lengths": lengths, "mask": mask}
    for name, value in options.items():
        if value not in (None, False):
            msg = f"collate: {name} goes with pad=; pass the pad value too (got {name}={value!r})"
            raise ValueError(msg)
    if fn is None:
        return Stage(_collate_default, "collate", length="same", skip="same", traits=_DEFAULT)
    _checks.function("collate", "fn", fn, optional=True)
    return Stage(_collate_with, "collate", {"fn": fn}, length="same", skip="same")


def _collate_default(batches: Iterable[Any]) -> Iterator[Any]:
    # map, not a generator: after a failed batch, the next one is collated (the pass goes on)
    return map(_one_default, batches)


def _collate_with(batches: Iterable[Any], fn: Callable[[Any], Any]) -> Iterator[Any]:
    return map(functools.partial(_one_with, fn), batches)


def _one_default(batch: Any) -> Any:
    try:
        return default_collate(batch)
    except Exception as error:
        _hint_unbatched(error, batch)
        raise


def _one_with(fn: Callable[[Any], Any], batch: Any) -> Any:
    try:
        return fn(batch)
    except Exception as error:
        _hint_unbatched(error, batch)
        raise


def _hint_unbatched(error: Exception, batch: Any) -> None:
    """Say, in a note on *error*, what to do when collate failed on something that is not a
    list of samples: most likely one sample, with no ``pf.batch`` before ``pf.collate()``.

    Examples:
        >>> import numpy as np
        >>> import pipeflow as pf
        >>> samples = [(np.zeros(3), 0), (np.ones(3), 1)]  # (x, y) pairs
        >>> try:
        ...     list(pf.indices(2) | pf.fetch(samples) | pf.collate())
        ... except RuntimeError as e:
        ...     for note in e.__notes__:
        ...         print(note)
        ...
        pipeflow: collate takes a batch, a list of samples, but got a tuple: if that is one
        sample, put pf.batch(n) before pf.collate()
        pipeflow: stage 'collate' failed on sample index 0 (epoch 0)
    """
    if isinstance(batch, list):
        return
    note = (
        f"pipeflow: collate takes a batch, a list of samples, but got a {type(batch).__name__}"
        ": if that is one sample, put pf.batch(n) before pf.collate()"
    )
    _add_note(error, note)
