"""The warm server: a private fork server that prepares itself as a spawn worker would, and the
``Popen`` that asks it for a worker (see :mod:`pipeflow.parallel.pools._warm`).

Apart from its server process, which :func:`serve` runs, this is ``multiprocessing.forkserver``
and ``multiprocessing.popen_forkserver``: the same protocol, the same "alive" pipe (the server
exits once the main process and the workers it forked are gone).
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import io
import linecache
import os
import signal
import socket
import sys
from multiprocessing import (
    connection,
    forkserver,
    popen_forkserver,
    process,
    resource_tracker,
    spawn,
)
from multiprocessing import context as mp_context
from typing import Any

__all__ = ["new_server", "serve", "warm_popen"]

_util: Any = __import__("multiprocessing.util").util  # its internals are not in typeshed
_reduction: Any = mp_context.reduction  # type: ignore[attr-defined]


def new_server(modules: list[str]) -> Any:
    """A private ``ForkServer`` (the user's is untouched) whose process is :func:`serve`."""

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
                        cmd = "from pipeflow.parallel.pools._zygote import serve; "
                        cmd += "serve(%d, %d, %r, %r)"
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


def warm_popen(process_obj: Any, server: Any) -> Any:
    """multiprocessing's forkserver ``Popen``, asking the warm server, sending stdio and env."""

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
    from pipeflow.parallel.pools._fork import warm_source_cache

    warm_source_cache()  # the files torch.manual_seed's stack capture reads, once, here
    for name in ("multiprocessing.spawn", "multiprocessing.forkserver"):
        linecache.getlines(getattr(sys.modules.get(name), "__file__", None) or "")
    gc.collect()
    gc.freeze()  # the workers' collectors then leave the pages they share alone
    sys.stdout.flush()
    sys.stderr.flush()
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:  # until the main process and every worker it forked are gone
        forkserver.main(listener_fd, alive_r, [])
    finally:  # nothing to tear down: exit now, not after unloading torch (tenths of a second)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
