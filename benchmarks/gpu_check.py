"""The GPU check: pinned output, correct values after async copies, and the copy's overlap.

Run on a machine with a CUDA GPU: ``python -m benchmarks.gpu_check`` (about a minute). It
prints one JSON line per measurement and exits non-zero if a correctness check fails.

1. ``pf.pin_memory()`` pins every tensor of nested batches.
2. ``pf.pin_memory() | pf.to_device("cuda")`` delivers exactly the host values.
3. Host-to-device throughput (GB/s) of 3x224x224 float32 batches of 64.
4. Overlap: a training step of known length on each batch; the time per batch with pipeflow's
   side-stream prefetch against torch's ``DataLoader(pin_memory=True)`` followed by
   ``.to(device, non_blocking=True)`` on the same batches.
"""

from __future__ import annotations

import json
import sys
import time
from typing import Any

import torch
import torch.utils.data as tud

import pipeflow as pf


class Images(tud.Dataset):
    def __init__(self, n: int) -> None:
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> dict[str, Any]:
        return {"x": torch.full((3, 224, 224), float(i)), "y": i}


def say(**kw: Any) -> None:
    print(json.dumps(kw), flush=True)


def step(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """About as long as a small model's step: a few matmuls on the batch."""
    h = x.flatten(1)[:, :4096]
    for _ in range(20):
        h = torch.tanh(h @ weight)
    return h.sum()


def main() -> int:
    if not torch.cuda.is_available():
        say(check="cuda", ok=False, why="no CUDA device")
        return 1
    dev = torch.device("cuda")
    ds = Images(64 * 40)
    ok = True

    batches = list(pf.indices(ds) | pf.batch(64) | pf.fetch(ds) | pf.collate())[:4]
    pinned = list(pf.from_iterable(batches) | pf.pin_memory())
    pinned_ok = all(b["x"].is_pinned() and b["y"].is_pinned() for b in pinned)
    say(check="pinned", ok=pinned_ok)
    ok &= pinned_ok

    moved = pf.indices(ds) | pf.batch(64) | pf.fetch(ds) | pf.collate() | pf.pin_memory()
    moved = moved | pf.to_device(dev)
    values_ok = True
    for k, b in enumerate(moved):
        want = torch.arange(64 * k, 64 * (k + 1), dtype=torch.float32)
        values_ok &= bool((b["x"][:, 0, 0, 0].cpu() == want).all()) and b["x"].is_cuda
    torch.cuda.synchronize()
    say(check="values after async copy", ok=values_ok)
    ok &= values_ok

    # host-to-device throughput on pinned batches
    host = pinned[0]["x"]
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(50):
        host.to(dev, non_blocking=True)
    torch.cuda.synchronize()
    gbs = 50 * host.numel() * 4 / (time.perf_counter() - start) / 1e9
    say(measure="host-to-device GB/s (pinned, 38.5 MB batches)", value=round(gbs, 2))

    weight = torch.randn(4096, 4096, device=dev) / 64

    def timed(batches_iter: Any, to_device: bool) -> float:
        torch.cuda.synchronize()
        start = time.perf_counter()
        n = 0
        for b in batches_iter:
            x = b["x"].to(dev, non_blocking=True) if to_device else b["x"]
            step(x, weight)
            n += 1
        torch.cuda.synchronize()
        return (time.perf_counter() - start) / n

    for _ in range(2):  # warm up both
        theirs = timed(tud.DataLoader(ds, batch_size=64, pin_memory=True, num_workers=4), True)
        ours_loader = pf.DataLoader(ds, batch_size=64, num_workers=4).pipeline()
        ours = timed(ours_loader | pf.pin_memory() | pf.to_device(dev), False)
    say(
        measure="seconds per batch, step + copy",
        torch=round(theirs, 5),
        pipeflow=round(ours, 5),
        ratio=round(theirs / ours, 2),
    )
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
