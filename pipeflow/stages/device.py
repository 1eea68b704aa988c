"""Feeding the accelerator: pinned host memory, and copies to the device that overlap compute."""

from __future__ import annotations

import queue
import threading
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any, TypeVar

from pipeflow import _checks
from pipeflow.engine._failure import Failure
from pipeflow.engine._stage import Stage
from pipeflow.resume.state import Rule

__all__ = ["pin_memory", "to_device"]

T = TypeVar("T")

_WARNED = threading.Event()
_STOP_POLL = 0.05


def _tree_map(fn: Callable[[Any], Any], data: Any, leaf: Callable[[Any], bool]) -> Any:
    """Apply *fn* to every leaf of a nested batch, rebuilding containers as they were."""
    if leaf(data):
        return fn(data)
    if isinstance(data, (str, bytes)):
        return data
    if isinstance(data, Mapping):
        values = {k: _tree_map(fn, v, leaf) for k, v in data.items()}
        try:
            return type(data)(values)  # type: ignore[call-arg]
        except TypeError:
            return values
    if isinstance(data, tuple) and hasattr(data, "_fields"):  # namedtuple
        return type(data)(*(_tree_map(fn, v, leaf) for v in data))
    if isinstance(data, (list, tuple)):
        return type(data)(_tree_map(fn, v, leaf) for v in data)
    return data


# -- pin_memory ----------------------------------------------------------------------------------
def pin_memory(*, prefetch: int = 2) -> Stage[T, T]:
    """Copy every tensor of each batch into pinned (page-locked) host memory, in a thread.

    Pinned memory lets the copy to the GPU run asynchronously (``non_blocking=True``). Nested
    batches are walked — dicts, lists, tuples, namedtuples — and any object with a
    ``pin_memory()`` method has it called, as torch's DataLoader does. Pinning runs in a
    background thread at most *prefetch* batches ahead, so it overlaps the training step.

    Without an accelerator there is nothing to pin for: the stage warns once and passes the
    batches through unchanged.

    Args:
        prefetch: batches pinned ahead of the consumer (at least 1).

    Raises:
        TypeError: if *prefetch* is not an integer.
        ValueError: if *prefetch* < 1.

    Examples:
        >>> import pipeflow as pf
        >>> pf.pin_memory()
        pin_memory(prefetch=2)
    """
    prefetch = _checks.integer("pin_memory", "prefetch", prefetch, low=1)
    config = {"prefetch": prefetch}
    return Stage(_pin_memory, "pin_memory", config, length="same", resume=_AHEAD, failures="pass")


#: It reads its input ahead of its consumer, in a thread: a map that reads ahead.
_AHEAD = Rule.below("same", reads_ahead=True)


def _accelerator() -> bool:
    import torch

    acc = getattr(torch, "accelerator", None)
    if acc is not None:
        return bool(acc.is_available())
    return bool(torch.cuda.is_available())  # pragma: no cover - torch < 2.6


def _pin_one(data: Any) -> Any:
    import torch

    def leaf(x: Any) -> bool:
        return isinstance(x, torch.Tensor) or (
            callable(getattr(x, "pin_memory", None)) and not isinstance(x, (list, tuple, dict))
        )

    return _tree_map(lambda x: x.pin_memory(), data, leaf)


def _pin_memory(batches: Iterable[T], prefetch: int) -> Iterator[T]:
    if not _accelerator():
        if not _WARNED.is_set():
            _WARNED.set()
            warnings.warn(
                "pin_memory: no accelerator is available, so batches pass through unpinned",
                stacklevel=2,
            )
        yield from batches
        return
    yield from in_thread(batches, _pin_one, prefetch, name="pipeflow-pin_memory")


def in_thread(
    items: Iterable[Any], fn: Callable[[Any], Any], depth: int, *, name: str
) -> Iterator[Any]:
    """Pull *items* and apply *fn* in a background thread, at most *depth* items ahead.

    Order is kept; an exception from *items* or *fn* is raised in the consumer (its own type
    and traceback); closing the iterator stops the thread and closes *items* within ~0.1 s
    unless upstream is itself blocked.
    """
    out: queue.Queue[tuple[str, Any]] = queue.Queue(maxsize=depth)
    stop = threading.Event()
    thread = threading.Thread(
        target=_apply_ahead, args=(items, fn, out, stop), name=name, daemon=True
    )
    thread.start()
    try:
        while True:
            kind, value = out.get()
            if kind == "item":
                yield value
            elif kind == "end":
                return
            else:
                raise value
    finally:
        stop.set()
        thread.join(timeout=2.0)


def _apply_ahead(
    items: Iterable[Any],
    fn: Callable[[Any], Any],
    out: queue.Queue[tuple[str, Any]],
    stop: threading.Event,
) -> None:
    """:func:`in_thread`'s thread: put ``("item", fn(item))`` for each item in *out*, then
    ``("end", None)``, or ``("error", e)`` for what *items* raised; until *stop* is set."""
    it = iter(items)
    try:
        for item in it:
            if item.__class__ is not Failure:  # a failed item passes on, in its place
                try:
                    item = fn(item)
                except Exception as e:  # that item failed; the next one goes on
                    item = Failure(e)
            msg = ("item", item)
            while not stop.is_set():  # _put, inline: this runs once per item
                try:
                    out.put(msg, timeout=_STOP_POLL)
                    break
                except queue.Full:
                    continue
            if stop.is_set():
                return
        _put(out, stop, ("end", None))
    except BaseException as e:
        _put(out, stop, ("error", e))
    finally:
        close = getattr(it, "close", None)
        if close is not None:
            close()


def _put(out: queue.Queue[tuple[str, Any]], stop: threading.Event, msg: tuple[str, Any]) -> None:
    """Put *msg* in *out*, waiting for room until *stop* is set."""
    while not stop.is_set():
        try:
            out.put(msg, timeout=_STOP_POLL)
            return
        except queue.Full:
            continue


# -- to_device ------------------------------------------------------------------------------------
def to_device(device: Any, *, non_blocking: bool = True) -> Stage[T, T]:
    """Move every tensor of each batch to *device*.

    On CUDA the copy of batch *i + 1* is issued on a side stream before batch *i* is handed
    over, so it overlaps the training step on batch *i*; the consumer's stream waits on an
    event recorded after the copy, so no tensor is read before it has arrived, and each
    tensor is marked as used by the consumer's stream, so its memory is not reused too early.
    Put :func:`pin_memory` before it for truly asynchronous copies.

    Args:
        device: a ``torch.device`` or a string such as ``"cuda"``, ``"cuda:1"`` or ``"cpu"``.
        non_blocking: pass ``non_blocking`` to ``Tensor.to``.

    Raises:
        TypeError: if *non_blocking* is not a bool.
        ValueError: if *device* is not a device torch understands.

    Examples:
        >>> import torch, pipeflow as pf
        >>> batches = pf.from_iterable([{"x": torch.ones(2)}]) | pf.to_device("cpu")
        >>> next(iter(batches))["x"].device
        device(type='cpu')
    """
    import torch

    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError, OverflowError) as e:  # a huge index: Value
        msg = f"to_device: device must be a torch device or its name (got {device!r})"
        raise ValueError(msg) from e
    _checks.boolean("to_device", "non_blocking", non_blocking)
    config = {"device": str(dev), "non_blocking": non_blocking}
    return Stage(_to_device, "to_device", config, length="same", skip="same")


def _is_tensor(x: Any) -> bool:
    import torch

    return isinstance(x, torch.Tensor)


def _to_device(batches: Iterable[T], device: str, non_blocking: bool) -> Iterator[T]:
    import torch

    dev = torch.device(device)

    def move(batch: Any) -> Any:
        return _tree_map(lambda t: t.to(dev, non_blocking=non_blocking), batch, _is_tensor)

    if dev.type != "cuda":
        yield from map(move, batches)
        return
    side = torch.cuda.Stream(device=dev)  # type: ignore[no-untyped-call]

    def start(batch: Any) -> tuple[Any, Any]:
        with torch.cuda.stream(side):
            moved = move(batch)
            done = torch.cuda.Event()  # type: ignore[no-untyped-call]
            done.record(side)
        return moved, done

    it = iter(batches)
    try:
        ahead = start(next(it))
    except StopIteration:
        return
    for batch in it:
        current, done = ahead
        ahead = start(batch)  # batch i + 1 copies while the consumer works on batch i
        yield _handover(current, done, dev)
    yield _handover(*ahead, dev)


def _handover(batch: Any, done: Any, dev: Any) -> Any:
    import torch

    consumer = torch.cuda.current_stream(dev)
    consumer.wait_event(done)  # no use before the copy has finished

    def mark(t: Any) -> Any:
        t.record_stream(consumer)  # memory from the side stream, used on the consumer's
        return t

    return _tree_map(mark, batch, _is_tensor)
