"""The composed pipe API against the facade and torch, on the tiny-sample workload.

Run: ``python -m benchmarks.composed [--quick]``. Three loaders over the same 100,000 in-memory
rows, batch 64, shuffled, no workers, timed in one process with alternating order:

- ``pf.indices(ds) | pf.shuffle(seed=0) | pf.batch(64) | pf.fetch(ds) | pf.collate()``
- ``pf.DataLoader(ds, batch_size=64, shuffle=True)``
- ``torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True)``

Statistics stay on (the default): the point is that counting them costs nothing measurable.
"""

from __future__ import annotations

import argparse
import sys

import torch
import torch.utils.data as tud

import pipeflow as pf
from benchmarks import datasets as data
from benchmarks._harness import Row, compare, median, table


def run(quick: bool) -> list[Row]:
    ds = data.Points(20_000 if quick else 100_000)
    reps = 5 if quick else 9

    def composed() -> pf.Loader:
        return pf.indices(ds) | pf.shuffle(seed=0) | pf.batch(64) | pf.fetch(ds) | pf.collate()

    def facade() -> object:
        return pf.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
        )

    def reference() -> object:
        return tud.DataLoader(
            ds, batch_size=64, shuffle=True, generator=torch.Generator().manual_seed(0)
        )

    rates = compare({"pipe": composed, "facade": facade, "torch": reference}, reps)
    pipe, fac, ref = median(rates["pipe"]), median(rates["facade"]), median(rates["torch"])
    return [
        Row(
            "pipe API, tiny samples, batch 64, vs torch",
            "samples/s",
            pipe,
            ref,
            ">= 3x",
        ),
        Row(
            "pipe API vs pf.DataLoader (same work)",
            "samples/s",
            pipe,
            fac,
            ">= 1.0x",
            note=f"pf.DataLoader / torch: {fac / ref:.2f}x",
        ),
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true")
    print(table(run(parser.parse_args(argv).quick)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
