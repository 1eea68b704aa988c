"""Warm starts: spawn and forkserver workers forked from a server that imported, once, what a
new worker would import.

A spawn worker is a new interpreter: it runs the main script as ``__mp_main__`` and imports the
modules its job needs, torch included, over a second per worker and per loader. The *warm
server* does that once per process. It is a private ``multiprocessing.forkserver.ForkServer``
(the user's own forkserver and its preload list are untouched) whose process prepares itself
as a spawn worker would (``sys.path``, ``argv``, the working directory, the main script as
``__mp_main__``), imports the modules the first job's pickle names, and torch and numpy when
this process has them, then forks one worker per request. It runs no job and unpickles nothing
of a loader: a worker starts from a process that has only imported modules, then unpickles its
job, seeds, sets its worker info and runs ``worker_init`` as a spawn worker does. What may
have changed since the server started comes with each request: the environment, stdout and
stderr, ``sys.path`` and the working directory.

Off with ``PIPEFLOW_WARM_START=0`` or :func:`set_warm_start`; never on Windows. Should the
server fail (or the main script initialise CUDA when imported), pools fall back to plain spawn
or forkserver for the rest of the process, with a warning.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import linecache
import multiprocessing
import os
import pickletools
import signal
import socket
import sys
import threading
import time
import warnings
from multiprocessing import context as mp_context
from multiprocessing import process, spawn
from typing import Any

from pipeflow import _checks

__all__ = [
    "ENV",
    "active",
    "ensure_running",
    "pickled_modules",
    "serve",
    "set_warm_start",
    "warm_context",
]

#: The environment variable that turns the warm start off (``0``, ``false``, ``no``, ``off``).
ENV = "PIPEFLOW_WARM_START"
AVAILABLE = sys.platform != "win32" and "forkserver" in multiprocessing.get_all_start_methods()
SCAN_OPS = 200_000  # a job's pickle is scanned for module names this far, at most
_STATE: dict[str, Any] = {"choice": None, "server": None, "broken": False}
_LOCK = threading.Lock()
# multiprocessing's internals, which typeshed leaves out
_util: Any = __import__("multiprocessing.util").util
_reduction: Any = mp_context.reduction  # type: ignore[attr-defined]


def set_warm_start(enabled: bool | None) -> None:
    """Turn the warm start of spawn and forkserver workers on or off in this process.

    On by default on POSIX: the workers of spawn and forkserver pools fork from a server that
    imported the main script, torch and the dataset's modules once, instead of importing them
    again for every loader. ``True`` or ``False`` overrides the environment variable
    ``PIPEFLOW_WARM_START`` (``0`` turns it off); ``None`` follows it again. Turning it off
    stops the server once its workers have stopped; pools started afterwards use plain spawn
    or forkserver.

    Examples:
        >>> import pipeflow as pf
        >>> pf.set_warm_start(False)  # plain spawn workers from now on
        >>> pf.set_warm_start(None)  # as PIPEFLOW_WARM_START says (on when it is unset)
    """
    if enabled is not None:
        _checks.boolean("set_warm_start", "enabled", enabled)
    _STATE["choice"] = enabled
    if not active():
        _stop()


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
            return _warm_popen(process_obj, server)
        except (OSError, EOFError) as e:
            _give_up(f"{type(e).__name__}: {e}", process_obj._start_method)
    plain = "forkserver" if process_obj._start_method == "forkserver" else "spawn_posix"
    return importlib.import_module(f"multiprocessing.popen_{plain}").Popen(process_obj)


def ensure_running() -> None:
    """Start the warm server now, if the warm start is on (a test suite does, before it counts
    processes and file descriptors)."""
    server = _server(None)
    if server is not None:
        server.ensure_running()


def _server(process_obj: Any) -> Any:
    with _LOCK:
        if not active():
            return None
        server = _STATE["server"]
        if server is None or server.owner != os.getpid():  # none yet, or a fork's parent's
            server = _STATE["server"] = _new_server(_preload(process_obj))
            _util.Finalize(server, _stop_server, args=(server,), exitpriority=-10)
        return server


def _preload(process_obj: Any) -> list[str]:
    """What the server imports: what a worker of this process would, or does anyway."""
    names: list[str] = [m for m in ("numpy", "torch") if m in sys.modules]
    names.append("pipeflow.parallel._worker")
    if process_obj is None:
        return names
    if process_obj._start_method == "forkserver":  # the user's own preload list, if any
        from multiprocessing import forkserver

        names += getattr(forkserver._forkserver, "_preload_modules", [])
    for arg in process_obj._args:
        if isinstance(arg, bytes):
            names += sorted(pickled_modules(arg))
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


def _new_server(modules: list[str]) -> Any:
    """A private ``ForkServer`` (the user's is untouched) whose process is :func:`serve`."""
    from multiprocessing import connection, forkserver, resource_tracker

    class Server(forkserver.ForkServer):
        owner = os.getpid()

        def ensure_running(self) -> None:
            self_: Any = self
            with self_._lock:
                resource_tracker.ensure_running()
                if self_._forkserver_pid is not None:
                    if os.waitpid(self_._forkserver_pid, os.WNOHANG)[0]:
                        raise EOFError("the warm server exited")
                    return
                data = spawn.get_preparation_data("pipeflow-warm-server")
                keys = ("sys_path", "sys_argv", "dir", "orig_dir")
                keep = {k: v for k, v in data.items() if k in keys or k.startswith("init_main")}
                with socket.socket(socket.AF_UNIX) as listener:
                    address = connection.arbitrary_address("AF_UNIX")  # type: ignore[attr-defined]
                    listener.bind(address)
                    if not _util.is_abstract_socket_namespace(address):
                        os.chmod(address, 0o600)
                    listener.listen()
                    alive_r, alive_w = os.pipe()
                    try:
                        fds = (listener.fileno(), alive_r)
                        cmd = "from pipeflow.parallel._warm import serve; serve(%d, %d, %r, %r)"
                        cmd = cmd % (*fds, keep, modules) + "  # pipeflow's warm forkserver"
                        exe = spawn.get_executable()
                        flags = _util._args_from_interpreter_flags()
                        pid = _util.spawnv_passfds(exe, [exe, *flags, "-c", cmd], list(fds))
                    except BaseException:
                        os.close(alive_w)
                        raise
                    finally:
                        os.close(alive_r)
                self_._forkserver_address = address
                self_._forkserver_alive_fd = alive_w
                self_._forkserver_pid = pid

    return Server()


def _warm_popen(process_obj: Any, server: Any) -> Any:
    """multiprocessing's forkserver ``Popen``, asking the warm server, sending stdio and env."""
    from multiprocessing import forkserver, popen_forkserver

    class Popen(popen_forkserver.Popen):
        def _launch(self, process_obj: Any) -> None:
            self_: Any = self
            process_obj._pf_environ = dict(os.environ)
            process_obj._pf_stdio = tuple(
                self_.duplicate_for_child(fd) if _is_open(fd) else None for fd in (1, 2)
            )
            buf = io.BytesIO()
            mp_context.set_spawning_popen(self)
            try:
                _reduction.dump(spawn.get_preparation_data(process_obj._name), buf)
                _reduction.dump(process_obj, buf)
            finally:
                mp_context.set_spawning_popen(None)
                del process_obj._pf_environ, process_obj._pf_stdio
            self_.sentinel, w = server.connect_to_new_process(self_._fds)
            parent_w = os.dup(w)  # the child's sentinel of this process, as multiprocessing's
            self_.finalizer = _util.Finalize(self, _util.close_fds, (parent_w, self_.sentinel))
            with open(w, "wb", closefd=True) as f:
                f.write(buf.getbuffer())
            self_.pid = forkserver.read_signed(self_.sentinel)

    return Popen(process_obj)


def _is_open(fd: int) -> bool:
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True


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
        server, _STATE["server"] = _STATE["server"], None
    if server is not None:
        _stop_server(server)


def _stop_server(server: Any, wait: float = 1.0) -> None:
    """Close the server's "alive" pipe: it exits once its live workers have stopped too."""
    if server.owner != os.getpid() or server._forkserver_alive_fd is None:
        return
    os.close(server._forkserver_alive_fd)
    server._forkserver_alive_fd = None
    pid, deadline = server._forkserver_pid, time.monotonic() + wait
    while pid is not None:
        with contextlib.suppress(ChildProcessError):
            if os.waitpid(pid, os.WNOHANG)[0] == 0 and time.monotonic() < deadline:
                time.sleep(0.01)
                continue
        break


# -- the server's side ----------------------------------------------------------------------
def serve(listener_fd: int, alive_r: int, data: dict[str, Any], modules: list[str]) -> None:
    """The warm server's life: prepare as a spawn worker would, then fork a worker a request."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is for the main process
    me: Any = process.current_process()
    me._inheriting = True  # starting a process while importing main fails, as under spawn
    try:  # sys.path, argv, the working directory, the main script as __mp_main__
        spawn.prepare(data)
    except BaseException:  # a worker's own prepare() fails the same way, and says so
        pass
    finally:
        del me._inheriting
    for name in modules:
        with contextlib.suppress(BaseException):
            importlib.import_module(name)
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_initialized():
        sys.stderr.write(
            "pipeflow: the main script initialised CUDA when imported: no warm start\n"
        )
        os._exit(3)  # a forked worker could not use CUDA; the pools fall back to plain spawn
    from pipeflow.parallel._fork import warm_source_cache

    warm_source_cache()  # the files torch.manual_seed's stack capture reads, once, here
    for name in ("multiprocessing.spawn", "multiprocessing.forkserver"):
        linecache.getlines(getattr(sys.modules.get(name), "__file__", None) or "")
    gc.collect()
    gc.freeze()  # the workers' collectors then leave the pages they share alone
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    from multiprocessing import forkserver

    forkserver.main(listener_fd, alive_r, [])
