"""A progress bar for a loader: items/s, and the time left when the length is known."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Iterable, Iterator
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._context import Context
from pipeflow.engine._stage import Stage

__all__ = ["progress"]

T = TypeVar("T")


def progress(
    *, desc: str | None = None, unit: str = "it", total: int | None = None, force: bool = False
) -> Stage[T, T]:
    """Show a progress bar (tqdm) as items pass: the count, items per second, and the ETA.

    Put it last in a loader. The total is the loader's length at this point when it can be
    computed (else give *total*); a resumed pass starts the bar where it resumed. The bar is
    off when output is not a terminal (a log file, CI), unless *force*.

    Args:
        desc: the bar's label; default ``"epoch <n>"``.
        unit: what an item is called (``"batch"``, ``"img"``...).
        total: the number of items, when the loader can't tell.
        force: show the bar even when output is not a terminal.

    Raises:
        TypeError: for arguments of the wrong type.
        ValueError: if *total* is negative.

    Examples:
        >>> import pipeflow as pf
        >>> loader = pf.indices(100) | pf.batch(10) | pf.progress(unit="batch")
        >>> len(list(loader))  # no bar here: doctest output is not a terminal
        10
    """
    if desc is not None and not isinstance(desc, str):
        msg = f"progress: desc must be a string or None (got {desc!r})"
        raise TypeError(msg)
    if not isinstance(unit, str):
        msg = f"progress: unit must be a string (got {unit!r})"
        raise TypeError(msg)
    total = _checks.optional_integer("progress", "total", total, low=0)
    _checks.boolean("progress", "force", force)
    config = {"desc": desc, "unit": unit, "total": total, "force": force}
    return Stage(_progress, "progress", config, length="same", skip="same")


def _progress(
    items: Iterable[T],
    desc: str | None,
    unit: str,
    total: int | None,
    force: bool,
    *,
    context: Context,
) -> Iterator[T]:
    if not force and not (hasattr(sys.stderr, "isatty") and sys.stderr.isatty()):
        yield from items  # no terminal: no bar (and no tqdm monitor thread)
        return
    from tqdm.auto import tqdm

    class _Bar(tqdm):  # type: ignore[misc]
        monitor_interval = 0  # no monitor thread, which tqdm keeps after the last bar closes

    if total is None:
        total = context.total
    bar: Any = _Bar(
        total=total,
        initial=context.offset,
        desc=desc if desc is not None else f"epoch {context.epoch}",
        unit=unit,
        disable=False,
        dynamic_ncols=True,
    )
    try:
        with _logs_above(_Bar):
            for item in items:
                bar.update(1)
                yield item
    finally:
        bar.close()


@contextlib.contextmanager
def _logs_above(bar_type: Any) -> Iterator[None]:
    """While a bar is shown, what the log writes to the terminal goes above it (through
    ``tqdm.write``), not over it: ``ignore_errors``' warning at the end of an epoch, say.

    The handlers of the root and ``"pipeflow"`` loggers that write to stdout or stderr, and
    Python's last-resort handler (which prints a warning when no handler is configured), get
    a stream that writes through *bar_type*; they are given theirs back when the bar ends.
    """
    swapped = []
    for handler in [*logging.getLogger().handlers, *logging.getLogger("pipeflow").handlers]:
        if type(handler) is logging.StreamHandler and handler.stream in (sys.stdout, sys.stderr):
            swapped.append((handler, handler.setStream(_AboveBars(handler.stream, bar_type))))
    last_resort = above = logging.lastResort
    if last_resort is not None:
        above = logging.StreamHandler(_AboveBars(sys.stderr, bar_type))
        above.setLevel(last_resort.level)
        logging.lastResort = above
    try:
        yield
    finally:
        if logging.lastResort is above:  # (not when another bar's is in place now)
            logging.lastResort = last_resort
        for handler, stream in swapped:
            handler.setStream(stream)


class _AboveBars:
    """A stream that writes through ``tqdm.write``, which clears the bars, writes, and draws
    them again below."""

    def __init__(self, stream: Any, bar_type: Any) -> None:
        self.stream = stream
        self.bar_type = bar_type

    def write(self, text: str) -> None:
        self.bar_type.write(text, file=self.stream, end="")

    def flush(self) -> None:
        self.stream.flush()
