"""Variable-length data: packing against Grain, padding by budget and by bucket, resuming packs.

One synthetic corpus whose lengths are log-normal (median 300 tokens, 99th percentile 4,000),
rows of 2,048 tokens:

- packing efficiency and rows/s of ``pf.pack(2048, window=64)`` (first fit) against Grain's
  ``FirstFitPackIterDataset`` (``pip install "pipeflow[bench]"``: PyPI ``grain``) with 64 bins,
  on the same sequences: those longer than a row are cut into row-length pieces first for
  both (Grain truncates them; pack would cut them itself), Grain's elements are dicts
  ``{"tokens": array}``, the form it packs, read without its prefetch threads;
- padded tokens per real token of ``batch(max_tokens=..., window=...)`` and of
  ``bucket(lengths=..., max_tokens=...)`` against a plain shuffled ``batch`` padded to its
  longest item, on the sequences cropped to 4,096 tokens (a model's context);
- the share of the epoch a resumed pass re-reads at 90 % of an epoch of packed rows, against
  torch's workaround (iterating the consumed part again: 90 %).

Run: ``python -m benchmarks.sequences [--quick]`` (or ``python -m pipeflow bench sequences``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pipeflow as pf
from benchmarks._harness import Row, cli, median

ROW = 2048
WINDOW = 64  # rows open at once: pack's window, Grain's num_packing_bins
CONTEXT = 4096  # the crop for the padding rows
BUDGET = 16384  # tokens per padded batch


def corpus(n: int, seed: int = 0) -> list[int]:
    """Log-normal lengths: median 300 (``exp(mu)``), 99th percentile 4,000."""
    sigma = np.log(4000 / 300) / 2.3263  # the 99th percentile is mu + 2.3263 sigma
    lengths = np.random.default_rng(seed).lognormal(np.log(300), sigma, size=n)
    return [max(1, int(x)) for x in lengths]


def row_pieces(lengths: list[int]) -> list[np.ndarray[Any, Any]]:
    """The sequences as token arrays, the longer ones cut into row-length pieces."""
    out = []
    for i, n in enumerate(lengths):
        seq = np.arange(n, dtype=np.int32) + i
        out += [seq[a : a + ROW] for a in range(0, n, ROW)]
    return out


def efficiency(rows: list[dict[str, Any]], segment_key: str) -> float:
    real = sum(int(np.count_nonzero(r[segment_key])) for r in rows)
    return real / (ROW * len(rows))


def timed(make: Callable[[], Any]) -> tuple[list[Any], float]:
    start = time.perf_counter()
    rows = list(make())
    return rows, time.perf_counter() - start


def grain_packer(pieces: list[np.ndarray[Any, Any]]) -> Callable[[], Any] | None:
    """Grain's first-fit packer over *pieces*, or ``None`` when grain is not installed."""
    try:
        import grain
    except ImportError:
        return None

    # Read in the calling thread: the default prefetch (16 threads, 500 elements) polls its
    # futures on every element, which made Grain 6x slower here on an in-memory list.
    direct = grain.ReadOptions(num_threads=0, prefetch_buffer_size=0)

    def make() -> Any:
        source = grain.MapDataset.source(pieces).map(lambda x: {"tokens": x})
        ds = source.to_iter_dataset(read_options=direct)
        return grain.experimental.FirstFitPackIterDataset(
            ds, length_struct={"tokens": ROW}, num_packing_bins=WINDOW, shuffle_bins=False
        )

    return make


def packing(lengths: list[int], reps: int) -> list[Row]:
    pieces = row_pieces(lengths)
    ours = lambda: pf.from_iterable(pieces) | pf.pack(ROW, window=WINDOW)  # noqa: E731
    theirs = grain_packer(pieces)
    rates: dict[str, list[float]] = {"pipeflow": [], "grain": []}
    eff = {"pipeflow": 0.0, "grain": float("nan")}
    for make in (ours, theirs):  # warm up: the first pass pays for first-touch allocations
        if make is not None:
            timed(make)
    for rep in range(reps):
        for name in ("pipeflow", "grain") if rep % 2 == 0 else ("grain", "pipeflow"):
            make = ours if name == "pipeflow" else theirs
            if make is None:
                continue
            rows, seconds = timed(make)
            rates[name].append(len(rows) / seconds)
            key = "segment_ids" if name == "pipeflow" else "tokens_segment_ids"
            eff[name] = efficiency(rows, key)
    note = f"{len(lengths):,} sequences, {sum(lengths):,} tokens; 'torch' column: Grain"
    if theirs is None:
        note = 'Grain is not installed (pip install "pipeflow[bench]"): no peer measured'
    concat_rows, _ = timed(lambda: pf.from_iterable(pieces) | pf.pack(ROW, method="concat"))
    return [
        Row(
            "pack first_fit vs Grain FirstFit, 64 bins",
            "real share",
            eff["pipeflow"],
            eff["grain"],
            ">= 1.0x",
            note=note,
        ),
        Row(
            "  same, rows/s",
            "rows/s",
            median(rates["pipeflow"]),
            median(rates["grain"]),
            ">= 2x",
            samples=rates,
        ),
        Row(
            "  pack concat, window 64, vs first_fit",
            "real share",
            efficiency(concat_rows, "segment_ids"),
            eff["pipeflow"],
            note="'torch' column: pack first_fit; concat pads one row per 64 rows at most",
        ),
    ]


def overhead(batches: list[list[int]]) -> float:
    """Padded tokens per real token over *batches* of lengths."""
    real = sum(sum(b) for b in batches)
    padded = sum(len(b) * max(b) for b in batches)
    return (padded - real) / real


def padding(lengths: list[int]) -> list[Row]:
    cropped = [min(n, CONTEXT) for n in lengths]
    n = len(cropped)
    size = BUDGET // int(np.mean(cropped))  # the plain batch: about the budget on average
    plain = pf.indices(n) | pf.shuffle(seed=0) | pf.batch(size)
    budget = pf.indices(n) | pf.shuffle(seed=0)
    budget |= pf.batch(max_tokens=BUDGET, length=cropped.__getitem__, window=2000, seed=0)
    buckets = pf.indices(n) | pf.bucket(64, lengths=cropped, max_tokens=BUDGET, seed=0)
    base = overhead([[cropped[i] for i in b] for b in plain])
    notes = f"'torch' column: indices | shuffle | batch({size}), padded to each batch's longest"
    return [
        Row(
            "pad: batch(max_tokens=16384, window=2000)",
            "pad/real",
            overhead([[cropped[i] for i in b] for b in budget]),
            base,
            "pipeflow < 0.10",
            higher_is_better=False,
            note=notes,
        ),
        Row(
            "pad: bucket(64 quantiles, max_tokens=16384)",
            "pad/real",
            overhead([[cropped[i] for i in b] for b in buckets]),
            base,
            "pipeflow < 0.10",
            higher_is_better=False,
        ),
    ]


class Counted:
    """The corpus by index, counting the sequences read."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths, self.reads = lengths, 0

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        self.reads += 1
        return np.arange(self.lengths[i], dtype=np.int32)


def resume(lengths: list[int]) -> list[Row]:
    ds = Counted(lengths)

    def make() -> Any:
        return pf.indices(ds) | pf.shuffle(seed=0) | pf.fetch(ds, batched=False) | pf.pack(ROW)

    rows = len(list(make()))
    run = make()
    it = iter(run)
    ds.reads = 0
    for _ in range(rows * 9 // 10):
        next(it)
    read, state = ds.reads, run.state_dict()
    del it
    again = make()
    again.load_state_dict(state)
    ds.reads = 0
    rest = len(list(again))
    reread = read + ds.reads - len(lengths)  # sequences the two passes both read
    assert rest == rows - rows * 9 // 10
    return [
        Row(
            "resume at 90% of packed rows: re-read",
            "of epoch",
            reread / len(lengths),
            0.9,
            "pipeflow < 0.01",
            higher_is_better=False,
            note=f"{reread} of {len(lengths):,} sequences read again; 'torch' column: "
            "iterating the consumed part again",
        )
    ]


def run(quick: bool) -> list[Row]:
    lengths = corpus(20_000 if quick else 50_000)
    return [*packing(lengths, 1 if quick else 3), *padding(lengths), *resume(lengths)]


main = cli(__doc__, run)


if __name__ == "__main__":
    sys.exit(main())
