"""``python -m pipeflow``: the demo (the README's first command) and the benchmarks."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run a sub-command."""
    parser = argparse.ArgumentParser(prog="python -m pipeflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="train a small CNN through a pipeline; show its stats")
    demo.add_argument(
        "--data-dir",
        help="a folder of class sub-directories of images "
        "(default: generate shapes into the cache)",
    )
    demo.add_argument("--images", type=int, default=3000, help="images to generate")
    demo.add_argument("--epochs", type=int, default=3)
    demo.add_argument("--workers", type=int, default=2)
    demo.add_argument("--backend", choices=["process", "thread"], default="process")
    demo.add_argument("--batch-size", type=int, default=64)
    demo.add_argument("--image-size", type=int, default=32)
    demo.add_argument("--seed", type=int, default=0)
    demo.add_argument("--cache", help="where generated images go (default ~/.cache/pipeflow)")
    demo.add_argument(
        "--progress",
        action="store_true",
        help="show the progress bar even when output is not a terminal",
    )
    bench = sub.add_parser(
        "bench", help="pipeflow and torch.utils.data.DataLoader side by side (from a checkout)"
    )
    bench.add_argument("--quick", action="store_true", help="a short run (under two minutes)")
    bench.add_argument(
        "suites",
        nargs="*",
        help="throughput, startup, resume, overhead, memory (default: all)",
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
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent
    if not (root / "benchmarks" / "__init__.py").is_file():
        print("python -m pipeflow bench runs the benchmarks/ folder of a pipeflow checkout")
        return 2
    sys.path.insert(0, str(root))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        filter(None, [str(root), os.environ.get("PYTHONPATH")])
    )
    harness = importlib.import_module("benchmarks._harness")
    rows = []
    for name in suites or ["throughput", "startup", "resume", "overhead", "memory"]:
        module = importlib.import_module(f"benchmarks.{name}")
        print(f"running {name} ...", flush=True)
        rows.extend(module.run(quick))
    print(harness.table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
