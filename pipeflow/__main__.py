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
        "--quick", action="store_true", help="a short run, under two minutes (default: full)"
    )
    bench.add_argument(
        "suites",
        nargs="*",
        metavar="SUITE",
        help="any of: throughput, composed, startup, resume, overhead, memory (the default: "
        "all of these), aio, billion, sequences, peers (torchdata.nodes, Grain, SPDL)",
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


def _bench(quick: bool, suites: list[str]) -> int:
    """Run the suites in ``benchmarks/`` (next to this package in a checkout)."""
    import importlib
    import os
    import warnings
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__init__.py").is_file():
        print("python -m pipeflow bench runs the benchmarks/ folder of a pipeflow checkout")
        return 2
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
    harness = importlib.import_module("benchmarks._harness")
    rows = []
    for name in suites or ["throughput", "composed", "startup", "resume", "overhead", "memory"]:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"running {name} ...", flush=True)
        rows.extend(module.run(quick))
    print(harness.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
