"""``workers="auto"`` against a grid of fixed counts, and against torch's DataLoader with its
default ``num_workers`` (issue 37, "Performance").

Five workload shapes, 20,000 samples each, each run as ``pf.indices(n) | pf.parallel_map(fn,
workers=w, backend=b)`` iterated fully by a consumer that does nothing:

- ``io``: ``time.sleep(0.005)`` a sample, ``backend="thread"``; the grid 4, 8, 16, 32, 64
  threads (auto: up to 64);
- ``aio``: ``await asyncio.sleep(0.005)`` in an ``async def``, ``backend="thread"``: event
  loops in threads, 64 coroutines in flight per loop by default; the grid 1, 2 loops (auto:
  one per CPU at most);
- ``numpy``: about 1 ms of elementwise numpy a sample (a chain of ``sqrt(a * 1.5 + 1)``
  in place on 40,000 float64; no BLAS, whose threads would oversubscribe the cores),
  ``backend="process"``; the grid 1 to 4 processes (auto: one per CPU at most);
- ``python``: about 1 ms of a pure-Python loop, ``backend="process"``; the grid 1 to 4;
- ``large``: ``pf.fetch(ds)`` of a dataset whose sample is a 602 KB float32 array of
  3x224x224, filled from the index (``np.full``: cheap), ``backend="process"``; the grid 1
  to 4.

Each configuration runs in a fresh subprocess of its own (no pool, thread or fork server
left over from the one before), which builds the pipeline, then times one pass: the pool
starts within the timed pass, as it would in training. The rounds: the grid once (the
slow counts on fewer samples, as rates: 4 and 8 threads on 2,000 and 4,000 samples, one
process on 5,000), then ``workers="auto"``, the grid's best count and torch in turn, 3
times (auto, best, torch, auto, best, torch, ...), auto and the best count over the whole
pass. A ratio is the median over the rounds of the ratio within a round (the machine's
load moves more between minutes than within one).

torch: ``torch.utils.data.DataLoader(ds, batch_size=None)`` over a map-style dataset that
calls the same function (``num_workers=0``, its default: in the main process), on a prefix
of the pass for the slow shapes (1,000 samples of 5 ms, 2,000 of 1 ms): rates are compared.
torch has no coroutine ``__getitem__``: ``aio`` has no torch column.

What each auto run also gives: the count it ended with (``stats().stages[-1].workers``);
where it settled, the item after which its count last changed (``auto_history``, "epoch 0,
after K items: N (reason)"), as a share of the pass; and the most live child processes of
its subprocess, counted from ``/proc`` every 100 ms as ``tests/conftest.py``'s
``children()`` does (the workers a fork server forked for it count, the server and
multiprocessing's resource tracker do not; every run is sampled alike).

The goals: auto at least 0.9x the best fixed count over the whole pass; at least 1.5x
torch's default; never more processes than the CPUs of ``os.sched_getaffinity``; the count
settled within the first 10% of the pass. Run::

    python benchmarks/auto.py              # 20,000 samples a shape, 3 rounds: about 6 minutes
    python benchmarks/auto.py --quick      # 2,000 samples, a smaller grid, 1 round: 30 to 40 s
    python benchmarks/auto.py --only io numpy
    python -m pipeflow bench auto          # the goals as rows of the bench table

``results(...)`` returns every run of every shape as a dict; ``run(quick)`` gives
``python -m pipeflow bench`` its rows (``benchmarks._harness.Row``).
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as ``python benchmarks/auto.py``: make ``benchmarks`` importable
    sys.path.insert(0, _ROOT)

from benchmarks._harness import Row
from benchmarks.memory import Child

ITEMS = 20_000
QUICK_ITEMS = 2_000
ROUNDS = 3
QUICK_ROUNDS = 1
INTERVAL = 0.1  # seconds between two counts of a run's child processes (a count: ~2 ms)
LATENCY = 0.005  # seconds a sample of the I/O shapes waits
NUMPY_SIZE = 40_000  # float64 elements the numpy shape works on
NUMPY_STEPS = 18  # in-place a * 1.5 + 1, sqrt steps: about 1 ms on one core here
PYTHON_LOOPS = 16_000  # iterations of the pure-Python loop: about 1 ms
LARGE = (3, 224, 224)  # float32: 602,112 bytes a sample

#: The goals.
VS_BEST = 0.9
VS_TORCH = 1.5
SETTLE = 0.10


# -- the work (module level: process workers unpickle it) -----------------------------------------
def io_sleep(i: int) -> int:
    """5 ms of waiting, as a remote read would."""
    time.sleep(LATENCY)
    return i


async def aio_sleep(i: int) -> int:
    """The same wait, as a coroutine."""
    await asyncio.sleep(LATENCY)
    return i


_BASE = np.random.default_rng(0).random(NUMPY_SIZE)


def numpy_work(i: int) -> float:
    """About 1 ms of elementwise numpy (no BLAS); a number back, so the work is the cost.

    In place, one array a call: with a fresh 320 KB array an operation, the cost hangs on
    the allocator (each comes from ``mmap`` and its page faults), which importing torch
    changes: the same function took 0.85 ms here without torch and 0.51 ms with it."""
    a = _BASE + (i % 7)
    for _ in range(NUMPY_STEPS):
        np.multiply(a, 1.5, out=a)
        np.add(a, 1.0, out=a)
        np.sqrt(a, out=a)
    return float(a[0])


def python_work(i: int) -> int:
    """About 1 ms of pure Python: holds the GIL all along."""
    acc = i
    for k in range(PYTHON_LOOPS):
        acc = (acc * 31 + k) % 1_000_003
    return acc


class Large:
    """A 602 KB float32 sample of 3x224x224, filled from its index."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        return np.full(LARGE, i % 251, dtype=np.float32)


class Mapped:
    """A map-style dataset calling *fn* on the index: what torch's DataLoader reads."""

    def __init__(self, fn: Callable[[int], Any], n: int) -> None:
        self.fn, self.n = fn, n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> Any:
        return self.fn(i)


# -- the shapes ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shape:
    """A workload: its work, backend, grid of fixed counts, and how torch runs it."""

    key: str
    title: str
    backend: str
    kind: str  # what a worker is, in the plural
    grid: tuple[int, ...]
    quick_grid: tuple[int, ...]
    #: The fixed counts timed on fewer samples than the pass (a full run): count -> samples.
    short: dict[int, int] = field(default_factory=dict)
    #: Samples torch is timed on (full, quick); None: torch can't run the shape.
    torch_items: tuple[int, int] | None = None


SHAPES = {
    s.key: s
    for s in (
        Shape(
            "io",
            "I/O 5 ms (time.sleep)",
            "thread",
            "threads",
            (4, 8, 16, 32, 64),
            (8, 64),
            {4: 2_000, 8: 4_000},
            (1_000, 400),
        ),
        Shape("aio", "coroutine I/O 5 ms (asyncio.sleep)", "thread", "event loops", (1, 2), (1, 2)),
        Shape(
            "numpy",
            "numpy ~1 ms",
            "process",
            "processes",
            (1, 2, 3, 4),
            (1, 2),
            {1: 5_000},
            (2_000, 500),
        ),
        Shape(
            "python",
            "pure Python ~1 ms",
            "process",
            "processes",
            (1, 2, 3, 4),
            (1, 2),
            {1: 5_000},
            (2_000, 500),
        ),
        Shape(
            "large",
            "602 KB samples (pf.fetch)",
            "process",
            "processes",
            (1, 2, 3, 4),
            (1, 2),
            {},
            (ITEMS, QUICK_ITEMS),
        ),
    )
}


def work(key: str, n: int) -> Any:
    """The function (or stage) ``parallel_map`` applies for shape *key* over *n* samples."""
    if key == "large":
        import pipeflow as pf

        return pf.fetch(Large(n))
    return {"io": io_sleep, "aio": aio_sleep, "numpy": numpy_work, "python": python_work}[key]


def dataset(key: str, n: int) -> Any:
    """The map-style dataset torch's DataLoader reads for shape *key*."""
    return Large(n) if key == "large" else Mapped(work(key, n), n)


def cost_ms(key: str, reps: int = 200) -> float:
    """One sample of shape *key* in this process, in ms (the median of *reps*)."""
    fn = dataset(key, reps)
    times = []
    for i in range(reps):
        t0 = time.perf_counter()
        fn[i]
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


# -- a run, in its subprocess ---------------------------------------------------------------------
def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _wait() -> None:
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(1)


def _child(key: str, workers: str, n: int) -> None:
    """Build shape *key* with *workers* (a count, ``auto`` or ``torch``), say ``ready``, wait
    for ``go``, time one pass, say ``done`` with what it saw."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mod = importlib.import_module("benchmarks.auto")  # the work pickles as benchmarks.auto.*
    shape = mod.SHAPES[key]
    loader: Any
    if workers == "torch":
        import torch
        import torch.utils.data as tud

        torch.set_num_threads(1)
        loader = tud.DataLoader(mod.dataset(key, n), batch_size=None)
    else:
        import pipeflow as pf

        count: int | str = workers if workers == "auto" else int(workers)
        stage = pf.parallel_map(mod.work(key, n), workers=count, backend=shape.backend)
        loader = pf.indices(n) | stage
    _say(event="ready")
    _wait()
    seen = 0
    t0 = time.perf_counter()
    for _ in loader:
        seen += 1
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {"seconds": seconds, "items": seen}
    if workers != "torch":
        st = loader.stats().stages[-1]
        out.update(workers=st.workers, auto=st.auto, history=st.auto_history)
    _say(event="done", **out)


# -- counting a run's processes from outside ------------------------------------------------------
def _helper(pid: int) -> bool:
    """Long-lived helpers (as tests/conftest.py): multiprocessing's fork server and resource
    tracker, pipeflow's warm fork server."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmd = f.read()
    except OSError:
        return False
    return b"forkserver" in cmd or b"resource_tracker" in cmd


def live_children(pid: int) -> int:
    """Live (not zombie) child processes of *pid*, counting those a fork server forked for
    it instead of the server (``tests/conftest.py``'s ``children()``), in one scan of /proc."""
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if fields[0] != "Z":
            kids.setdefault(int(fields[1]), []).append(int(entry))
    count, todo = 0, list(kids.get(pid, []))
    while todo:
        p = todo.pop()
        if _helper(p):
            todo.extend(kids.get(p, []))
        else:
            count += 1
    return count


def measure(key: str, workers: int | str, n: int, *, timeout: float = 600.0) -> dict[str, Any]:
    """Run shape *key* with *workers* (a count, ``"auto"`` or ``"torch"``) over *n* samples
    in a fresh subprocess; return its run: ``seconds``, ``items``, ``rate`` (items/s),
    ``procs`` (the most live child processes seen), and for pipeflow ``workers`` (the
    final count), ``auto`` and ``history`` (the tuner's text and lines), ``settle`` (the
    item after which the count last changed) and ``top`` (the highest count used)."""
    if key not in SHAPES:
        raise ValueError(f"a shape is one of {', '.join(SHAPES)} (got {key!r})")
    cmd = [sys.executable, os.path.abspath(__file__), "--child", key]
    cmd += ["--workers", str(workers), "--items", str(n)]
    most = 0

    def tick() -> None:
        nonlocal most
        most = max(most, live_children(child.pid))

    with tempfile.TemporaryFile() as errors:  # a pipe could fill up and block the subprocess
        child = Child(cmd, f"{key} workers={workers}", timeout, errors, INTERVAL)
        try:
            child.expect("ready")
            child.go()
            done = child.expect("done", tick)
            child.wait()
        finally:
            child.close()
    run = {k: v for k, v in done.items() if k != "event"}
    run.update(shape=key, config=str(workers), procs=most, rate=run["items"] / run["seconds"])
    if run.get("history"):
        run["settle"], run["top"] = settled(run["history"])
    return run


_STEP = re.compile(r"epoch (\d+), after (\d+) items: (\d+) \((.*)\)")


def settled(history: list[str]) -> tuple[int, int]:
    """The item after which the count last changed (0: never), and the highest count.

    Examples:
        >>> settled(["epoch 0, after 0 items: 1 (starting)",
        ...          "epoch 0, after 60 items: 2 (trying 2: the consumer waited 90%)",
        ...          "epoch 0, after 200 items: 2 (the budget: 2 CPUs)"])
        (60, 2)
    """
    last, top, before = 0, 0, None
    for line in history:
        m = _STEP.fullmatch(line)
        if m is None:
            raise ValueError(
                f"an auto_history line reads 'epoch E, after K items: N (...)' (got {line!r})"
            )
        at, count = int(m[2]), int(m[3])
        if before is not None and count != before:
            last = at
        before, top = count, max(top, count)
    return last, top


# -- a shape: the grid, torch, then auto and the best count in turn -------------------------------
def shape_results(key: str, n: int, rounds: int, quick: bool) -> dict[str, Any]:
    """Every run of shape *key* and their summary (see :func:`results`)."""
    shape = SHAPES[key]
    load = os.getloadavg()[0]
    grid = [
        measure(key, w, n if quick else min(n, shape.short.get(w, n)))
        for w in (shape.quick_grid if quick else shape.grid)
    ]
    best = max(grid, key=lambda r: r["rate"])
    best_count = int(best["config"])
    autos, fixed, torch = [], [], []
    for _ in range(rounds):
        autos.append(measure(key, "auto", n))
        fixed.append(measure(key, best_count, n))
        if shape.torch_items is not None:
            torch.append(measure(key, "torch", min(n, shape.torch_items[1 if quick else 0])))
    ratios = [a["rate"] / b["rate"] for a, b in zip(autos, fixed)]
    vs_torch = [a["rate"] / t["rate"] for a, t in zip(autos, torch)]
    auto_rate = statistics.median(a["rate"] for a in autos)
    return {
        "shape": key,
        "title": shape.title,
        "backend": shape.backend,
        "kind": shape.kind,
        "items": n,
        "load": [load, os.getloadavg()[0]],
        "cost_ms": cost_ms(key) if key not in ("io", "aio") else LATENCY * 1e3,
        "grid": grid,
        "torch": torch,
        "best": best_count,
        "autos": autos,
        "fixed": fixed,
        "auto_rate": auto_rate,
        "fixed_rate": statistics.median(b["rate"] for b in fixed),
        "vs_best": statistics.median(ratios),
        "rounds": ratios,
        "torch_rate": statistics.median(t["rate"] for t in torch) if torch else None,
        "vs_torch": statistics.median(vs_torch) if torch else None,
        "torch_rounds": vs_torch,
        "chosen": [a["workers"] for a in autos],
        "settle": [a.get("settle", 0) / n for a in autos],
        "top": max(a.get("top", a["workers"]) for a in autos),
        "procs": max(a["procs"] for a in autos),
        "cpus": len(os.sched_getaffinity(0)),
    }


def verdicts(s: dict[str, Any]) -> dict[str, bool | None]:
    """Each goal of shape summary *s*: met, missed, or ``None`` (no torch)."""
    return {
        "best": s["vs_best"] >= VS_BEST,
        "torch": None if s["vs_torch"] is None else s["vs_torch"] >= VS_TORCH,
        "budget": s["procs"] <= s["cpus"],
        "settle": max(s["settle"]) <= SETTLE,
    }


def results(
    items: int = ITEMS, *, rounds: int = ROUNDS, quick: bool = False, only: list[str] | None = None
) -> dict[str, Any]:
    """Run every shape (or *only* those named): ``items``, ``rounds``, ``cpus``, ``load``
    (the 1-minute load average before and after), ``seconds``, and ``shapes``: per shape,
    every run (``grid``, ``torch``, ``autos``, ``fixed``: each :func:`measure`'s dict) and
    the summary (``auto_rate``, ``vs_best``, ``vs_torch``, ``chosen``, ``settle``, ``procs``,
    ...)."""
    names = list(SHAPES) if not only else list(only)
    for name in names:
        if name not in SHAPES:
            raise ValueError(f"a shape is one of {', '.join(SHAPES)} (got {name!r})")
    started, load = time.perf_counter(), os.getloadavg()[0]
    shapes = [shape_results(name, items, rounds, quick) for name in names]
    return {
        "items": items,
        "rounds": rounds,
        "quick": quick,
        "cpus": len(os.sched_getaffinity(0)),
        "load": [load, os.getloadavg()[0]],
        "seconds": time.perf_counter() - started,
        "shapes": shapes,
    }


# -- the tables -----------------------------------------------------------------------------------
def _mark(ok: bool | None) -> str:
    return {True: "met", False: "NOT met", None: "n/a"}[ok]


def _pct(x: float) -> str:
    return f"{x:.1%}"


def format_shape(s: dict[str, Any]) -> str:
    """One shape's runs, its summary and its goals."""
    n = s["items"]
    lines = [
        f"== {s['title']}, backend={s['backend']!r}: {n:,} samples; "
        f"{s['cost_ms']:.2f} ms a sample here; load {s['load'][0]:.1f} -> {s['load'][1]:.1f}",
        f"{'run':<16}{'samples':>9}{'rate/s':>10}{'workers':>9}{'procs':>7}{'settled':>9}",
    ]

    def row(name: str, r: dict[str, Any]) -> str:
        settle = "" if "settle" not in r else _pct(r["settle"] / n)
        return (
            f"{name:<16}{r['items']:>9,}{r['rate']:>10,.0f}{r.get('workers', '-')!s:>9}"
            f"{r['procs']:>7}{settle:>9}"
        )

    lines += [row(f"fixed {r['config']}", r) for r in s["grid"]]
    for k, (a, b) in enumerate(zip(s["autos"], s["fixed"]), 1):
        lines += [row(f"auto #{k}", a), row(f"fixed {s['best']} #{k}", b)]
        if s["torch"]:
            lines.append(row(f"torch default #{k}", s["torch"][k - 1]))
    v = verdicts(s)
    rounds = ", ".join(f"{x:.3f}x" for x in s["rounds"])
    chosen = ", ".join(map(str, s["chosen"]))
    settle = ", ".join(_pct(x) for x in s["settle"])
    lines += [
        f"auto: {s['auto_rate']:,.0f}/s (median); {s['kind']} at the end: {chosen}; "
        f"count last changed at {settle} of the pass",
        f"  vs the best fixed count ({s['best']}, {s['fixed_rate']:,.0f}/s): "
        f"{s['vs_best']:.3f}x (rounds {rounds})  goal >= {VS_BEST}x: {_mark(v['best'])}",
    ]
    if s["torch"]:
        t = s["torch"][0]
        part = "" if t["items"] == n else f" (timed on {t['items']:,} samples: rates compared)"
        rounds = ", ".join(f"{x:.2f}x" for x in s["torch_rounds"])
        lines.append(
            f"  vs torch DataLoader, num_workers=0: {s['torch_rate']:,.0f}/s{part}: "
            f"{s['vs_torch']:.2f}x (rounds {rounds})  goal >= {VS_TORCH}x: {_mark(v['torch'])}"
        )
    else:
        lines.append("  vs torch DataLoader: n/a (no coroutine __getitem__)")
    lines += [
        f"  processes: at most {s['procs']} live (budget: {s['cpus']} CPUs): "
        f"{_mark(v['budget'])}; highest count used {s['top']}",
        f"  settled within {SETTLE:.0%} of the pass (every round): {_mark(v['settle'])}",
    ]
    for k, a in enumerate(s["autos"], 1):
        lines.append(f"  auto #{k}: {a.get('auto')}; its history:")
        lines += [f"    {line}" for line in a.get("history", [])]
    return "\n".join(lines)


def format_summary(result: dict[str, Any]) -> str:
    """One line a shape: the grid, auto, and each goal."""
    head = (
        f"{'shape':<8}{'grid (count: rate/s)':<52}{'auto/s':>8}{'count':>7}{'settled':>9}"
        f"{'x best':>8}{'x torch':>9}{'procs':>7}"
    )
    lines = [head, "-" * len(head)]
    met = missed = 0
    for s in result["shapes"]:
        grid = ", ".join(f"{r['config']}: {r['rate']:,.0f}" for r in s["grid"])
        torch = "n/a" if s["vs_torch"] is None else f"{s['vs_torch']:.2f}x"
        chosen = "/".join(map(str, sorted(set(s["chosen"]))))
        lines.append(
            f"{s['shape']:<8}{grid:<52}{s['auto_rate']:>8,.0f}{chosen:>7}"
            f"{_pct(max(s['settle'])):>9}{s['vs_best']:>7.3f}x{torch:>9}"
            f"{s['procs']:>4}/{s['cpus']:<2}"
        )
        for ok in verdicts(s).values():
            met += ok is True
            missed += ok is False
    lines.append(
        f"goals (>= {VS_BEST}x best fixed, >= {VS_TORCH}x torch, procs <= CPUs, settled "
        f"<= {SETTLE:.0%}; settled: the worst round): {met} of {met + missed} met"
    )
    for s in result["shapes"]:
        miss = [k for k, ok in verdicts(s).items() if ok is False]
        if miss:
            lines.append(f"  {s['shape']}: not met: {', '.join(miss)}")
    return "\n".join(lines)


def run(quick: bool) -> list[Row]:
    """The goals as rows of ``python -m pipeflow bench auto``: auto in the pipeflow column,
    the best fixed count (or torch's default) in the torch column."""
    result = results(
        QUICK_ITEMS if quick else ITEMS, rounds=QUICK_ROUNDS if quick else ROUNDS, quick=quick
    )
    rows = []
    for s in result["shapes"]:
        autos = [a["rate"] for a in s["autos"]]
        note = (
            f"{s['kind']} at the end: {'/'.join(map(str, sorted(set(s['chosen']))))}; "
            f"paired ratio {s['vs_best']:.3f}x; settled at {_pct(max(s['settle']))} "
            f"(goal <= {SETTLE:.0%}); {s['procs']} processes (budget {s['cpus']})"
        )
        rows.append(
            Row(
                f"auto, {s['title']}: vs best fixed ({s['best']})",
                "samples/s",
                s["auto_rate"],
                s["fixed_rate"],
                f">= {VS_BEST}x",
                note,
                samples={"pipeflow": autos, "torch": [b["rate"] for b in s["fixed"]]},
                met=verdicts(s)["best"],
            )
        )
        if s["torch"]:
            rows.append(
                Row(
                    "  same vs torch, num_workers=0",
                    "samples/s",
                    s["auto_rate"],
                    s["torch_rate"],
                    f">= {VS_TORCH}x",
                    f"paired ratio {s['vs_torch']:.2f}x",
                    samples={"pipeflow": autos, "torch": [t["rate"] for t in s["torch"]]},
                    met=verdicts(s)["torch"],
                )
            )
    return rows


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/auto.py [--quick] [--items N] [--rounds N] [--only SHAPE ...]
    [--json]``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS} samples, 1 round")
    parser.add_argument("--items", type=int, default=None, help=f"samples (default {ITEMS})")
    parser.add_argument("--rounds", type=int, default=None, help=f"rounds (default {ROUNDS})")
    parser.add_argument("--only", nargs="+", metavar="SHAPE", help=f"of {', '.join(SHAPES)}")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--workers", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.workers, args.items)
        return 0
    items = args.items or (QUICK_ITEMS if args.quick else ITEMS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    result = results(items, rounds=rounds, quick=args.quick, only=args.only)
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"workers='auto' against fixed counts: {items:,} samples a shape, {rounds} round(s); "
        f"{result['cpus']} CPUs (sched_getaffinity), {os.cpu_count()} cores; Python "
        f"{sys.version.split()[0]}, numpy {np.__version__}\n"
    )
    for s in result["shapes"]:
        print(format_shape(s) + "\n")
    print(format_summary(result))
    print(
        f"\n{result['seconds']:.0f} s in all; load average {result['load'][0]:.1f} before, "
        f"{result['load'][1]:.1f} after"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
