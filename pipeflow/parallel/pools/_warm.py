"""Warm starts: spawn and forkserver workers forked from a server that imported, once, what a
new worker would import (the main script as ``__mp_main__``, the first job's modules, torch).

There are up to two servers: one for jobs whose spawn worker would import torch (their pickle
names torch, or a module it names, or the main script, imports from torch) and one, which does
not preload torch, for the others; so a torch-free job's workers stay torch-free, as spawn's
would, and collate without torch.

The server is a private ``multiprocessing.forkserver.ForkServer`` (the user's forkserver and its
preload list are untouched). It runs no job and unpickles nothing of a loader: a worker forks
from a process that has only imported modules, then unpickles its job, seeds, sets its worker
info and runs ``worker_init`` as a spawn worker does. What may have changed since the server
started comes with each request: the environment, stdout and stderr, ``sys.path`` and the
working directory. Off with ``PIPEFLOW_WARM_START=0`` or :func:`set_warm_start`; never on
Windows; should the server fail, pools fall back to plain spawn or forkserver, with a warning.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import pickletools
import sys
import threading
import time
import types
import warnings
from multiprocessing import context as mp_context
from multiprocessing import process
from typing import Any

from pipeflow import _checks
from pipeflow.parallel.pools._fork import Pickled

__all__ = ["ENV", "active", "ensure_running", "set_warm_start", "warm_context"]

#: The environment variable that turns the warm start off (``0``, ``false``, ``no``, ``off``).
ENV = "PIPEFLOW_WARM_START"
AVAILABLE = sys.platform != "win32" and "forkserver" in multiprocessing.get_all_start_methods()
SCAN_OPS = 200_000  # a job's pickle is scanned for module names this far, at most
_STATE: dict[str, Any] = {"choice": None, "servers": {}, "broken": False}
_MODULES: dict[int, frozenset[str]] = {}  # a job pickle's hash -> the modules it names
_LOCK = threading.Lock()
_util: Any = __import__("multiprocessing.util").util  # its internals are not in typeshed


def set_warm_start(enabled: bool | None) -> None:
    """Turn the warm start of spawn and forkserver workers on or off in this process.

    On by default on POSIX: the workers of spawn and forkserver pools fork from a server that
    imported the main script, torch and the dataset's modules once, instead of importing them
    again for every loader. ``True`` or ``False`` overrides the environment variable
    ``PIPEFLOW_WARM_START`` (``0`` turns it off); ``None`` follows it again. Pools started
    afterwards use plain spawn or forkserver; a server already started stays, idle, until the
    process exits (pools already started keep their workers).

    Examples:
        >>> import pipeflow as pf
        >>> pf.set_warm_start(False)  # plain spawn workers from now on
        >>> pf.set_warm_start(None)  # as PIPEFLOW_WARM_START says (on when it is unset)
    """
    if enabled is not None:
        _checks.boolean("set_warm_start", "enabled", enabled)
    _STATE["choice"] = enabled


def active() -> bool:
    """Whether spawn and forkserver pools start their workers from the warm server now."""
    if not AVAILABLE or _STATE["broken"]:
        return False
    if _STATE["choice"] is not None:
        return bool(_STATE["choice"])
    return os.environ.get(ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def warm_context(context: Any) -> Any:
    """*context*, or its warm twin when it is spawn or forkserver and the warm start is on."""
    method = context.get_start_method()
    if method not in ("spawn", "forkserver") or not active():
        return context
    return _CONTEXTS[method]


# -- the main process's side ------------------------------------------------------------------
class WarmProcess(process.BaseProcess):
    """A process the warm server forks; it takes this process's environment and stdio."""

    _start_method = "spawn"  # the plain method, should the warm server fail

    @staticmethod
    def _Popen(process_obj: Any) -> Any:  # noqa: N802 (multiprocessing's name)
        return _popen(process_obj)

    def run(self) -> None:
        env = self.__dict__.pop("_pf_environ", None)
        if env is not None:  # the environment as it is now in the main process, not at start
            os.environ.clear()
            os.environ.update(env)
        stdio = self.__dict__.pop("_pf_stdio", None)
        if stdio is not None:  # its stdout and stderr, as a spawn worker would inherit them
            from multiprocessing import forkserver

            fds = forkserver.get_inherited_fds() or []
            for target, index in zip((1, 2), stdio):
                if index is not None:
                    os.dup2(fds[index], target)
                    os.close(fds[index])
        super().run()


class _WarmForkserverProcess(WarmProcess):
    _start_method = "forkserver"


class WarmContext(mp_context.BaseContext):
    """A spawn or forkserver context whose processes the warm server forks."""

    def __init__(self, method: str, process_class: type[WarmProcess]) -> None:
        self._name = method
        self.Process = process_class


_CONTEXTS = {
    "spawn": WarmContext("spawn", WarmProcess),
    "forkserver": WarmContext("forkserver", _WarmForkserverProcess),
}


def _popen(process_obj: Any) -> Any:
    server = _server(process_obj)
    if server is not None:
        try:
            return _zygote().warm_popen(process_obj, server)
        except (OSError, EOFError) as e:
            _give_up(f"{type(e).__name__}: {e}", process_obj._start_method)
    plain = "forkserver" if process_obj._start_method == "forkserver" else "spawn_posix"
    return importlib.import_module(f"multiprocessing.popen_{plain}").Popen(process_obj)


def ensure_running(torch: bool = False) -> None:
    """Start the warm server now, if the warm start is on (a test suite does, before it counts
    processes and file descriptors): the one for jobs that need *torch*, or for those that don't.
    """
    server = _server(None, torch)
    if server is not None:
        server.ensure_running()


def _server(process_obj: Any, torch: bool | None = None) -> Any:
    with _LOCK:
        if not active():
            return None
        modules = _job_modules(process_obj)
        if torch is None:
            torch = _needs_torch(modules)
        server = _STATE["servers"].get(torch)
        if server is None or server.owner != os.getpid():  # none yet, or a fork's parent's
            server = _zygote().new_server(_preload(modules, torch))
            _STATE["servers"][torch] = server
            _util.Finalize(server, _stop_server, args=(server,), exitpriority=-10)
        return server


def _job_modules(process_obj: Any) -> list[str]:
    """The modules a new worker for *process_obj* imports: those its job names, the user's
    forkserver preload list."""
    names: list[str] = []
    if process_obj is None:
        return names
    if process_obj._start_method == "forkserver":  # the user's own preload list, if any
        from multiprocessing import forkserver

        names += getattr(forkserver._forkserver, "_preload_modules", [])
    args = process_obj._args  # a pool's worker: (conn, WorkerSpec), the job maybe pickled
    for arg in [a for x in args for a in (x if isinstance(x, tuple) else (x,))]:
        if isinstance(arg, Pickled):
            key = hash(arg.data)  # a pool's workers share one job pickle: scan it once
            if key not in _MODULES:
                if len(_MODULES) > 64:
                    _MODULES.clear()
                _MODULES[key] = frozenset(pickled_modules(arg.data))
            names += sorted(_MODULES[key])
    return names


def _needs_torch(modules: list[str]) -> bool:
    """Whether a spawn worker importing *modules* (and the main script) would import torch: one
    of them is torch's, or imports from torch itself."""
    if "torch" not in sys.modules:
        return False
    names = list(modules)
    main = sys.modules.get("__main__")
    spec = getattr(main, "__spec__", None)
    if getattr(main, "__file__", None) and not getattr(spec, "name", "").endswith(".__main__"):
        names.append("__main__")  # spawn imports the main script again (not a package's)
    for name in names:
        if name.partition(".")[0] == "torch":
            return True
        module = sys.modules.get(name)
        if module is not None and any(_from_torch(v) for v in list(vars(module).values())):
            return True
    return False


def _from_torch(value: Any) -> bool:
    try:
        name = value.__name__ if isinstance(value, types.ModuleType) else value.__module__
        return isinstance(name, str) and name.partition(".")[0] == "torch"
    except Exception:  # an object without a module, or one whose attributes raise
        return False


def _preload(modules: list[str], torch: bool) -> list[str]:
    """What a server imports: what a worker of this process would, or does anyway."""
    names: list[str] = [m for m in ("numpy",) if m in sys.modules]
    names += ["torch"] if torch else []
    names += ["pipeflow.parallel.pools._worker", *modules]
    return list(dict.fromkeys(n for n in names if n not in ("__main__", "__mp_main__")))


def pickled_modules(data: bytes) -> set[str]:
    """The modules that unpickling *data* imports (those its globals come from).

    Examples:
        >>> import collections, pickle
        >>> sorted(pickled_modules(pickle.dumps([collections.OrderedDict, os.path.join])))
        ['collections', 'posixpath']
    """
    found: set[str] = set()
    pushed: list[Any] = [None, None]  # what the last two ops pushed, when strings
    memo: dict[int, Any] = {}
    try:
        for count, (op, arg, _) in enumerate(pickletools.genops(data)):
            if count > SCAN_OPS:
                break
            del pushed[:-2]
            name = op.name
            if name in ("GLOBAL", "INST"):
                found.add(str(arg).split(" ", 1)[0])
            elif name == "STACK_GLOBAL":
                found.update(m for m in pushed[-2:-1] if isinstance(m, str))
                pushed.append(None)
            elif name == "MEMOIZE":
                memo[len(memo)] = pushed[-1]
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[int(str(arg))] = pushed[-1]
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                pushed.append(memo.get(int(str(arg))))
            else:
                pushed.append(arg if isinstance(arg, str) and "UNICODE" in name else None)
    except Exception:  # not a pickle after all: what was found is all there is
        pass
    return found


def _give_up(reason: str, method: str) -> None:
    with _LOCK:
        _STATE["broken"] = True
    _stop()
    msg = (
        f"pipeflow: the warm start of worker processes failed ({reason}); workers start with "
        f"plain {method} from now on"
    )
    warnings.warn(msg, RuntimeWarning, stacklevel=5)


def _stop() -> None:
    with _LOCK:
        servers = list(_STATE["servers"].values())
        _STATE["servers"].clear()
    for server in servers:
        _stop_server(server)


def _stop_server(server: Any, wait: float = 0.5) -> None:
    """Close the server's "alive" pipe, and reap it: it exits at once, or, if warm workers
    still run, when they have stopped too (then it is reaped at exit)."""
    if server.owner != os.getpid():
        return
    if server._forkserver_alive_fd is not None:
        os.close(server._forkserver_alive_fd)
        server._forkserver_alive_fd = None
    deadline = time.monotonic() + wait
    while server._forkserver_pid is not None:
        try:
            if os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0:
                if time.monotonic() < deadline:
                    time.sleep(0.01)
                    continue
                return
        except ChildProcessError:
            pass
        server._forkserver_pid = None


def _zygote() -> Any:
    from pipeflow.parallel.pools import _zygote

    return _zygote
