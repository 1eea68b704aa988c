"""Starting worker processes well: for fork, the heap frozen while fork workers live and the
source cache warmed once; for spawn and forkserver, the job pickled once, before any starts."""

from __future__ import annotations

import copyreg
import gc
import io
import pickle
import sys
from typing import Any, NamedTuple

__all__ = ["Freeze", "Pickled", "check_picklable", "pickled", "prepared", "warm_source_cache"]

_WARMED: list[bool] = []


def prepared(spec: Any, method: str, name: str) -> Any:
    """*spec* (a :class:`~pipeflow.parallel.pools._worker.WorkerSpec`) ready for workers of start
    *method*. For fork this process is warmed once (numpy's random module, which each worker
    seeds, imported here; the source cache read); otherwise the job and ``worker_init`` are
    pickled once, here (as :class:`Pickled`), so that one that can't be pickled fails before
    any worker starts."""
    if method == "fork":
        if "numpy" in sys.modules:
            import numpy.random  # noqa: F401
        warm_source_cache()
        return spec
    init = _pickled(spec.worker_init, "worker_init", method, name) if spec.worker_init else None
    return spec._replace(job=_pickled(spec.job, "fn", method, name), worker_init=init)


class Pickled(NamedTuple):
    """A job pickled once for every worker of a pool, but for the torch storages it holds in
    shared memory (``tensor.share_memory_()``): those travel apart, in *shared*, which
    multiprocessing pickles for each worker as it starts it, as torch's workers get their
    dataset. torch registers its reductions there: a shared storage goes as a handle to the
    same memory (not a copy), so what the main process writes into it later (an epoch
    counter, as Hugging Face's ``set_epoch`` keeps one) the workers see, as a forked one does.
    """

    data: bytes
    shared: tuple[Any, ...] = ()

    def load(self) -> Any:
        """The job, in a worker: its shared storages put back in their places."""
        _SHARED[:] = self.shared
        try:
            return pickle.loads(self.data)
        finally:
            _SHARED.clear()


_SHARED: list[Any] = []  # while a Pickled loads: its shared storages


def _shared_storage(index: int) -> Any:
    """A shared storage's place in a :class:`Pickled` job: the storage, as the worker got it."""
    return _SHARED[index]


class _JobPickler(pickle.Pickler):
    """A pickler that sets aside the torch storages in shared memory (see :class:`Pickled`).
    Only the storage types are looked up in its table, as a type is in copyreg's: the rest of
    a job pickles as it would with ``pickle.dumps``."""

    def __init__(self, file: Any, shared: list[Any], *, probe: bool = False) -> None:
        # A probe only tries: arrays' buffers stay out of its pickle, storages are left out.
        skip = (lambda _: None) if probe else None
        super().__init__(file, protocol=pickle.HIGHEST_PROTOCOL, buffer_callback=skip)
        self.shared = shared
        self.probe = probe
        torch = sys.modules.get("torch")
        table = dict(copyreg.dispatch_table)
        if torch is not None:
            for kind in (*torch._storage_classes, torch.storage.TypedStorage):
                table[kind] = self._storage
        self.dispatch_table = table

    def _storage(self, storage: Any) -> Any:
        if self.probe:  # a storage always pickles: leave its bytes out
            return (_shared_storage, (0,))
        untyped = getattr(storage, "_untyped_storage", storage)  # a TypedStorage's own
        if untyped.device.type == "cpu" and untyped.is_shared():
            self.shared.append(storage)
            return (_shared_storage, (len(self.shared) - 1,))
        return storage.__reduce_ex__(pickle.HIGHEST_PROTOCOL)


def pickled(obj: Any) -> Pickled:
    """*obj* as a :class:`Pickled`: its shared torch storages apart.

    Examples:
        >>> job = pickled({"n": 3})
        >>> job.shared, job.load()
        ((), {'n': 3})
    """
    buffer = io.BytesIO()
    shared: list[Any] = []
    _JobPickler(buffer, shared).dump(obj)
    return Pickled(buffer.getvalue(), tuple(shared))


def _pickled(obj: Any, what: str, method: str, name: str) -> Any:
    """*obj* pickled; or *obj* itself when it holds what only a starting process may
    pickle (a Lock, Event, Queue: multiprocessing pickles it then, as torch's workers get
    their dataset)."""
    try:
        return pickled(obj)
    except RuntimeError as e:
        if "through inheritance" in str(e):
            return obj
        raise _unpicklable(what, method, name, e) from e
    except Exception as e:
        raise _unpicklable(what, method, name, e) from e


def check_picklable(obj: Any, what: str, method: str, name: str) -> None:
    """Refuse, now, an *obj* that a *method* worker could not be sent: a lambda, a local
    function, an open file. Its structure is pickled to nowhere; the bytes of its arrays
    and tensors are left out, so a large in-memory dataset costs little here."""
    try:
        _JobPickler(_Sink(), [], probe=True).dump(obj)
    except RuntimeError as e:
        if "through inheritance" not in str(e):
            raise _unpicklable(what, method, name, e) from e
    except Exception as e:
        raise _unpicklable(what, method, name, e) from e


class _Sink:
    """A file that keeps nothing."""

    def write(self, data: Any) -> int:
        return len(memoryview(data))


def _unpicklable(what: str, method: str, name: str, e: Exception) -> TypeError:
    msg = (
        f"parallel stage {name!r}: {what} can't be pickled for the "
        f"{method!r} start method ({type(e).__name__}: {e}); define it at module "
        "level (not a lambda or a local function), or use the 'fork' start method"
    )
    return TypeError(msg)


def warm_source_cache() -> None:
    """Read, once, the source files a forked worker's ``torch.manual_seed`` will read.

    Until CUDA (XPU, MTIA) is initialised, ``torch.manual_seed`` queues the seed with
    ``traceback.format_stack()``, three times, and that reads every source file on the stack
    into :mod:`linecache`: ~7 ms in each new worker. A forked worker inherits this process's
    cache, so reading the files here, once, saves it in every worker.
    """
    if "torch" not in sys.modules or _WARMED:
        return
    import linecache
    import traceback

    _WARMED.append(True)
    traceback.extract_stack()  # the files on this stack, which a forked worker's stack shares
    for name in (
        "torch.random",
        "torch.cuda",
        "torch.cuda.random",
        "torch.xpu",
        "torch.xpu.random",
        "torch.mtia",
        "multiprocessing.context",
        "multiprocessing.popen_fork",
        "multiprocessing.process",
        "pipeflow.parallel.pools._worker",
    ):
        path = getattr(sys.modules.get(name), "__file__", None)
        if path:
            linecache.getlines(path)


class Freeze:
    """Freeze the heap before forking, and keep it frozen while fork workers live.

    The workers' garbage collector then never writes to the parent's objects, nor does the
    parent's while they run, so those pages stay shared instead of being copied. A freeze the
    user made is never undone. One ``Freeze`` per pool; :meth:`hold` before each fork,
    :meth:`release` when the pool closes.
    """

    holders = 0  # live pools holding a freeze
    user_froze = False  # the heap was frozen before any pool of ours froze it

    def __init__(self) -> None:
        self.holding = False

    def hold(self) -> None:
        if not self.holding:
            if Freeze.holders == 0:
                Freeze.user_froze = gc.get_freeze_count() > 0
            Freeze.holders += 1
            self.holding = True
        gc.freeze()

    def release(self) -> None:
        if self.holding:
            self.holding = False
            Freeze.holders -= 1
            if Freeze.holders == 0 and not Freeze.user_froze:
                gc.unfreeze()
