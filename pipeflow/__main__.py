"""``python -m pipeflow``: the demo (the README's first command) and the benchmarks."""

from __future__ import annotations

import argparse
import sys
from typing import Any

DESCRIPTION = """\
pipeflow's command line: the demo (the README's first command) and the benchmarks.

  python -m pipeflow demo           train a small CNN through a pipeline, then print its stats
  python -m pipeflow bench --quick  pipeflow and torch's DataLoader side by side

"python -m pipeflow <command> --help" lists a command's options."""


def _at_least(low: int) -> Any:
    """An argparse type: an integer of at least *low*."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            msg = f"must be an integer (got {text!r})"
            raise argparse.ArgumentTypeError(msg) from None
        if value < low:
            msg = f"must be at least {low} (got {value})"
            raise argparse.ArgumentTypeError(msg)
        return value

    parse.__name__ = f"integer >= {low}"  # what argparse names in its error message
    return parse


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run a sub-command."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeflow",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="{demo,bench}")
    demo = sub.add_parser(
        "demo",
        help="train a small CNN through a pipeline; show its stats",
        description="Generate (once) or read labelled images, train a small CNN on them "
        "through a pipeflow pipeline with worker processes, print the held-out accuracy "
        "after each epoch, then the loader's statistics and its bottleneck.",
    )
    demo.add_argument(
        "--data-dir",
        metavar="DIR",
        help="a folder of class sub-directories of images, <DIR>/<class>/<image> "
        "(default: generated images of four shapes)",
    )
    demo.add_argument(
        "--images",
        type=_at_least(4),
        default=3000,
        metavar="N",
        help="how many shape images to generate; a fifth are held out (default: %(default)s)",
    )
    demo.add_argument(
        "--epochs",
        type=_at_least(1),
        default=3,
        metavar="N",
        help="passes over the training images (default: %(default)s)",
    )
    demo.add_argument(
        "--workers",
        type=_at_least(0),
        default=2,
        metavar="N",
        help="workers that decode and augment; 0 runs them in the training loop "
        "(default: %(default)s)",
    )
    demo.add_argument(
        "--backend",
        choices=["process", "thread"],
        default="process",
        help="what the workers are (default: %(default)s)",
    )
    demo.add_argument(
        "--batch-size",
        type=_at_least(1),
        default=64,
        metavar="N",
        help="images per training step (default: %(default)s)",
    )
    demo.add_argument(
        "--image-size",
        type=_at_least(1),
        default=32,
        metavar="PX",
        help="images are resized to PX x PX pixels (default: %(default)s)",
    )
    demo.add_argument(
        "--seed",
        type=int,
        default=0,
        help="for the generated images, the split, the shuffle, the augmentation and the "
        "model (default: %(default)s)",
    )
    demo.add_argument(
        "--cache",
        metavar="DIR",
        help="where generated images go "
        "(default: $XDG_CACHE_HOME/pipeflow, else ~/.cache/pipeflow)",
    )
    demo.add_argument(
        "--progress",
        action="store_true",
        help="show the progress bar even when the output is not a terminal "
        "(default: only in a terminal)",
    )
    bench = sub.add_parser(
        "bench",
        help="pipeflow and torch.utils.data.DataLoader side by side (from a checkout)",
        description="Run the benchmarks/ suites of a pipeflow checkout and print one table: "
        "pipeflow's and torch's medians, their ratio, the goal, and whether it was met.",
    )
    bench.add_argument(
        "--quick",
        action="store_true",
        help="a short run, about a minute of CPU time (so about a minute on 2 idle cores, "
        "longer on a busy machine); noisier than the full run (default: full)",
    )
    bench.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help="any of: throughput, composed, startup, resume, overhead, memory (the default: "
        "all of these), aio, billion, sequences, shards, ray, peers (torchdata.nodes, Grain, SPDL)",
        default=[],
    )
    args = parser.parse_args(argv)
    if args.command == "bench":
        return _bench(args.quick, args.suites)
    if args.command == "demo":
        from pipeflow.demo import run_demo

        return run_demo(
            data_dir=args.data_dir,
            images=args.images,
            epochs=args.epochs,
            workers=args.workers,
            backend=args.backend,
            batch_size=args.batch_size,
            seed=args.seed,
            image_size=args.image_size,
            cache=args.cache,
            progress=args.progress,
        )
    return 2  # pragma: no cover - argparse rejects unknown commands


#: The suites ``bench`` runs when none is named.
SUITES = ["throughput", "composed", "startup", "resume", "overhead", "memory"]

NO_CHECKOUT = """\
python -m pipeflow bench runs the benchmarks/ folder of pipeflow's source, which is not
installed with the package (this pipeflow is at {where}).
To run them, get the source and run the command from its folder, e.g.:
  git clone <pipeflow's repository> pipeflow && cd pipeflow
  python -m pipeflow bench --quick     # with this environment's python
or, from a folder that has pipeflow's source, `pip install -e .` there first."""


def _bench(quick: bool, suites: list[str]) -> int:
    """Run the suites in ``benchmarks/`` (next to this package in a checkout), saying when
    each starts and how long it took, then print one table and its reading."""
    import time
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__init__.py").is_file():
        print(NO_CHECKOUT.format(where=Path(__file__).resolve().parent), file=sys.stderr)
        return 2
    harness = _bench_setup(root)
    import importlib

    rows = []
    chosen = suites or SUITES
    begun = time.perf_counter()
    for k, name in enumerate(chosen, 1):
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"[{k}/{len(chosen)}] {name} ...", end="", flush=True)
        start = time.perf_counter()
        got = module.run(quick)
        print(f" {len(got)} rows in {time.perf_counter() - start:.0f} s", flush=True)
        rows.extend(got)
    print(f"all suites: {time.perf_counter() - begun:.0f} s\n")
    print(harness.table(rows, quick))
    return 0


def _bench_setup(root: Any) -> Any:
    """Make the checkout's ``benchmarks`` importable (here and in the suites' child processes),
    quiet torch's worker-count warning, and return the harness module."""
    import importlib
    import os
    import warnings

    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])
    )
    # torch warns when a DataLoader has more workers than this machine has cores. The suites
    # fix their worker counts as part of each workload (16 torch workers against 5 ms of I/O
    # latency per sample: they wait, they don't compute), so on a small machine the warning
    # only repeats what the table's row already says.
    warnings.filterwarnings(
        "ignore",
        message=r"This DataLoader will create \d+ worker processes in total",
        category=UserWarning,
        module="torch.utils.data.dataloader",
    )
    return importlib.import_module("benchmarks._harness")


if __name__ == "__main__":
    sys.exit(main())
