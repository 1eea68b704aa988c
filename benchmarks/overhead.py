"""What the always-on statistics cost on the tiny-sample workload (must stay under 5 %).

Run: ``python -m benchmarks.overhead [--quick]``. The same pf.DataLoader pipeline with
recording on and off, alternating; the row's "torch" column is torch's DataLoader, for scale.
"""

from __future__ import annotations

import sys

import torch.utils.data as tud

import pipeflow as pf
from benchmarks import datasets as data
from benchmarks._harness import Row, cli, epoch_rate, median


def run(quick: bool) -> list[Row]:
    ds = data.Points(10_000 if quick else 100_000)
    dl = pf.DataLoader(ds, batch_size=64)
    loader = dl.pipeline()
    ref = tud.DataLoader(ds, batch_size=64)
    on, off, torch_rates = [], [], []
    for rep in range(5 if quick else 15):
        for enabled in (True, False) if rep % 2 else (False, True):
            loader.set_stats(enabled)
            (on if enabled else off).append(epoch_rate(dl)[0])
        torch_rates.append(epoch_rate(ref)[0])
    loader.set_stats(True)
    # Each repetition's two epochs run back to back, under the same load: the median of their
    # own ratios is what a shared machine's drifting load moves least.
    overhead = 1 - median([a / b for a, b in zip(on, off)])
    return [
        Row(
            "stats on, tiny samples, batch 64",
            "samples/s",
            median(on),
            median(torch_rates),
            "overhead < 5%",
            note=f"stats off: {median(off):,.0f}/s; overhead {overhead:.1%} (median of pairs)",
            met=overhead < 0.05,
        )
    ]


main = cli(__doc__, run)


if __name__ == "__main__":
    sys.exit(main())
