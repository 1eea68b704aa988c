"""Where worker processes can't start, and what to write instead.

Two mistakes stop a process pool before it runs anything, and Python's own words for them
don't say what to do:

- **Worker processes inside a worker process.** A worker is a daemonic process, and
  ``multiprocessing`` refuses it children (``AssertionError: daemonic processes are not
  allowed to have children``). :func:`refuse_nested` says which stage and which worker, and
  that the inner stage wants threads.
- **No ``if __name__ == "__main__":`` guard under spawn or forkserver.** Each worker imports
  the main script again; if its top level starts workers, each worker tries to start workers
  while it starts, ``multiprocessing`` raises a 40-line ``RuntimeError`` in every worker, and
  the main process only sees workers exit with code 1. Here, a worker that finds itself
  importing the main script says so in one line and exits (:func:`stop_if_importing_main`),
  and the main process's error names the script's line that started the workers and says
  where it must go (:func:`started_from`, :func:`death_hint`).
"""

from __future__ import annotations

import ast
import multiprocessing
import os
import sys
from typing import NamedTuple

__all__ = ["Start", "death_hint", "refuse_nested", "started_from", "stop_if_importing_main"]

_GUARD = 'if __name__ == "__main__":'
_WARM_SERVER = "pipeflow-warm-server"  # the name pipeflow's warm fork server prepares under


def refuse_nested(stage: str) -> None:
    """Raise when this process is a worker process (daemonic), which can't start workers.

    Raises:
        PipeflowError: naming *stage*, this process and the fix.
    """
    me = multiprocessing.current_process()
    if not me.daemon:
        return
    from pipeflow.errors import PipeflowError

    msg = (
        f"parallel stage {stage!r} can't start worker processes here: this process is itself "
        f"a worker process ({me.name!r}, pid {os.getpid()}), and a worker process may not "
        "have children. Give the inner stage backend='thread' (or workers=0): the outer "
        "stage's worker processes already run it in parallel"
    )
    raise PipeflowError(msg)


def stop_if_importing_main(stage: str) -> None:
    """Exit at once, saying why in one line, when this process is a spawned worker that is
    importing the main script, whose top level starts worker processes.

    ``multiprocessing`` would raise its long ``RuntimeError`` (printed by every worker); the
    main process's :class:`~pipeflow.WorkerDiedError` says what to do instead.
    """
    me = multiprocessing.current_process()
    if not getattr(me, "_inheriting", False):
        return
    if me.name != _WARM_SERVER:  # the warm server imports the script too, and goes on
        running = sys.modules.get("__mp_main__") or sys.modules.get("__main__")
        script = getattr(running, "__file__", None) or "the main script"
        sys.stderr.write(
            f"pipeflow: worker process {os.getpid()} stops: it imports {script} again, as "
            f"spawned workers do, and there {stage!r} starts worker processes outside "
            f"`{_GUARD}`\n"
        )
    raise SystemExit(1)


class Start(NamedTuple):
    """Where in the main script a process pool was started: its file and line, as the frame
    running the script's top level stood."""

    path: str
    line: int


def started_from() -> Start | None:
    """The main script's top-level line that is running now (that started the pool), or
    ``None`` when there is none (an interactive session, a pool started from a thread)."""
    main = sys.modules.get("__main__")
    namespace = getattr(main, "__dict__", None)
    frame = sys._getframe(1)
    while frame is not None:
        if frame.f_globals is namespace and frame.f_code.co_name == "<module>":
            return Start(frame.f_code.co_filename, frame.f_lineno)
        frame = frame.f_back  # type: ignore[assignment]
    return None


def guarded(start: Start) -> bool | None:
    """Whether *start*'s line lies under an ``if`` on ``__name__`` in its script (``None``:
    the script can't be read as Python)."""
    try:
        with open(start.path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
    except (OSError, SyntaxError, ValueError):
        return None
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and "__name__" in ast.unparse(node.test)
            and node.lineno <= start.line <= (node.end_lineno or node.lineno)
        ):
            return True
    return False


def death_hint(method: str, start: Start | None) -> str:
    """What to add to the error for a worker that died while starting, before it took a
    task: under spawn and forkserver, the guard it most likely needs."""
    if method == "fork":
        return ""
    if start is not None and guarded(start) is False:
        name = os.path.basename(start.path)
        return (
            f". Under {method!r} each worker imports the main script ({name}) again, and its "
            f"line {start.line}, which started these workers, is not under `{_GUARD}`: "
            "every worker would start workers of its own. Put the code that iterates the "
            f"loader under that guard (functions and the loader itself may stay above it)"
        )
    return (
        f". Under {method!r} each worker imports the main script again: what it printed "
        f"above says why it stopped (code that starts workers must be under `{_GUARD}`)"
    )
