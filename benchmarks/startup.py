"""Time to first batch, with fork and with spawn, each measured in a fresh interpreter.

Run: ``python -m benchmarks.startup [--quick]`` from the repository root. The child
(``python -m benchmarks.startup --child KIND METHOD``) imports torch only for torch's loader,
as a user's script would only import what it uses.

The "second loader" rows run :mod:`benchmarks.startup_script` instead, in the setting of most
training scripts: the script imports torch at the top and the dataset's module imports torch
(a ``TensorDataset``). It builds ``pf.DataLoader`` or torch's ``DataLoader`` three times in one
process; the rows time the second and third (pipeflow's warm start: their workers fork from a
server that imported all that once), and the "first loader" rows the first.
"""

from __future__ import annotations

import argparse
import compileall
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks._harness import Row, median, table

ROOT = Path(__file__).resolve().parent.parent


def child(kind: str, method: str) -> None:
    """Build a 2-worker loader over a numpy dataset and time iter() + next().

    Both scripts import torch up front, as a training script does; what differs is what the
    workers must import when they start (spawn) and what they inherit (fork).
    """
    import torch  # noqa: F401

    from benchmarks.datasets import Points

    ds = Points(10_000)
    if kind == "torch":
        import torch.utils.data as tud

        loader = tud.DataLoader(ds, batch_size=64, num_workers=2, multiprocessing_context=method)
    else:
        import pipeflow as pf

        loader = (
            pf.indices(ds)
            | pf.batch(64)
            | pf.parallel_map(
                pf.fetch(ds) | pf.collate(), workers=2, backend="process", mp_context=method
            )
        )
    start = time.perf_counter()
    it = iter(loader)
    next(it)
    elapsed = time.perf_counter() - start
    del it
    print(json.dumps({"seconds": elapsed}))


def _child(argv: list[str], timeout: int, **env: str) -> Any:
    """Run *argv* in a fresh interpreter from the repository root; its last line, as JSON."""
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    out = subprocess.run(
        [sys.executable, *argv],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path, **env},
        capture_output=True,
        text=True,
        check=True,
        timeout=timeout,
    ).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(kind: str, method: str) -> float:
    return float(_child(["-m", "benchmarks.startup", "--child", kind, method], 120)["seconds"])


def measure_loaders(kind: str, method: str, warm: bool = True, loaders: int = 3) -> list[float]:
    """Each loader's time to first batch, for *loaders* loaders built in turn in one process."""
    script = str(ROOT / "benchmarks" / "startup_script.py")
    got = _child(
        [script, kind, method, str(loaders)], 300, PIPEFLOW_WARM_START="1" if warm else "0"
    )
    return [float(s) for s in got["seconds"]]


def run_loaders(
    reps: int, methods: tuple[str, ...] = ("spawn", "forkserver"), quick: bool = False
) -> list[Row]:
    """The warm start's rows: the second and later loaders, and the first (also with the warm
    start off, as pipeflow was before it), against torch's. *quick*: two loaders a script,
    and no warm-start-off row (its workers import torch once each: the slowest part)."""
    rows = []
    loaders = 2 if quick else 3
    for method in methods:
        kinds = ["pipeflow", "torch"] if quick else ["pipeflow", "off", "torch"]
        runs: dict[str, list[list[float]]] = {kind: [] for kind in kinds}
        for rep in range(reps):
            for kind in list(runs) if rep % 2 == 0 else reversed(list(runs)):
                lib = "torch" if kind == "torch" else "pipeflow"
                runs[kind].append(measure_loaders(lib, method, kind != "off", loaders))
        for label, pf_kind, pick, target in (
            (f"time to first batch, second {method} loader", "pipeflow", slice(1, None), "<= 0.1x"),
            (f"time to first batch, first {method} loader", "pipeflow", slice(0, 1), ""),
            ("  the same, warm start off", "off", slice(0, 1), ""),
        ):
            if pf_kind not in runs:
                continue
            times = {
                "pipeflow": [t for r in runs[pf_kind] for t in r[pick]],
                "torch": [t for r in runs["torch"] for t in r[pick]],
            }
            rows.append(
                Row(
                    label,
                    "seconds",
                    median(times["pipeflow"]),
                    median(times["torch"]),
                    target,
                    higher_is_better=False,
                    samples=times,
                )
            )
    return rows


def run(quick: bool) -> list[Row]:
    # Both libraries start from byte-compiled modules, as an installed package does (torch's
    # were compiled at install; ours may not be where PYTHONDONTWRITEBYTECODE is set).
    compileall.compile_dir(ROOT / "pipeflow", quiet=1)
    compileall.compile_dir(ROOT / "benchmarks", quiet=1)
    # --quick: one run of each child, fork only, and the warm start's rows for spawn only
    # (their first loader is the spawn row's measure, in a training script's setting). Every
    # child imports torch, and each spawn worker of torch's imports it again: on 2 cores that
    # is seconds each, which is where the full run's minutes go.
    reps = 1 if quick else 7
    rows = []
    methods = (("fork", "<= 0.5x"),) if quick else (("fork", "<= 0.5x"), ("spawn", "<= 0.1x"))
    for method, target in methods:
        times: dict[str, list[float]] = {"pipeflow": [], "torch": []}
        for rep in range(reps):
            for kind in ("pipeflow", "torch") if rep % 2 == 0 else ("torch", "pipeflow"):
                times[kind].append(measure(kind, method))
        rows.append(
            Row(
                f"time to first batch, 2 workers, {method}",
                "seconds",
                median(times["pipeflow"]),
                median(times["torch"]),
                target,
                higher_is_better=False,
                samples=times,
            )
        )
    if quick:
        return rows + run_loaders(1, ("spawn",), quick=True)
    return rows + run_loaders(reps)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--loaders", action="store_true", help="only the warm start's rows")
    parser.add_argument("--child", nargs=2, metavar=("KIND", "METHOD"))
    args = parser.parse_args(argv)
    if args.child:
        child(*args.child)
        return 0
    if args.loaders:
        print(table(run_loaders(3 if args.quick else 5)))
        return 0
    print(table(run(args.quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
