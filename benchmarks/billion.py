"""A billion samples: the shuffled indices of an epoch, side by side with torch's samplers.

For n = 10**6, 10**7, 10**8 (and 10**9, pipeflow alone) and each case:

- ``epoch``: ``pf.indices(n) | pf.shuffle(seed=0)`` against ``RandomSampler``;
- ``shard``: rank 0 of 64, ``... | pf.shard(0, 64)`` against ``DistributedSampler``
  (and rank 0 of 8, pipeflow alone, for the issue's done-when);
- ``resume``: a state saved at 90 % of the epoch, loaded into a fresh loader (pipeflow),
  against iterating the sampler and dropping the first 90 % (torch's samplers can't resume);
- ``torchgen``: ``pf.shuffle(seed=0, generator="torch")``, which draws ``torch.randperm`` (as
  ``DistributedSampler`` does) and so stays materialised;
- ``stream``: the index stage alone (``Permutation(n, seed, epoch).stream()``, what the shuffle
  yields), without the loader's per-item bookkeeping.

Each case runs in a fresh subprocess that measures, from ``iter()`` (or ``load_state_dict``):
the time to the first index and to the first 10,000; the peak extra memory (the high-water
mark of the resident set, ``VmHWM``, reset just before, minus the resident set then); and the
indices per second, by wall clock and by CPU time (``time.process_time``: on a shared machine
the wall clock counts other people's work too), over the whole epoch, or over a prefix of
``PREFIX`` indices when the epoch is longer (the table says so). The consumer is
``collections.deque(it, maxlen=0)``, which costs nothing per item, so the rate is the
sampler's. torch's samplers turn the whole permutation into a Python list first: at 10**8 that
is about 4 GB and runs only when the machine has the memory (``--torch-max``).

Run: ``python -m benchmarks.billion [--quick] [--markdown]`` from the repository root.
``--quick`` measures 10**6, 10**7 and 10**9 (pipeflow) in about a minute; ``--goals 5`` only
the issue's done-when at 10**9, five times each, and prints the medians.
"""

from __future__ import annotations

import argparse
import collections
import itertools
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Row

ROOT = Path(__file__).resolve().parent.parent
PREFIX = 20_000_000  # indices counted when an epoch (or a share) is longer
FIRST = 10_000  # "the first 10,000 indices"
MB = 1024 * 1024


# -- the child: one measurement in a fresh process ---------------------------------------------
def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def _reset_peak() -> int:
    """Reset the resident-set high-water mark (Linux): return the resident set now."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _status("VmRSS")


def _pipeflow(case: str, n: int, world: int) -> tuple[Any, int]:
    """``(a function that starts the iterator, how many indices it yields)``."""
    import pipeflow as pf

    if case == "stream":
        from pipeflow.engine._permutation import Permutation

        return (lambda: Permutation(n, 0, 0).stream()), n
    if case == "torchgen":  # shuffle(generator="torch"): DistributedSampler's draw, materialised
        import torch  # noqa: F401  (a training script has imported it: not part of the time)

        loader = pf.indices(n) | pf.shuffle(seed=0, generator="torch")
        loader.set_stats(False)
        return (lambda: iter(loader)), n
    loader = pf.indices(n) | pf.shuffle(seed=0)
    if case == "shard":
        loader = loader | pf.shard(0, world)
    loader.set_stats(False)  # the loader's own per-item clock reads are not the sampler's
    length = len(loader)
    if case == "resume":
        state = loader.state_dict()
        state["position"] = length * 9 // 10
        fresh = pf.indices(n) | pf.shuffle(seed=0)
        fresh.set_stats(False)

        def prepare() -> Any:
            fresh.load_state_dict(state)
            return iter(fresh)

        return prepare, length - length * 9 // 10
    return (lambda: iter(loader)), length


def _torch(case: str, n: int, world: int) -> tuple[Any, int]:
    import torch
    from torch.utils.data import DistributedSampler, RandomSampler

    if case == "shard":
        sampler: Any = DistributedSampler(range(n), num_replicas=world, rank=0, seed=0)
        return (lambda: iter(sampler)), len(sampler)
    sampler = RandomSampler(range(n), generator=torch.Generator().manual_seed(0))
    if case == "resume":
        skip = n * 9 // 10

        def prepare() -> Any:
            it = iter(sampler)
            collections.deque(itertools.islice(it, skip), maxlen=0)
            return it

        return prepare, n - skip
    return (lambda: iter(sampler)), n


def child(impl: str, case: str, n: int, world: int) -> dict[str, Any]:
    """Measure one case in this (fresh) process."""
    make = _pipeflow if impl == "pipeflow" else _torch
    prepare, length = make(case, n, world)
    base = _reset_peak()
    wall, cpu = time.perf_counter(), time.process_time()
    it = prepare()
    next(it)
    first = time.perf_counter() - wall
    collections.deque(itertools.islice(it, FIRST - 1), maxlen=0)
    first_k = time.perf_counter() - wall
    peak_k = _status("VmHWM") - base
    counted = min(length, int(os.environ.get("BILLION_PREFIX", PREFIX)))
    collections.deque(itertools.islice(it, counted - FIRST), maxlen=0)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {
        "first_s": first,
        "first_10k_s": first_k,
        "peak_10k_mb": peak_k / MB,
        "peak_mb": (_status("VmHWM") - base) / MB,
        "rate_wall": counted / wall,
        "rate_cpu": counted / cpu if cpu else float("nan"),
        "counted": counted,
        "length": length,
    }


def measure(impl: str, case: str, n: int, world: int = 64, prefix: int = PREFIX) -> dict[str, Any]:
    env = {
        "BILLION_PREFIX": str(prefix),
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]),
    }
    args = [sys.executable, "-m", "benchmarks.billion", "--child", impl, case, str(n), str(world)]
    proc = subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr else "failed"}
    out: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return out


# -- the parent: the table ---------------------------------------------------------------------
def _available() -> int:
    return _status_file("/proc/meminfo", "MemAvailable")


def _status_file(path: str, field: str) -> int:
    with open(path) as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    return 0


def plan(quick: bool, torch_max: int) -> list[tuple[str, str, int, int]]:
    sizes = [10**6, 10**7, 10**9] if quick else [10**6, 10**7, 10**8, 10**9]
    cases = []
    for n in sizes:
        for case in ("epoch", "shard", "resume"):
            cases.append(("pipeflow", case, n, 64))
            if n <= torch_max:
                cases.append(("torch", case, n, 64))
        cases.append(("pipeflow", "stream", n, 64))
        if n <= torch_max:
            cases.append(("pipeflow", "torchgen", n, 64))
    cases.append(("pipeflow", "shard", 10**9, 8))
    return cases


def run_all(quick: bool, torch_max: int) -> list[dict[str, Any]]:
    results = []
    for impl, case, n, world in plan(quick, torch_max):
        if (impl == "torch" or case == "torchgen") and n >= 10**8 and _available() < 12 * 1024 * MB:
            results.append(
                {
                    "impl": impl,
                    "case": case,
                    "n": n,
                    "world": world,
                    "error": "skipped: needs ~5 GB and under 12 GB is free here",
                }
            )
            continue
        r = measure(impl, case, n, world)
        results.append({"impl": impl, "case": case, "n": n, "world": world, **r})
        print(_line(results[-1]), file=sys.stderr, flush=True)
    return results


def _label(r: dict[str, Any]) -> str:
    what = {
        "epoch": "epoch",
        "shard": f"rank 0 of {r['world']}",
        "resume": "resume at 90%",
        "stream": "index stage alone",
        "torchgen": 'generator="torch"',
    }[r["case"]]
    return f"10^{len(str(r['n'])) - 1} {what}"


def _line(r: dict[str, Any]) -> str:
    if "error" in r:
        return f"{_label(r):<28} {r['impl']:<9} {r['error']}"
    prefix = "" if r["counted"] == r["length"] else f" (first {r['counted']:,})"
    return (
        f"{_label(r):<28} {r['impl']:<9} {r['first_s'] * 1e3:>10.3f} "
        f"{r['first_10k_s'] * 1e3:>10.2f} "
        f"{r['peak_10k_mb']:>8.1f} {r['peak_mb']:>8.1f} {r['rate_wall'] / 1e6:>7.1f} "
        f"{r['rate_cpu'] / 1e6:>7.1f}{prefix}"
    )


def table(results: list[dict[str, Any]]) -> str:
    head = (
        f"{'case':<28} {'impl':<9} {'first ms':>10} {'10k ms':>10} {'MB @10k':>8} {'peak MB':>8} "
        f"{'M/s':>7} {'M/s cpu':>7}"
    )
    return "\n".join([head, "-" * len(head), *(_line(r) for r in results)])


def markdown(results: list[dict[str, Any]]) -> str:
    lines = [
        "| case | | first index | first 10,000 | extra memory (at 10,000 / peak) "
        "| indices/s (wall / CPU) |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in results:
        if "error" in r:
            lines.append(f"| {_label(r)} | {r['impl']} | {r['error']} | | | |")
            continue
        note = "" if r["counted"] == r["length"] else f" (first {r['counted'] / 1e6:g}M)"
        lines.append(
            f"| {_label(r)} | {r['impl']} | {_ms(r['first_s'])} | {_ms(r['first_10k_s'])} | "
            f"{r['peak_10k_mb']:.1f} / {r['peak_mb']:,.0f} MB | "
            f"{r['rate_wall'] / 1e6:.1f}M / {r['rate_cpu'] / 1e6:.1f}M{note} |"
        )
    return "\n".join(lines)


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.2f} ms" if seconds < 1 else f"{seconds:.2f} s"


def run(quick: bool) -> list[Row]:
    """Headline rows for ``python -m pipeflow bench``: 10**7 samples, against torch."""
    rows = []
    for case, label in (("epoch", "RandomSampler"), ("shard", "DistributedSampler, rank 0 of 64")):
        ours, theirs = measure("pipeflow", case, 10**7), measure("torch", case, 10**7)
        rows.append(
            Row(
                f"first index of 10^7, {label}",
                "seconds",
                ours["first_s"],
                theirs["first_s"],
                "<= 0.01x",
                higher_is_better=False,
            )
        )
        rows.append(
            Row(
                f"extra memory, 10^7, {label}",
                "MB",
                ours["peak_mb"],
                theirs["peak_mb"],
                "<= 0.05x",
                higher_is_better=False,
            )
        )
    return rows


#: The issue's done-when, for n = 10**9: (case, world, metric, bound, higher is better).
GOALS = [
    ("epoch", 1, "first_10k_s", 0.1, False),
    ("epoch", 1, "peak_10k_mb", 20, False),
    ("shard", 8, "first_10k_s", 0.1, False),
    ("shard", 8, "peak_10k_mb", 20, False),
    ("resume", 1, "first_s", 0.1, False),
    ("resume", 1, "first_10k_s", 0.1, False),
    ("stream", 1, "rate_cpu", 10e6, True),
    ("stream", 1, "rate_wall", 10e6, True),
]


def goals(reps: int) -> str:
    """Measure the done-when *reps* times (fresh processes, 5 million indices each)."""
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(reps):
        for case, world in dict.fromkeys((c, w) for c, w, *_ in GOALS):
            runs.setdefault((case, world), []).append(
                measure("pipeflow", case, 10**9, world, prefix=5_000_000)
            )
    lines = [f"done-when at n = 10**9, medians of {reps} fresh processes:"]
    for case, world, metric, bound, higher in GOALS:
        values = sorted(r[metric] for r in runs[(case, world)])
        mid = values[len(values) // 2]
        ok = mid >= bound if higher else mid < bound
        what = f"{case} (rank of {world})" if world > 1 else case
        lines.append(
            f"  {what:<20} {metric:<12} median {mid:>14,.4f} (min {values[0]:,.4f}, "
            f"max {values[-1]:,.4f})  {'>=' if higher else '<'} {bound:,}  "
            f"{'met' if ok else 'not met'}"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--markdown", action="store_true", help="also print a Markdown table")
    parser.add_argument("--torch-max", type=int, default=10**8, help="largest n for torch")
    parser.add_argument("--goals", type=int, metavar="REPS", help="only the done-when, REPS times")
    parser.add_argument("--child", nargs=4, metavar=("IMPL", "CASE", "N", "WORLD"))
    args = parser.parse_args(argv)
    if args.goals:
        print(goals(args.goals))
        return 0
    if args.child:
        impl, case, n, world = args.child
        print(json.dumps(child(impl, case, int(n), int(world))))
        return 0
    print(f"{'case':<28} {'impl':<9} (streaming to stderr as measured)", file=sys.stderr)
    results = run_all(args.quick, args.torch_max)
    print(table(results))
    if args.markdown:
        print()
        print(markdown(results))
    return 0


if __name__ == "__main__":
    sys.exit(main())
