"""The stores behind :func:`pipeflow.cache`: in the loader's memory, and in files that any
process maps.

- :class:`MemoryStore`: the loader's process (and its thread workers) keeps values as they
  are, up to ``max_bytes``; with a ``path``, each value also goes to a :class:`FileStore`
  there, which serves what memory has no room for, and the next run.
- :class:`FileStore`: one file per key, written whole under a temporary name and renamed (a
  reader sees a whole file or none), with a header that names the key, the payload's size
  and its CRC. Arrays are pickled out of band (protocol 5) and read back as views of the
  mapped file: worker processes share one copy of each sample in the page cache (in
  ``/dev/shm`` when there is no ``path``), with no copy per worker. A file whose key, size or
  CRC does not match is never served: it is recomputed and written again.

Every store counts hits, misses, the time the misses took and the bytes it stored; a worker
process's store writes its counts to a small file beside the loader's, which
:func:`tally` adds up for ``stats()``.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import hashlib
import inspect
import itertools
import mmap
import os
import pickle
import struct
import sys
import threading
import time
import zlib
from typing import Any

from pipeflow.engine._memo import MISSING, Home, alive, on_release
from pipeflow.engine._stage import Stage
from pipeflow.resume._seeds import Seeded

__all__ = ["FileStore", "MemoryStore", "fingerprint", "open_store"]

_MAGIC = b"PFC1"
_HEAD = struct.Struct("<4sIQI")  # magic, header length, payload size, payload CRC
_ALIGN = 64  # buffers start on 64-byte boundaries in the file (aligned arrays when mapped)
_COUNTS = struct.Struct("<4Q")  # hits, misses, miss ns, bytes stored


class _Counts:
    """Hits, misses, the misses' time and the bytes stored; written to *path* when given (a
    worker's counts, for the owner's :func:`tally`)."""

    def __init__(self, path: str | None = None) -> None:
        self.hits = self.misses = self.miss_ns = self.stored = 0
        self._path = path
        self._fd: int | None = None
        self._lock = threading.Lock()

    def count(self, hits: int, misses: int, ns: int) -> None:
        with self._lock:
            self.hits += hits
            self.misses += misses
            self.miss_ns += ns
        self._flush()

    def _stored(self, size: int) -> None:
        with self._lock:
            self.stored += size  # written out with the next counts

    def numbers(self) -> tuple[int, int, int, int]:
        return self.hits, self.misses, self.miss_ns, self.stored

    def _flush(self) -> None:
        if self._path is None:
            return
        if self._fd is None:
            os.makedirs(os.path.dirname(self._path), exist_ok=True)
            self._fd = os.open(self._path, os.O_CREAT | os.O_WRONLY, 0o600)
        os.pwrite(self._fd, _COUNTS.pack(*self.numbers()), 0)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class FileStore(_Counts):
    """One file per key under *root*, mapped to read (see the module's text).

    Args:
        root: the directory (made if missing).
        max_bytes: a cap on the bytes of all the files, shared by every process that
            writes there (a locked counter); ``None``: no cap.
        counts: where this process's counts go, or ``None``.
    """

    def __init__(
        self,
        root: str,
        max_bytes: int | None = None,
        counts: str | None = None,
        verify: bool = True,
    ) -> None:
        super().__init__(counts)
        self.root = root
        self.max_bytes = max_bytes
        self.verify = verify  # check each entry's CRC (a persistent one may be torn)
        os.makedirs(root, exist_ok=True)
        self._seq = itertools.count()
        if verify:
            _clear_torn_writes(root)

    def _file(self, key: Any) -> str:
        if type(key) is int:
            return os.path.join(self.root, f"i{key}")
        blob = pickle.dumps(key, protocol=4)
        return os.path.join(self.root, "h" + hashlib.blake2b(blob, digest_size=16).hexdigest())

    def get(self, key: Any) -> Any:
        path = self._file(key)
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return MISSING
        try:
            size = os.fstat(fd).st_size
            if size < _HEAD.size:
                return MISSING
            mm = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        value = _read(mm, key, self.verify)
        if value is MISSING:  # torn or foreign: recomputed, and written again
            with contextlib.suppress(OSError):
                os.unlink(path)
        return value

    def put(self, key: Any, value: Any) -> bool:
        """Write *value* under *key*; ``False`` when the cap leaves no room (or the value
        can't be pickled: it is recomputed instead)."""
        try:
            parts = _encode(key, value, self.verify)
        except Exception:  # a value that can't be pickled is computed again, never lost
            return False
        size = sum(len(p) for p in parts)
        if self.max_bytes is not None and not self._reserve(size):
            return False
        tmp = os.path.join(
            self.root, f".tmp-{os.getpid()}-{threading.get_ident()}-{next(self._seq)}"
        )
        try:
            with open(tmp, "wb") as f:
                for p in parts:
                    f.write(p)
            os.replace(tmp, self._file(key))
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            return False
        self._stored(size)
        return True

    # -- claims: a key one worker makes while the others wait for it --------------------------
    def claim(self, key: Any) -> bool:
        """Take *key* to make it (``False``: a live process has it; a dead one's claim is
        cleared and taken)."""
        path = self._file(key) + ".claim"
        for _ in range(2):
            try:
                fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
            except FileExistsError:
                owner = _claimer(path)
                if owner is not None and alive(owner):
                    return False
                with contextlib.suppress(OSError):  # its claimer died: the claim goes
                    os.unlink(path)
                continue
            with contextlib.suppress(OSError):
                os.write(fd, str(os.getpid()).encode())
            os.close(fd)
            return True
        return False

    def release(self, key: Any) -> None:
        """Give *key* back (its value is stored, or it failed)."""
        with contextlib.suppress(OSError):
            os.unlink(self._file(key) + ".claim")

    def wait(self, key: Any, make: Any) -> tuple[Any, bool]:
        """*key*'s value, stored by the worker that claimed it; made here (``True``) if that
        worker gave it back without storing it (it failed, or the cap had no room) or died."""
        delay = 0.0005
        path = self._file(key) + ".claim"
        while True:
            value = self.get(key)
            if value is not MISSING:
                return value, False
            owner = _claimer(path)
            if owner is None or not alive(owner):
                value = self.get(key)  # stored just before its claim went?
                if value is not MISSING:
                    return value, False
                if self.claim(key):
                    return _made_here(self, key, make), True
            time.sleep(delay)
            delay = min(2 * delay, 0.01)

    def _reserve(self, size: int) -> bool:
        """Take *size* bytes of the cap, shared by the processes (a counter under a lock)."""
        fd = os.open(os.path.join(self.root, ".bytes"), os.O_CREAT | os.O_RDWR, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            raw = os.pread(fd, 8, 0)
            used = int.from_bytes(raw, "little") if len(raw) == 8 else 0
            if used + size > self.max_bytes:  # type: ignore[operator]
                return False
            os.pwrite(fd, (used + size).to_bytes(8, "little"), 0)
            return True
        finally:
            os.close(fd)


def _claimer(path: str) -> int | None:
    """The process that claimed a key (its claim file's *path*), or ``None``: no claim (or
    one still being written: its pid comes at once)."""
    try:
        with open(path, "rb") as f:
            text = f.read(32)
    except OSError:
        return None
    return int(text) if text.isdigit() else os.getpid() if not text else None


def _made_here(store: Any, key: Any, make: Any) -> Any:
    """Make *key*'s value with *make*, store it, and give the claim back (even on failure)."""
    try:
        value = make()
        store.put(key, value)
        return value
    finally:
        store.release(key)


def _clear_torn_writes(root: str) -> None:
    """Remove the temporary files of writes a crash interrupted (their process is gone)."""
    for tmp in glob.glob(os.path.join(root, ".tmp-*-*-*")):
        pid = os.path.basename(tmp).split("-")[1]
        if pid.isdigit() and not alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(tmp)


def _encode(key: Any, value: Any, checksum: bool) -> list[bytes | memoryview]:
    """The file of one entry: the fixed header, the variable header, then the pickle and its
    out-of-band buffers, each on a 64-byte boundary (the payload's CRC in the header, when
    *checksum*: a persistent entry's; else 0)."""
    buffers: list[pickle.PickleBuffer] = []
    main = pickle.dumps(value, protocol=5, buffer_callback=buffers.append)
    raws = [b.raw() for b in buffers]
    lengths = [len(main), *(r.nbytes for r in raws)]
    meta = pickle.dumps((key, lengths), protocol=4)
    start = _HEAD.size + len(meta)
    first = -start % _ALIGN
    body: list[bytes | memoryview] = [b"\0" * first, main]
    at = start + first + len(main)
    for r in raws:
        pad = -at % _ALIGN
        body += [b"\0" * pad, r]
        at += pad + r.nbytes
    crc = 0
    for p in body if checksum else ():
        crc = zlib.crc32(p, crc)
    payload = at - start
    return [_HEAD.pack(_MAGIC, len(meta), payload, crc), meta, *body]


def _read(mm: mmap.mmap, key: Any, verify: bool) -> Any:
    """The value in a mapped entry file, or ``MISSING`` when it is not whole and *key*'s."""
    try:
        magic, meta_len, payload, crc = _HEAD.unpack_from(mm, 0)
        start = _HEAD.size + meta_len
        if magic != _MAGIC or len(mm) != start + payload:
            return MISSING
        stored_key, lengths = pickle.loads(mm[_HEAD.size : start])
        if stored_key != key:
            return MISSING
        view = memoryview(mm)
        if verify and zlib.crc32(view[start:]) != crc:
            return MISSING
        at = start + (-start % _ALIGN)
        main = view[at : at + lengths[0]]
        at += lengths[0]
        buffers = []
        for n in lengths[1:]:
            at += -at % _ALIGN
            buffers.append(view[at : at + n])
            at += n
        return pickle.loads(main, buffers=buffers)
    except Exception:
        return MISSING


class MemoryStore(_Counts):
    """Values as they are, in this process, up to *max_bytes*; the rest in *files* (a
    :class:`FileStore` at the cache's ``path``) or recomputed.

    Values are kept from the moment they are made, so the first epoch pays only a dict
    insert; a numpy array kept is made read-only (a stage after the cache that wrote into
    a sample would otherwise change the cache: it must copy first).
    """

    def __init__(
        self, max_bytes: int | None, files: FileStore | None, shared: str, slot: str
    ) -> None:
        super().__init__()
        self.shared, self.slot = shared, slot  # where worker processes' counts are
        self.claims: dict[Any, threading.Event] = {}  # keys a thread makes; others wait
        self.data: dict[Any, Any] = {}
        self.held = 0
        self.max_bytes = max_bytes
        self.files = files

    def get(self, key: Any) -> Any:
        value = self.data.get(key, MISSING)
        if value is MISSING and self.files is not None:
            value = self.files.get(key)
            if value is not MISSING:
                self._keep(key, value)
        return value

    def put(self, key: Any, value: Any) -> bool:
        kept = self._keep(key, value)
        if self.files is not None:
            return self.files.put(key, value) or kept
        return kept

    def _keep(self, key: Any, value: Any) -> bool:
        size = sizeof(value)
        with self._lock:
            if key in self.data:
                return True
            if self.max_bytes is not None and self.held + size > self.max_bytes:
                return False
            self.data[key] = _frozen(value)
            self.held += size
            self.stored += size
        return True

    def numbers(self) -> tuple[int, int, int, int]:
        files = self.files.stored if self.files is not None else 0
        return self.hits, self.misses, self.miss_ns, self.held + files

    def claim(self, key: Any) -> bool:
        """Take *key* to make it (``False``: another thread has it)."""
        with self._lock:
            if key in self.claims:
                return False
            self.claims[key] = threading.Event()
            return True

    def release(self, key: Any) -> None:
        """Give *key* back (its value is stored, or it failed): its waiters wake."""
        with self._lock:
            event = self.claims.pop(key, None)
        if event is not None:
            event.set()

    def wait(self, key: Any, make: Any) -> tuple[Any, bool]:
        """*key*'s value, stored by the thread that claimed it; made here (``True``) if it
        gave it back without storing it (it failed, or the cap had no room)."""
        while True:
            value = self.get(key)
            if value is not MISSING:
                return value, False
            with self._lock:
                event = self.claims.get(key)
            if event is None:
                if self.get(key) is not MISSING:
                    continue
                if self.claim(key):
                    return _made_here(self, key, make), True
                continue
            event.wait()

    def tally(self) -> tuple[int, int, int, int]:
        """This cache's counts in every process: this one's, and its worker processes'."""
        totals = list(self.numbers())
        for name in glob.glob(os.path.join(self.shared, f"counts-{self.slot}-*")):
            with contextlib.suppress(OSError, struct.error), open(name, "rb") as f:
                for i, v in enumerate(_COUNTS.unpack(f.read(_COUNTS.size))):
                    totals[i] += v
        return totals[0], totals[1], totals[2], totals[3]

    def close(self) -> None:
        self.data.clear()
        self.held = 0
        if self.files is not None:
            self.files.close()


def sizeof(value: Any, depth: int = 0) -> int:
    """About how many bytes *value* holds: an array's or a tensor's data, a string's or a
    bytes' length, a container's items (three levels deep), else ``sys.getsizeof``."""
    nbytes = getattr(value, "nbytes", None)
    if isinstance(nbytes, int):
        return nbytes + 112
    if hasattr(value, "element_size") and hasattr(value, "numel"):  # a torch tensor
        return int(value.element_size() * value.numel()) + 112
    if isinstance(value, (bytes, bytearray, str)):
        return len(value) + 49
    if depth < 3 and isinstance(value, (list, tuple)):
        return sys.getsizeof(value) + sum(sizeof(v, depth + 1) for v in value)
    if depth < 3 and isinstance(value, dict):
        items = value.items()
        return sys.getsizeof(value) + sum(sizeof(v, depth + 1) for _, v in items)
    return sys.getsizeof(value)


def _frozen(value: Any, depth: int = 0) -> Any:
    """*value* with its numpy arrays made read-only (three levels deep)."""
    flags = getattr(value, "flags", None)
    if flags is not None and hasattr(flags, "writeable"):
        with contextlib.suppress(ValueError):
            flags.writeable = False
    elif depth < 3 and isinstance(value, (list, tuple)):
        for v in value:
            _frozen(v, depth + 1)
    elif depth < 3 and isinstance(value, dict):
        for v in value.values():
            _frozen(v, depth + 1)
    return value


# -- identity -----------------------------------------------------------------------------
def fingerprint(segment: tuple[Stage[Any, Any], ...], length: int | None) -> str:
    """A digest of what a cache's entries depend on: the stages above it (their names, their
    configuration, the code of their functions, their datasets' class, length and
    attributes) and the dataset's length. A persistent cache keeps its entries under it, so
    a change above the cache starts a new one instead of serving stale entries."""
    h = hashlib.blake2b(digest_size=12)
    h.update(repr(length).encode())
    for s in segment:
        _feed(h, s, 0)
    return h.hexdigest()


def _feed(h: Any, obj: Any, depth: int) -> None:
    """Feed *obj*'s identity to the hash *h* (bounded: 4 levels, 64 items a container)."""
    up = h.update
    if obj is None or isinstance(obj, (bool, int, float, complex, str, bytes)):
        up(repr(obj).encode())
        return
    if depth > 4:
        up(type(obj).__qualname__.encode())
        return
    if isinstance(obj, Stage):
        up(f"<stage {obj.name}>".encode())
        for k, v in sorted(obj._config.items()):
            up(k.encode())
            _feed(h, v, depth + 1)
        for s in obj.stages if len(obj.stages) > 1 else ():
            _feed(h, s, depth + 1)
        return
    code = getattr(obj, "__code__", None)
    if code is not None or inspect.isbuiltin(obj):
        _function(h, obj, code, depth)
        return
    if isinstance(obj, (list, tuple)):
        up(f"{type(obj).__name__}[{len(obj)}]".encode())
        for v in obj[:64]:
            _feed(h, v, depth + 1)
        return
    if isinstance(obj, dict):
        up(f"dict[{len(obj)}]".encode())
        for k, v in itertools.islice(obj.items(), 64):
            _feed(h, k, depth + 1)
            _feed(h, v, depth + 1)
        return
    if hasattr(obj, "tobytes") and hasattr(obj, "shape"):  # an array: its start
        up(f"array{obj.shape}{getattr(obj, 'dtype', '')}".encode())
        with contextlib.suppress(Exception):
            up(memoryview(obj).cast("B")[: 1 << 20])
        return
    if isinstance(obj, Seeded):  # a parallel stage's settings: how, not what, it makes
        return
    _object(h, obj, depth)


def _object(h: Any, obj: Any, depth: int) -> None:
    """An object's identity: its class, its length, its code, its attributes."""
    cls = type(obj)
    h.update(f"<{_module(cls)}.{cls.__qualname__}>".encode())
    with contextlib.suppress(Exception):
        h.update(f"len={len(obj)}".encode())
    for method in ("__call__", "__getitem__", "__getitems__"):
        code = getattr(getattr(cls, method, None), "__code__", None)
        if code is not None:
            _code(h, code)
    attrs = getattr(obj, "__dict__", None)
    if isinstance(attrs, dict):
        _feed(h, dict(sorted(attrs.items())), depth + 1)


def _function(h: Any, obj: Any, code: Any, depth: int) -> None:
    """A function's identity: its name, its code, its defaults, what it closes over, and
    the object it is bound to."""
    h.update(f"{_module(obj)}.{getattr(obj, '__qualname__', '')}".encode())
    if code is not None:
        _code(h, code)
        _feed(h, getattr(obj, "__defaults__", None), depth + 1)
        for cell in getattr(obj, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # an empty cell
                _feed(h, cell.cell_contents, depth + 1)
    bound = getattr(obj, "__self__", None)
    if bound is not None and not inspect.ismodule(bound):
        _feed(h, bound, depth + 1)


def _module(obj: Any) -> str:
    """*obj*'s module's name; the main script's is ``__main__`` in every process (a spawned
    worker imports it as ``__mp_main__``), so that its workers find the main process's
    entries."""
    name = str(getattr(obj, "__module__", "") or "")
    return "__main__" if name == "__mp_main__" else name


def _code(h: Any, code: Any) -> None:
    """A function's code: its bytecode, names and constants (nested functions' too)."""
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for const in code.co_consts:
        if hasattr(const, "co_code"):
            _code(h, const)
        else:
            h.update(repr(const).encode())


# -- opening ------------------------------------------------------------------------------
_OPEN: dict[tuple[str, str, int], Any] = {}  # this process's stores, by (home, slot, pid)
_LOCK = threading.Lock()


def open_store(
    segment: tuple[Stage[Any, Any], ...],
    home: Home,
    slot: str,
    path: str | None,
    max_bytes: int | None,
) -> Any:
    """The store of the cache at *slot* (over *segment*) in this process: in memory in the
    loader's process (its thread workers share it), in files in a worker process (``path``,
    else shared memory). A ``path``'s entries are under the segment's :func:`fingerprint`."""
    key = (home.uid, slot, os.getpid())  # a forked worker's own, not its parent's copy
    with _LOCK:
        store = _OPEN.get(key)
        if store is not None:
            return store
        files = None
        if path is not None:
            files = FileStore(os.path.join(path, fingerprint(segment, home.length)))
        if home.owned():
            store = MemoryStore(max_bytes, files, home.shared, slot)
            on_release(home, lambda: _drop(key))
        else:
            counts = os.path.join(home.shared, f"counts-{slot}-{os.getpid()}")
            if files is None:
                where = os.path.join(home.shared, slot)
                files = FileStore(where, max_bytes, counts, verify=False)
            else:
                files = FileStore(files.root, None, counts)
            store = files
        _OPEN[key] = store
        return store


def _drop(key: tuple[str, str, int]) -> None:
    with _LOCK:
        store = _OPEN.pop(key, None)
    if store is not None:
        store.close()
