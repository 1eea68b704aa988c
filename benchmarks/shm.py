"""Shared memory a DataLoader holds: the peak during an epoch and what is left after it.

Issue 24's workload: a map-style dataset of 100 KB samples (``float32`` arrays of 25,000),
batches of *batch* samples, 2 worker processes (fork), ``persistent_workers=True``, two
epochs, the consumer dropping each batch before it asks for the next. Measured for
``torch.utils.data.DataLoader`` and for ``pf.DataLoader`` with the same arguments.

``/dev/shm`` is shared by every process on a machine, so each loader runs in a subprocess
with a ``/dev/shm`` of its own (a new mount namespace with a fresh tmpfs there; needs root
and ``unshare``; elsewhere it says so and measures the shared one). A thread of that
subprocess reads the tmpfs's usage (``statvfs``) every 2 ms: *peak* is the most it saw
during an epoch, *after* what it holds once the epoch ended and its batches were dropped
(the persistent workers still alive), once it is back where it started or 8 s later. Run::

    python -m benchmarks.shm                 # batch 10,000 (1 GB batches), 4 per epoch
    python -m benchmarks.shm --batch 1000    # 100 MB batches, 4 per epoch
    python -m benchmarks.shm --root DIR      # pf.DataLoader from another checkout
    python -m benchmarks.shm --shm-size 2g   # a container's /dev/shm (default: 90% of RAM)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import textwrap

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PROBE = textwrap.dedent(
    """
    import gc, json, os, sys, threading, time
    import numpy as np

    which, batch, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])

    def used():
        st = os.statvfs("/dev/shm")
        return (st.f_blocks - st.f_bfree) * st.f_frsize

    class Samples:
        def __len__(self):
            return batch * batches

        def __getitem__(self, i):
            return np.full(25_000, i % 1000, dtype=np.float32)  # 100 KB

    peak = [0]
    stop = threading.Event()

    def watch():
        while not stop.is_set():
            peak[0] = max(peak[0], used())
            time.sleep(0.002)

    if which == "torch":
        import torch.utils.data as tud
        DataLoader = tud.DataLoader
    else:
        import pipeflow as pf
        DataLoader = pf.DataLoader
    base = used()
    dl = DataLoader(Samples(), batch_size=batch, num_workers=2, persistent_workers=True,
                    multiprocessing_context="fork")
    threading.Thread(target=watch, daemon=True).start()
    epochs = []
    for epoch in range(2):
        peak[0] = 0
        start = time.perf_counter()
        for b in dl:
            del b
        took = time.perf_counter() - start
        gc.collect()
        settle = time.monotonic() + 8.0  # an idle pool gives back after 5 s; freeing takes more
        while used() > base and time.monotonic() < settle:
            time.sleep(0.05)
        epochs.append({"peak": peak[0] - base, "after": used() - base, "seconds": took})
    stop.set()
    where = sys.modules[DataLoader.__module__].__file__
    print(json.dumps({"which": which, "epochs": epochs, "from": where}))
    """
)


def probe(which: str, batch: int, batches: int, root: str, size: str | None) -> dict:
    """One loader's run (in a private ``/dev/shm`` of *size* when given): its epochs, or
    the last line of what it printed when it failed."""
    env = {**os.environ, "PYTHONPATH": root}
    cmd = [sys.executable, "-c", PROBE, which, str(batch), str(batches)]
    if size is not None:
        mount = f'mount -t tmpfs -o size={size} tmpfs /dev/shm && exec "$@"'
        cmd = ["unshare", "--mount", "--propagation", "private", "sh", "-c", mount, "sh", *cmd]
    done = subprocess.run(cmd, env=env, cwd=root, capture_output=True, text=True, timeout=1800)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return {"which": which, "failed": lines[-1] if lines else f"exit {done.returncode}"}
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=10_000, help="samples of 100 KB a batch")
    parser.add_argument("--batches", type=int, default=4, help="batches an epoch")
    parser.add_argument("--root", default=_ROOT, help="the pipeflow checkout to measure")
    parser.add_argument("--shm-size", default="90%", help="the private /dev/shm's size")
    args = parser.parse_args(argv)
    private = os.geteuid() == 0 and shutil.which("unshare") is not None
    if not private:
        print("(no private /dev/shm here: the numbers include other processes' use of it)")
    mib = 1 << 20
    print(f"batch {args.batch:,} x 100 KB = {args.batch * 100_000 / 1e6:,.0f} MB, ", end="")
    print(f"{args.batches} batches an epoch, 2 workers, persistent, fork, ", end="")
    print(f"/dev/shm {args.shm_size if private else 'shared'}")
    print(f"{'loader':<10} {'epoch':>5} {'peak MiB':>10} {'after MiB':>10} {'seconds':>8}")
    for which in ("torch", "pipeflow"):
        got = probe(which, args.batch, args.batches, args.root, args.shm_size if private else None)
        if "failed" in got:
            print(f"{which:<10} failed: {got['failed'][:200]}")
            continue
        for k, e in enumerate(got["epochs"]):
            row = f"{which:<10} {k:>5} {e['peak'] / mib:>10,.0f} {e['after'] / mib:>10,.1f}"
            print(f"{row} {e['seconds']:>8.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
