"""``python -m pipeflow``: the demo (the README's first command) and the benchmarks."""

from __future__ import annotations

import argparse
import sys


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and run a sub-command."""
    parser = argparse.ArgumentParser(prog="python -m pipeflow", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser("demo", help="load a generated dataset through a pipeline")
    demo.add_argument("--samples", type=int, default=20_000, help="dataset size")
    demo.add_argument("--batch-size", type=int, default=64)
    demo.add_argument("--epochs", type=int, default=2)
    demo.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.command == "demo":
        from pipeflow.demo import run_demo

        return run_demo(
            samples=args.samples, batch_size=args.batch_size, epochs=args.epochs, seed=args.seed
        )
    return 2  # pragma: no cover - argparse rejects unknown commands


if __name__ == "__main__":
    sys.exit(main())
