"""Shutdown off the consumer's path: the end of a pass hands its workers' shutdown here and
returns; one daemon thread, the reaper, tells them to stop, joins them (terminating the hung
ones after a grace period) and cleans what they leave. It lingers a moment for the next
pass's shutdown (starting a thread waits for it to run: milliseconds on a busy machine), then
ends. Interpreter exit waits for it, so nothing is left behind."""

from __future__ import annotations

import atexit
import os
import queue
import threading
from collections.abc import Callable
from typing import Any

__all__ = ["LINGER", "in_background", "join_all"]

#: How long the reaper waits for more work before it ends (well under the 2 s in which the
#: reliability contract wants every thread of a closed loader gone).
LINGER = 0.25

_JOBS: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
_LOCK = threading.Lock()
_REAPER: list[threading.Thread] = []  # the reaper while it runs
_EXITING: list[bool] = []  # set once interpreter exit has begun
_HOOKED: list[bool] = []  # the exit hook is registered
#: Runs a function when the interpreter exits, before it joins threads and before any
#: ``atexit`` handler (``concurrent.futures`` uses it to the same end); ``atexit`` otherwise.
_at_exit: Callable[[Callable[[], Any]], Any] = getattr(
    threading, "_register_atexit", atexit.register
)


def _hooked() -> bool:
    """Whether interpreter exit will wait for the reaper: its hook is registered now, unless
    exit has begun (then nothing may be registered: shutdowns run in the calling thread)."""
    if not _HOOKED:
        try:
            _at_exit(_at_threading_exit)
        except RuntimeError:  # "can't register atexit after shutdown"
            return False
        _HOOKED.append(True)
    return True


def _at_threading_exit() -> None:
    join_all(exiting=True)


def in_background(reap: Callable[[], Any]) -> None:
    """Run *reap* in the reaper thread (started if it is not running); in this thread once
    interpreter exit has begun (a thread started then would not be waited for).

    Examples:
        >>> done = []
        >>> in_background(lambda: done.append(1))
        >>> join_all(1.0)
        >>> done
        [1]
    """
    if _EXITING or not _hooked():
        reap()
        return
    with _LOCK:
        _JOBS.put(reap)
        if not _REAPER:
            thread = threading.Thread(target=_serve, name="pipeflow-reaper", daemon=True)
            _REAPER.append(thread)
            thread.start()


def _serve() -> None:
    """The reaper: run shutdowns in turn until none came for :data:`LINGER` seconds."""
    while True:
        try:
            job = _JOBS.get(timeout=LINGER)
        except queue.Empty:
            with _LOCK:
                if _JOBS.empty():  # under the lock: a job put now starts a new reaper
                    _REAPER.clear()
                    return
            continue
        if job is None:  # join_all: end once what was queued before is done
            with _LOCK:
                if _JOBS.empty():
                    _REAPER.clear()
                    return
            continue
        try:
            job()
        except Exception:  # a shutdown that failed must not stop the next ones
            import logging

            logging.getLogger("pipeflow").exception("pipeflow: a pool's shutdown failed")


def _after_fork_in_child() -> None:
    """A forked child has no reaper (only the forking thread survives a fork), nor any of
    its parent's shutdowns to run: it starts its own when it closes a pool of its own."""
    global _JOBS, _LOCK
    _JOBS = queue.SimpleQueue()
    _LOCK = threading.Lock()
    _REAPER.clear()
    _HOOKED.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def join_all(timeout: float | None = None, *, exiting: bool = False) -> None:
    """Wait (up to *timeout* seconds) for every shutdown queued so far; *exiting*: the
    interpreter is exiting, so shutdowns from now on run in the calling thread."""
    if exiting:
        _EXITING.append(True)
    with _LOCK:
        thread = _REAPER[0] if _REAPER else None
        if thread is not None:
            _JOBS.put(None)
    if thread is not None and thread is not threading.current_thread():
        thread.join(timeout)
