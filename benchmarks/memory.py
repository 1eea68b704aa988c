"""Memory that forked DataLoader workers add during one epoch ("copy-on-read", pytorch#13246).

A map-style dataset holds a Python list of dicts. Forked workers share the parent's pages, but
CPython writes to an object whenever it is used (its reference count; its GC header when the
collector runs), so every page a worker reads from gets copied into that worker. This benchmark
measures how much memory one epoch adds, for ``torch.utils.data.DataLoader`` and for
``pf.DataLoader`` with the same arguments (batch size 64, 2 workers, fork, shuffle).

Each loader runs in a fresh subprocess (so neither inherits the other's heap), which this
process samples from outside every 50 ms, summing over the subprocess and all its descendants.

The metric is PSS of anonymous and shared-memory pages (``Pss_Anon + Pss_Shmem`` in
``/proc/<pid>/smaps_rollup``):

- PSS charges a page shared by *k* processes 1/*k* to each, so the sum over the process tree
  counts every physical page once: a page that the fork shares adds nothing, a page a worker
  copies adds 4 KiB. RSS would count a shared page once per process. USS (private pages) can't
  be compared before and after: the fork turns the main process's private pages into shared
  ones, so the sum drops although nothing was freed.
- File-backed pages (``libtorch_cpu.so``, ...) are left out: they are clean page cache that the
  kernel can drop, and their PSS moves whenever an unrelated process maps the same library.
- ``Private_Dirty`` of the workers is shown too: pages that exist in one worker only, that is
  the pages it copied plus its own new allocations.

"Added" is the peak during the epoch (the last sample is taken at its end, with the workers
still alive) minus the same sum just before ``iter(loader)``, so it includes starting the workers.
"Dataset" is what building the list added to the subprocess. Run::

    python benchmarks/memory.py             # 300k items, about a minute
    python benchmarks/memory.py --quick     # 50k items, about 15 s
    python benchmarks/memory.py --variants  # also the experiments (EXPERIMENTS, FLAGS)
    python benchmarks/memory.py --only pipeflow+full-gc torch+full-gc  # torch and these

``run(quick)`` gives ``python -m pipeflow bench`` its two rows (``benchmarks._harness.Row``);
``results(quick, variants=...)`` returns every measurement of every variant as a dict.
"""

from __future__ import annotations

import argparse
import array
import contextlib
import gc
import io
import json
import os
import pickle
import random
import select
import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as ``python benchmarks/memory.py``: make ``benchmarks`` importable
    sys.path.insert(0, _ROOT)

from benchmarks._harness import Row

ITEMS = 300_000
QUICK_ITEMS = 50_000
BATCH_SIZE = 64
WORKERS = 2
INTERVAL = 0.05  # seconds between samples (one sample of three processes takes ~10 ms)
MB = 1024 * 1024

#: What ``run`` measures by default. A variant is a loader, ``torch`` (torch's DataLoader)
#: or ``pipeflow`` (``pf.DataLoader``), plus ``+flags`` from ``FLAGS``; each row is compared
#: with the plain ``torch`` row.
VARIANTS = ("torch", "pipeflow", "pipeflow+serialized")
#: The experiments behind the conclusions, run with ``--variants``.
EXPERIMENTS = (
    "torch+no-touch",
    "pipeflow+no-touch",
    "pipeflow+no-freeze",
    "pipeflow+gc-off",
    "pipeflow+switch",
    "pipeflow+forkserver",
    "torch+no-shuffle",
    "pipeflow+no-shuffle",
    "torch+full-gc",
    "torch+full-gc+user-freeze",
    "pipeflow+full-gc",
    "pipeflow+full-gc+no-freeze",
    "pipeflow+full-gc+keep-frozen",
    "pipeflow+full-gc+user-freeze",
    "torch+no-shuffle+full-gc",
    "pipeflow+no-shuffle+full-gc",
    "pipeflow+no-shuffle+full-gc+keep-frozen",
    "pipeflow+recycle",
    "pipeflow+threads",
    "torch+serialized",
)
FLAGS = {
    "serialized": "the items pickled into one byte buffer (pf.shared_list if pipeflow has it, "
    "else this file's Serialized); the dataset class is unchanged",
    "no-freeze": "pipeflow's gc.freeze()/gc.unfreeze() around the fork disabled",
    "keep-frozen": "pipeflow's gc.unfreeze() after the fork disabled: the parent stays frozen",
    "user-freeze": "the user calls gc.freeze() just before iter(loader)",
    "gc-off": "gc.disable() in each worker (worker_init_fn)",
    "switch": "sys.setswitchinterval(1.0) in each worker (worker_init_fn)",
    "forkserver": "multiprocessing_context='forkserver': the dataset is pickled to each worker",
    "no-shuffle": "shuffle=False (every other run shuffles)",
    "full-gc": "one full gc.collect() in each process during the epoch (a long run has them)",
    "recycle": "workers replaced by fresh forks every 64 batches (emulated: a pool per chunk)",
    "no-touch": "control: __getitem__ returns numbers without reading the list",
    "threads": "backend='thread': pf.parallel_map on threads, no fork",
}


# -- the dataset (what a user writes) -------------------------------------------------------------
def make_items(n: int) -> list[dict[str, Any]]:
    """*n* small records, as ``json.load`` of an annotation file would give them."""
    return [
        {"id": i, "name": f"item-{i}", "tags": [f"t{i % 7}", f"t{i % 11}"], "score": i * 0.5}
        for i in range(n)
    ]


class Records:
    """A map-style dataset over a list of dicts; an item is three numbers."""

    def __init__(self, items: Any) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int) -> Any:
        d = self.items[i]
        return np.array([d["id"], d["score"], len(d["tags"])], dtype=np.float32)


class Untouched(Records):
    """The same, but ``__getitem__`` never reads the list (the control experiment)."""

    def __getitem__(self, i: int) -> Any:
        return np.array([i, 0.0, 0], dtype=np.float32)


class Serialized:
    """Stand-in for ``pf.shared_list``: items pickled into one buffer plus an offsets array.

    The buffer's pages are never written after the fork (no object headers in them), so the
    workers share them; an access unpickles a fresh copy of one item.
    """

    def __init__(self, items: list[Any]) -> None:
        out = io.BytesIO()
        pickler = pickle.Pickler(out, protocol=5)
        self._ends = array.array("q")
        for item in items:
            pickler.clear_memo()
            pickler.dump(item)
            self._ends.append(out.tell())
        self._data = out.getvalue()

    def __len__(self) -> int:
        return len(self._ends)

    def __getitem__(self, i: int) -> Any:
        start = self._ends[i - 1] if i else 0
        return pickle.loads(memoryview(self._data)[start : self._ends[i]])


# -- measuring a process tree from outside ---------------------------------------------------------
_FIELDS = ("Pss_Anon", "Pss_Shmem", "Private_Dirty", "Rss")


def _rollup(pid: int) -> dict[str, int] | None:
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            text = f.read()
    except (FileNotFoundError, ProcessLookupError, PermissionError):
        return None
    out = dict.fromkeys(_FIELDS, 0)
    for line in text.splitlines()[1:]:
        key, _, rest = line.partition(":")
        if key in out:
            out[key] = int(rest.split()[0]) * 1024
    return out


def _tree(pid: int) -> list[int]:
    pids, todo = [], [pid]
    while todo:
        p = todo.pop()
        pids.append(p)
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{p}/task"):
                with contextlib.suppress(OSError), open(f"/proc/{p}/task/{tid}/children") as f:
                    todo.extend(int(c) for c in f.read().split())
    return pids


def _sample(root: int) -> dict[str, Any]:
    """``unique``: Pss_Anon + Pss_Shmem summed over the tree; ``children_private``: the
    children's Private_Dirty; ``procs``: how many processes."""
    unique = children_private = procs = 0
    for pid in _tree(root):
        r = _rollup(pid)
        if r is None:
            continue
        procs += 1
        unique += r["Pss_Anon"] + r["Pss_Shmem"]
        if pid != root:
            children_private += r["Private_Dirty"]
    return {"unique": unique, "children_private": children_private, "procs": procs}


def _own_anon() -> int:
    r = _rollup(os.getpid())
    assert r is not None
    return r["Pss_Anon"] + r["Pss_Shmem"]


# -- the subprocess: build, report, iterate one epoch on command ----------------------------------
def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _wait() -> None:
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(1)


_COLLECTED = 0


def _collect_once(batch: Any) -> Any:
    """torch's default collate, after one full collection in each process that calls it."""
    global _COLLECTED
    if os.getpid() != _COLLECTED:
        _COLLECTED = os.getpid()
        gc.collect()
    import torch.utils.data as tud

    return tud.default_collate(batch)


def _worker_gc_off(worker_id: int) -> None:
    gc.disable()


def _worker_switch(worker_id: int) -> None:
    sys.setswitchinterval(1.0)


class _Freeze:
    """Stands in for the ``gc`` module inside ``pipeflow.parallel.pools._fork``."""

    def __init__(self, freeze: bool, unfreeze: bool) -> None:
        self._freeze, self._unfreeze = freeze, unfreeze

    def freeze(self) -> None:
        if self._freeze:
            gc.freeze()

    def unfreeze(self) -> None:
        if self._unfreeze:
            gc.unfreeze()


def _parse(variant: str) -> tuple[str, set[str]]:
    loader, *flags = variant.split("+")
    unknown = set(flags) - set(FLAGS)
    if loader not in ("torch", "pipeflow") or unknown:
        msg = f"a variant is torch or pipeflow, then +flags from {sorted(FLAGS)} (got {variant!r})"
        raise ValueError(msg)
    if loader == "torch" and {"no-freeze", "keep-frozen", "recycle", "threads"} & set(flags):
        msg = f"{variant}: that flag changes pipeflow, not torch"
        raise ValueError(msg)
    return loader, set(flags)


def _epoch(loader_name: str, flags: set[str], dataset: Any) -> Iterable[Any]:
    """Build the loader as the variant says: what one epoch iterates over."""
    import torch
    import torch.utils.data as tud

    import pipeflow as pf

    shuffle = "no-shuffle" not in flags
    if "recycle" in flags or "threads" in flags:
        sampler = tud.BatchSampler(
            tud.RandomSampler(dataset) if shuffle else tud.SequentialSampler(dataset),
            BATCH_SIZE,
            drop_last=False,
        )
        work = pf.fetch(dataset) | pf.collate(pf.default_collate)
        if "threads" in flags:
            threads = pf.parallel_map(work, workers=WORKERS, backend="thread")
            threaded: Iterable[Any] = pf.from_sampler(sampler) | threads
            return threaded
        return _recycled(list(sampler), work, 64)
    kwargs: dict[str, Any] = {
        "batch_size": BATCH_SIZE,
        "shuffle": shuffle,
        "num_workers": WORKERS,
        "multiprocessing_context": "forkserver" if "forkserver" in flags else "fork",
    }
    if "full-gc" in flags:
        kwargs["collate_fn"] = _collect_once
    if "gc-off" in flags:
        kwargs["worker_init_fn"] = _worker_gc_off
    if "switch" in flags:
        kwargs["worker_init_fn"] = _worker_switch
    if "no-freeze" in flags or "keep-frozen" in flags:
        from pipeflow.parallel.pools import _fork

        _fork.gc = _Freeze("no-freeze" not in flags, False)  # type: ignore[attr-defined,assignment]
    cls = torch.utils.data.DataLoader if loader_name == "torch" else pf.DataLoader
    return cls(dataset, **kwargs)


def _recycled(batches: list[list[int]], work: Any, every: int) -> Iterator[Any]:
    import pipeflow as pf

    for start in range(0, len(batches), every):
        stage = pf.parallel_map(
            work, workers=WORKERS, backend="process", mp_context="fork", round_robin=True
        )
        yield from pf.from_iterable(batches[start : start + every]) | stage


def _access_cost(dataset: Any, n: int = 20_000) -> float:
    """Microseconds per ``dataset[i]`` at random *i*, in this process (best of 3)."""
    rng = random.Random(0)
    keys = [rng.randrange(len(dataset)) for _ in range(n)]
    getitem = dataset.__getitem__
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for i in keys:
            getitem(i)
        best = min(best, time.perf_counter() - t0)
    return best / n * 1e6


def _child(variant: str, n: int) -> None:
    import torch

    import pipeflow as pf

    loader_name, flags = _parse(variant)
    packer = None
    _ = pf.DataLoader  # everything imported before the baseline
    torch.set_num_threads(1)
    before = _own_anon()
    items: Any = make_items(n)
    size = _own_anon() - before
    if "serialized" in flags:
        pack = getattr(pf, "shared_list", Serialized)
        packer = getattr(pack, "__name__", "")
        items = pack(items)  # the list is dropped: only the buffer is left
        gc.collect()
    dataset = (Untouched if "no-touch" in flags else Records)(items)
    n_batches = -(-n // BATCH_SIZE)
    getitem_us = _access_cost(dataset)  # before the fork: costs no copies
    epoch = _epoch(loader_name, flags, dataset)
    held = _own_anon() - before
    _say(event="ready", dataset_bytes=size, held_bytes=held, getitem_us=getitem_us, packer=packer)
    _wait()
    t0 = time.perf_counter()
    if "user-freeze" in flags:
        gc.freeze()
    it = iter(epoch)
    for k in range(n_batches):
        next(it)
        if k == n_batches // 2 and "full-gc" in flags:
            gc.collect()  # the main process's own collection
    seconds = time.perf_counter() - t0
    _say(event="epoch", seconds=seconds)  # the workers are still alive: sampled now
    _wait()
    for _ in it:  # the end of the epoch: the workers stop
        raise AssertionError("more batches than expected")
    _say(event="done")


# -- the driver ----------------------------------------------------------------------------------
class _Lines:
    """Lines from a pipe, with a timeout, without buffering surprises."""

    def __init__(self, fd: int) -> None:
        self.fd, self.buf = fd, b""

    def get(self, timeout: float) -> str | None:
        while b"\n" not in self.buf:
            ready, _, _ = select.select([self.fd], [], [], timeout)
            if not ready:
                return None
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError
            self.buf += chunk
        line, self.buf = self.buf.split(b"\n", 1)
        return line.decode()


def measure(variant: str, n: int, *, timeout: float = 600.0) -> dict[str, Any]:
    """Run *variant* over *n* items in a fresh subprocess; return its row (bytes, seconds)."""
    _parse(variant)
    with tempfile.TemporaryFile() as errors:  # a pipe could fill up and block the subprocess
        return _measure(variant, n, timeout, errors)


def _measure(variant: str, n: int, timeout: float, errors: Any) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--items", str(n)]
    child = Child(cmd, variant, timeout, errors)
    try:
        ready = child.expect("ready")
        base = _sample(child.pid)
        peak: dict[str, Any] = dict(base)

        def tick() -> None:
            s = _sample(child.pid)
            if s["unique"] > peak["unique"]:
                peak.update(s)

        child.go()
        epoch = child.expect("epoch", tick)
        tick()  # at the end of the epoch, workers alive: for copy-on-read, the peak
        child.go()
        child.expect("done")
        child.wait()
    finally:
        child.close()
    return {
        "variant": variant,
        "items": n,
        "dataset_bytes": ready["dataset_bytes"],
        "held_bytes": ready["held_bytes"],
        "added_bytes": peak["unique"] - base["unique"],
        "workers_private_bytes": peak["children_private"],
        "processes": peak["procs"],
        "epoch_seconds": epoch["seconds"],
        "getitem_us": ready["getitem_us"],
        "packer": ready["packer"],
    }


class Child:
    """A benchmark's subprocess, driven a line at a time: it prints one JSON event per line
    (``{"event": "ready", ...}``) and waits for ``go`` on its standard input between steps;
    its standard error goes to *errors* (a file: a pipe could fill up and block it), quoted
    when an event does not come within *timeout* seconds of the start.

    Args:
        cmd: the command.
        variant: the row's name, for the messages.
        timeout: seconds for the whole run.
        errors: a binary file for the child's standard error.
        interval: seconds between two calls of ``expect``'s *on_tick* while it waits.
    """

    def __init__(
        self, cmd: list[str], variant: str, timeout: float, errors: Any, interval: float = INTERVAL
    ) -> None:
        env = dict(
            os.environ, PYTHONPATH=os.pathsep.join([_ROOT, os.environ.get("PYTHONPATH", "")])
        )
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors, env=env
        )
        assert self.proc.stdout is not None
        self.lines = _Lines(self.proc.stdout.fileno())
        self.variant, self.errors, self.interval = variant, errors, interval
        self.deadline = time.monotonic() + timeout

    @property
    def pid(self) -> int:
        return self.proc.pid

    def expect(self, event: str, on_tick: Callable[[], None] | None = None) -> dict[str, Any]:
        """The child's next event, which must be *event* (*on_tick* called while waiting)."""
        while time.monotonic() < self.deadline:
            if on_tick is not None:
                on_tick()
            try:
                line = self.lines.get(self.interval if on_tick else 1.0)
            except EOFError:
                break
            if line is not None:
                msg = json.loads(line)
                if msg["event"] != event:
                    raise RuntimeError(f"{self.variant}: expected {event!r}, got {msg!r}")
                return msg  # type: ignore[no-any-return]
        self.proc.kill()
        self.proc.wait()
        self.errors.seek(0)
        err = self.errors.read().decode(errors="replace")
        raise RuntimeError(f"{self.variant}: no {event!r} from the subprocess:\n{err[-3000:]}")

    def go(self) -> None:
        """Let the child take its next step."""
        assert self.proc.stdin is not None
        self.proc.stdin.write(b"go\n")
        self.proc.stdin.flush()

    def wait(self) -> None:
        self.proc.wait(timeout=30)

    def close(self) -> None:
        """Kill the child if it still runs; close its pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


def run(quick: bool) -> list[Row]:
    """The rows ``python -m pipeflow bench`` prints (MB added in one epoch; details: results).

    The plain list under both loaders; then pipeflow with the items packed into one buffer
    (``pf.shared_list``, opt-in) against torch with the plain list.
    """
    rows = results(quick)
    by = {r["variant"]: r for r in rows}
    torch_mb = by["torch"]["added_bytes"] / MB
    size = f"{by['torch']['items'] // 1000}k dicts, {by['torch']['dataset_bytes'] / MB:.0f} MB"
    packed = "pf.shared_list"
    if by["pipeflow+serialized"]["packer"] != "shared_list":
        packed = "this file's Serialized (pf.shared_list is proposed)"
    return [
        Row(
            f"epoch memory, list of {by['torch']['items'] // 1000}k dicts, 2 forks",
            "MB added",
            by["pipeflow"]["added_bytes"] / MB,
            torch_mb,
            "<= 0.5x",
            f"{size}; forked workers copy the pages __getitem__ reads (refcounts)",
            higher_is_better=False,
        ),
        Row(
            "  same, pipeflow's items in one buffer",
            "MB added",
            by["pipeflow+serialized"]["added_bytes"] / MB,
            torch_mb,
            "<= 0.5x",
            f"pipeflow: the items packed by {packed}; torch: the plain list",
            higher_is_better=False,
        ),
    ]


def results(
    quick: bool, *, variants: bool = False, items: int | None = None, only: list[str] | None = None
) -> list[dict[str, Any]]:
    """Measure torch's and pipeflow's loaders (with *variants*, the experiments too).

    Args:
        quick: 50k items instead of 300k.
        variants: also run ``EXPERIMENTS``.
        items: the number of items, overriding *quick*.
        only: run ``torch`` and these variants instead.

    Returns:
        One dict per variant: ``variant``, ``items``, ``dataset_bytes`` (what building the list
        added), ``held_bytes`` (what the dataset holds when the epoch starts: less for
        ``+serialized``), ``added_bytes`` (what the epoch added, over the process tree),
        ``workers_private_bytes``, ``epoch_seconds``, ``getitem_us`` (one random
        ``dataset[i]`` in the main process), ``packer`` (what packed ``+serialized`` items),
        ``added_vs_dataset`` and ``added_vs_torch``.
    """
    n = items or (QUICK_ITEMS if quick else ITEMS)
    names = ["torch", *only] if only else [*VARIANTS, *(EXPERIMENTS if variants else ())]
    names = list(dict.fromkeys(names))
    for name in names:
        _parse(name)  # a typo fails now, not after minutes of measuring
    rows = [measure(name, n) for name in names]
    torch_added = rows[0]["added_bytes"]
    for r in rows:
        r["added_vs_dataset"] = r["added_bytes"] / r["dataset_bytes"]
        r["added_vs_torch"] = r["added_bytes"] / torch_added
    return rows


def format_table(rows: list[dict[str, Any]]) -> str:
    """The rows as a plain-text table (MB = 2**20 bytes)."""
    cols: list[tuple[str, str, Callable[[dict[str, Any]], Any]]] = [
        ("variant", f"<{max(len(r['variant']) for r in rows) + 2}", lambda r: r["variant"]),
        ("items", ">7", lambda r: r["items"]),
        ("dataset MB", ">11.1f", lambda r: r["dataset_bytes"] / MB),
        ("held MB", ">8.1f", lambda r: r["held_bytes"] / MB),
        ("added MB", ">9.1f", lambda r: r["added_bytes"] / MB),
        ("x dataset", ">10.2f", lambda r: r["added_vs_dataset"]),
        ("x torch", ">8.2f", lambda r: r["added_vs_torch"]),
        ("workers priv MB", ">16.1f", lambda r: r["workers_private_bytes"] / MB),
        ("epoch s", ">8.2f", lambda r: r["epoch_seconds"]),
        ("us/item", ">8.2f", lambda r: r["getitem_us"]),
    ]
    head = "".join(f"{name:{spec[0]}{spec[1:].split('.')[0]}}" for name, spec, _ in cols)
    lines = [head, "-" * len(head)]
    lines += ["".join(f"{get(r):{spec}}" for _, spec, get in cols) for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/memory.py [--quick] [--variants] [--only V ...] [--json]``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS} items, not {ITEMS}")
    parser.add_argument("--items", type=int, default=None, help="the number of items")
    parser.add_argument("--variants", action="store_true", help="also run the experiments")
    parser.add_argument(
        "--only", nargs="+", metavar="VARIANT", help="run torch and these, e.g. pipeflow+gc-off"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.items)
        return 0
    rows = results(args.quick, variants=args.variants, items=args.items, only=args.only)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(format_table(rows))
    print("\nadded: peak of Pss_Anon + Pss_Shmem summed over the main process and its workers,")
    print("minus the same just before iter(loader). Flags:")
    for flag in sorted({f for r in rows for f in r["variant"].split("+")[1:]}):
        text = f"+{flag}: {FLAGS[flag]}"
        print(textwrap.fill(text, 96, initial_indent="  ", subsequent_indent="    "))
    return 0


if __name__ == "__main__":
    sys.exit(main())
