"""``pf.cache`` on a decode-heavy pipeline, against the same pipeline uncached and against
torch's DataLoader with the per-worker dict cache users write in ``__getitem__`` today.

The dataset: *N* JPEG files (448x448 px, about 90 KB each, written once into a temporary
directory); ``dataset[i]`` opens file *i*, decodes it and resizes it to 96x96 (bilinear), a
``uint8`` HWC numpy array of 27 KiB: about 2 ms a sample on one core (the run prints what it
measured). Every row reads it in batches of 64, shuffled, with 2 persistent worker processes,
for 5 epochs:

- ``pf-uncached``: ``pf.indices(ds) | pf.shuffle(seed=0) | pf.batch(64)
  | pf.parallel_map(pf.fetch(ds) | pf.collate(), workers=2, backend="process",
  persistent=True)``;
- ``pf-cache-workers``: the same with ``pf.cache()`` between ``fetch`` and ``collate``: the
  worker processes share one copy of each sample, in files in ``/dev/shm`` that they map;
- ``pf-cache-main``: ``pf.indices(ds) | pf.shuffle(seed=0) | pf.parallel_map(pf.fetch(ds),
  workers=2, backend="process", persistent=True) | pf.cache() | pf.batch(64) | pf.collate()``:
  the samples are kept in the main process;
- ``pf-uncached-samples``: that pipeline without the cache (its workers get one sample at a
  time, where ``pf-uncached``'s get a batch), to tell the cost of the cache from the cost of
  that shape in ``pf-cache-main``'s first epoch;
- ``torch-dict``: ``torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True,
  num_workers=2, persistent_workers=True)`` over a dataset whose ``__getitem__`` keeps what it
  decoded in a dict: each worker fills its own copy, and hits only on the indices it saw
  before (about half in epoch 2, three quarters in epoch 3, ...);
- ``torch``: the same DataLoader, uncached.

Each row runs in a fresh subprocess (nothing inherited, its memory its own) that this process
samples from outside every 200 ms (a sample costs about 20 ms of CPU, taken from the 2 cores
the row runs on), over the subprocess and its workers, as ``benchmarks/memory.py`` does:
``Pss_Anon + Pss_Shmem`` of each process (PSS counts a shared page once in the sum), plus the
bytes of the cache's files in ``/dev/shm`` (a file no process maps at the moment has no PSS),
less the PSS of the mappings of those files (counted already).
"Added" is the peak during the 5 epochs (the last sample is taken after the fifth, with the
workers alive) minus the same sum after the loader is built, before ``iter(loader)``: it
includes starting the workers. The loop reads a strided subset of each batch (its sum: a
checksum of the epoch, which every row must share).

Each row runs *reps* times (3 by default), the rows in turn, the order reversed every other
round. The machine's load moves more between runs than the goals' margins, so a ratio is the
median over the rounds of the ratio within a round (the two runs minutes apart at most); the
other columns are medians. The goals, for each cached pipeflow row: epochs 2-5 at least 10x
the rate of ``pf-uncached`` and 2x ``torch-dict``'s; the first epoch at most 1.1x
``pf-uncached``'s time; the memory added at most 1/workers (1/2) of ``torch-dict``'s, both as
added and as the cache's own (what the row added less what its uncached twin added: starting
the workers and moving batches cost 36 to 67 MB in every row). The images are flushed to
disk before the first row (written back in the background, they slowed the rows then). Run::

    python benchmarks/cache.py            # 1,000 samples, 3 rounds: about 100 s
    python benchmarks/cache.py --quick    # 300 samples, 1 round: about 20 s
    python benchmarks/cache.py --only pf-cache-main   # with pf-uncached and torch-dict
    python -m pipeflow bench cache        # the goals as rows of the bench table

``results(...)`` returns every measurement of every row as a dict; ``run(quick)`` gives
``python -m pipeflow bench`` its rows (``benchmarks._harness.Row``).
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from typing import Any

import numpy as np

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if not __package__:  # run as ``python benchmarks/cache.py``: make ``benchmarks`` importable
    sys.path.insert(0, _ROOT)

from benchmarks._harness import Row
from benchmarks.memory import Child, _rollup, _tree

ITEMS = 1000
QUICK_ITEMS = 300
REPS = 3
QUICK_REPS = 1
EPOCHS = 5
BATCH_SIZE = 64
WORKERS = 2
SOURCE_PX = 448  # the JPEG's side: sets the decode's cost (about 2 ms on the 2-core machine)
OUT_PX = 96  # the sample's side after the resize
INTERVAL = 0.2  # seconds between memory samples (one takes ~20 ms of CPU)
MB = 1024 * 1024
SHM = "/dev/shm"

#: The rows, in the order of the table: the reference first.
VARIANTS = (
    "pf-uncached",
    "pf-cache-workers",
    "pf-cache-main",
    "pf-uncached-samples",
    "torch-dict",
    "torch",
)
CACHED = ("pf-cache-workers", "pf-cache-main")
DESCRIBE = {
    "pf-uncached": "batch | parallel_map(fetch | collate), 2 processes",
    "pf-cache-workers": "batch | parallel_map(fetch | cache | collate): shared files",
    "pf-cache-main": "parallel_map(fetch) | cache | batch | collate: main process",
    "pf-uncached-samples": "parallel_map(fetch) | batch | collate: pf-cache-main uncached",
    "torch-dict": "torch DataLoader, a dict in __getitem__ (one per worker)",
    "torch": "torch DataLoader, uncached",
}


# -- the dataset (what a user writes) -------------------------------------------------------------
def make_images(folder: str, n: int, px: int = SOURCE_PX, seed: int = 0) -> None:
    """Write *n* JPEG files ``000000.jpg``... into *folder*: smooth colour fields with noise
    (a photo's cost to decode, not a flat image's), each one different."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    bases = []
    for _ in range(8):
        small = Image.fromarray(rng.integers(0, 256, (px // 16, px // 16, 3), dtype=np.uint8))
        smooth = np.asarray(small.resize((px, px), Image.Resampling.BICUBIC), dtype=np.int16)
        noisy = smooth + rng.integers(-20, 20, (px, px, 3), dtype=np.int16)
        bases.append(np.clip(noisy, 0, 255).astype(np.uint8))
    for i in range(n):
        pixels = np.roll(bases[i % 8], (7 * i) % px, axis=1)
        pixels[0, 0] = (i % 256, i // 256 % 256, i // 65536 % 256)  # no two alike
        Image.fromarray(pixels).save(os.path.join(folder, f"{i:06d}.jpg"), quality=90)


class Jpegs:
    """``dataset[i]``: decode JPEG file *i* of *folder* and resize it to ``OUT_PX`` square, a
    ``uint8`` HWC array."""

    def __init__(self, folder: str, n: int) -> None:
        self.folder = folder
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> np.ndarray:
        from PIL import Image

        with Image.open(os.path.join(self.folder, f"{i:06d}.jpg")) as img:
            small = img.convert("RGB").resize((OUT_PX, OUT_PX), Image.Resampling.BILINEAR)
            return np.asarray(small)


class DictCached(Jpegs):
    """The same, keeping every sample it decoded in a dict: in each worker process its own."""

    def __init__(self, folder: str, n: int) -> None:
        super().__init__(folder, n)
        self.kept: dict[int, np.ndarray] = {}

    def __getitem__(self, i: int) -> np.ndarray:
        sample = self.kept.get(i)
        if sample is None:
            sample = self.kept[i] = super().__getitem__(i)
        return sample


def sample_cost(folder: str, n: int, count: int = 100) -> float:
    """Milliseconds per ``dataset[i]`` in this process, best of 3 over *count* samples."""
    ds = Jpegs(folder, n)
    keys = range(min(count, n))
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for i in keys:
            ds[i]
        best = min(best, (time.perf_counter() - t0) / len(keys))
    return best * 1e3


def build(variant: str, ds: Any) -> Any:
    """The loader of *variant* over *ds* (see the module's text)."""
    import torch.utils.data as tud

    import pipeflow as pf

    if variant.startswith("torch"):
        return tud.DataLoader(
            ds, batch_size=BATCH_SIZE, shuffle=True, num_workers=WORKERS, persistent_workers=True
        )
    kw: dict[str, Any] = {"workers": WORKERS, "backend": "process", "persistent": True}
    top = pf.indices(ds) | pf.shuffle(seed=0)
    if variant == "pf-uncached":
        return top | pf.batch(BATCH_SIZE) | pf.parallel_map(pf.fetch(ds) | pf.collate(), **kw)
    if variant == "pf-cache-workers":
        work = pf.fetch(ds) | pf.cache() | pf.collate()
        return top | pf.batch(BATCH_SIZE) | pf.parallel_map(work, **kw)
    samples = top | pf.parallel_map(pf.fetch(ds), **kw)
    if variant == "pf-cache-main":
        return samples | pf.cache() | pf.batch(BATCH_SIZE) | pf.collate()
    if variant == "pf-uncached-samples":
        return samples | pf.batch(BATCH_SIZE) | pf.collate()
    msg = f"a variant is one of {', '.join(VARIANTS)} (got {variant!r})"
    raise ValueError(msg)


# -- the subprocess: build, report, run the epochs on command -------------------------------------
def _say(**event: Any) -> None:
    sys.stdout.write(json.dumps(event) + "\n")
    sys.stdout.flush()


def _wait() -> None:
    if sys.stdin.readline().strip() != "go":
        raise SystemExit(1)


def _digest(sample: Any) -> str:
    return hashlib.blake2b(sample.numpy().tobytes(), digest_size=8).hexdigest()


def _tree_cpu(root: int) -> float:
    """CPU seconds (user and system) that process *root* and its live descendants used."""
    total = 0
    for pid in _tree(root):
        with contextlib.suppress(OSError, ValueError), open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


def _child(variant: str, folder: str, n: int, epochs: int, check: bool) -> None:
    import torch

    torch.set_num_threads(1)
    ds = (DictCached if variant == "torch-dict" else Jpegs)(folder, n)
    loader = build(variant, ds)
    _say(event="ready")
    _wait()
    seconds, cpu, sums, seen, digests = [], [], [], [], []
    for _ in range(epochs):
        t0, c0 = time.perf_counter(), _tree_cpu(os.getpid())
        total = count = 0
        order: list[str] = []
        for batch in loader:
            total += int(batch[:, ::8, ::8].sum())  # touch each batch lightly
            count += len(batch)
            if check:
                order.extend(_digest(s) for s in batch)
        seconds.append(time.perf_counter() - t0)
        cpu.append(_tree_cpu(os.getpid()) - c0)
        sums.append(total)
        seen.append(count)
        digests.append(order)
    _say(event="epochs", seconds=seconds, cpu=cpu, sums=sums, seen=seen, digests=digests)
    _wait()  # sampled with the workers alive
    hits = misses = kept = 0
    if hasattr(loader, "stats"):
        for st in loader.stats().stages:
            hits, misses = hits + st.cache_hits, misses + st.cache_misses
            kept += st.cache_bytes
    if hasattr(loader, "close"):
        loader.close()
    _say(event="done", cache_hits=hits, cache_misses=misses, cache_bytes=kept)


# -- measuring a process tree and its cache files from outside ------------------------------------
def _file_bytes(dirs: list[str]) -> int:
    """The memory the files under *dirs* take (tmpfs: their blocks)."""
    total = 0
    for d in dirs:
        for base, _, names in os.walk(d):
            for name in names:
                with contextlib.suppress(OSError):  # renamed or removed meanwhile
                    total += os.stat(os.path.join(base, name)).st_blocks * 512
    return total


def _mapped_pss(pid: int, prefix: str) -> int:
    """The PSS of *pid*'s mappings of files whose path starts with *prefix* (``smaps`` is read
    only when ``maps``, 15 times cheaper, shows one)."""
    try:
        with open(f"/proc/{pid}/maps") as f:
            if prefix not in f.read():
                return 0
        with open(f"/proc/{pid}/smaps") as f:
            text = f.read()
    except OSError:
        return 0
    total, inside = 0, False
    for line in text.splitlines():
        head, _, rest = line.partition(" ")
        if "-" in head and ":" not in head:  # a mapping's header: address range, ..., path
            inside = line.rstrip().split(maxsplit=5)[-1].startswith(prefix)
        elif inside and head == "Pss:":
            total += int(rest.split()[0]) * 1024
    return total


class _Meter:
    """Samples the memory of process *root*'s tree: ``unique`` is its ``Pss_Anon +
    Pss_Shmem``, plus its caches' files in /dev/shm less their mapped part; ``files``: those
    files' bytes (counted every 10th sample and on ``full``: they only grow, and a count
    stats each file); ``procs``: how many processes."""

    def __init__(self, root: int) -> None:
        self.root = root
        self.prefix = os.path.join(SHM, f"pipeflow-cache-{root}-")
        self.calls = self.files = 0

    def __call__(self, full: bool = False) -> dict[str, int]:
        dirs = glob.glob(self.prefix + "*")
        if full or self.calls % 10 == 0:
            self.files = _file_bytes(dirs)
        self.calls += 1
        unique = procs = mapped = 0
        for pid in _tree(self.root):
            r = _rollup(pid)
            if r is None:
                continue
            procs += 1
            unique += r["Pss_Anon"] + r["Pss_Shmem"]
            if dirs:
                mapped += _mapped_pss(pid, self.prefix)
        return {"unique": unique - mapped + self.files, "files": self.files, "procs": procs}


# -- the driver ----------------------------------------------------------------------------------
def measure(
    variant: str, folder: str, n: int, epochs: int, *, check: bool = False, timeout: float = 600.0
) -> dict[str, Any]:
    """Run *variant* over the *n* images in *folder* for *epochs* in a fresh subprocess."""
    if variant not in VARIANTS:
        raise ValueError(f"a variant is one of {', '.join(VARIANTS)} (got {variant!r})")
    with tempfile.TemporaryFile() as errors:  # a pipe could fill up and block the subprocess
        return _measure(variant, folder, n, epochs, check, timeout, errors)


def _measure(
    variant: str, folder: str, n: int, epochs: int, check: bool, timeout: float, errors: Any
) -> dict[str, Any]:
    cmd = [sys.executable, os.path.abspath(__file__), "--child", variant, "--folder", folder]
    cmd += ["--items", str(n), "--epochs", str(epochs), *(["--check"] if check else [])]
    child = Child(cmd, variant, timeout, errors, INTERVAL)
    try:
        child.expect("ready")
        meter = _Meter(child.pid)
        base = meter(full=True)
        peak: dict[str, int] = dict(base)

        def tick(full: bool = False) -> None:
            s = meter(full)
            if s["unique"] > peak["unique"]:
                peak.update(s)

        child.go()
        ran = child.expect("epochs", tick)
        tick(full=True)  # after the last epoch, the workers alive
        child.go()
        done = child.expect("done")
        child.wait()
    finally:
        child.close()
    seconds = ran["seconds"]
    later = sum(seconds[1:])
    return {
        "variant": variant,
        "items": n,
        "epochs": len(seconds),
        "seconds": seconds,
        "epoch1_seconds": seconds[0],
        "cpu": ran["cpu"],
        "epoch1_cpu": ran["cpu"][0],
        "later_rate": n * (len(seconds) - 1) / later if later else float("nan"),
        "sums": ran["sums"],
        "seen": ran["seen"],
        "digests": ran["digests"],
        "added_bytes": peak["unique"] - base["unique"],
        "shm_file_bytes": peak["files"],
        "processes": peak["procs"],
        "cache_hits": done["cache_hits"],
        "cache_misses": done["cache_misses"],
        "cache_bytes": done["cache_bytes"],
    }


def results(
    items: int = ITEMS,
    *,
    epochs: int = EPOCHS,
    reps: int = REPS,
    only: list[str] | None = None,
    check: bool = False,
    px: int = SOURCE_PX,
) -> dict[str, Any]:
    """Write the images, measure each row *reps* times (in turn), and sum the runs up.

    Args:
        items: how many images (samples a pass).
        epochs: passes each run makes (5: the first and 4 cached ones).
        reps: runs of each row; the summaries are medians.
        only: the rows to run (``pf-uncached`` and ``torch-dict`` are always run: the others
            are compared with them).
        check: record a digest of every sample of every epoch, in order (slower).
        px: the JPEG's side, which sets the cost of a sample.

    Returns:
        ``items``, ``epochs``, ``reps``, ``sample_ms`` (one ``dataset[i]`` here, decode and
        resize), ``jpeg_bytes`` (a file's mean size), and ``rows``: one dict per row, with
        ``variant``, ``runs`` (each run's measurements: ``seconds`` per epoch, ``sums``,
        ``seen``, ``digests``, ``added_bytes``, ``cache_bytes``, ...), the medians
        ``epoch1_seconds``, ``later_rate`` (samples/s over epochs 2 on), ``added_bytes``,
        ``cache_bytes``, and ``same_output`` (every epoch's checksum equals ``pf-uncached``'s).
    """
    names = list(VARIANTS) if not only else [v for v in VARIANTS if v in {*only, *_REFERENCES}]
    for name in only or ():
        if name not in VARIANTS:
            raise ValueError(f"a variant is one of {', '.join(VARIANTS)} (got {name!r})")
    with tempfile.TemporaryDirectory(prefix="pipeflow-cache-bench-") as folder:
        make_images(folder, items, px)
        os.sync()  # the files written back now, not in the background of the first rows
        jpeg = statistics.mean(os.path.getsize(p) for p in glob.glob(f"{folder}/*.jpg"))
        cost = sample_cost(folder, items)
        runs: dict[str, list[dict[str, Any]]] = {name: [] for name in names}
        for rep in range(reps):
            for name in names if rep % 2 == 0 else reversed(names):
                runs[name].append(measure(name, folder, items, epochs, check=check))
    for name, twin in TWINS.items():  # the memory of the cache itself
        if name in runs and twin in runs:
            base = statistics.median(r["added_bytes"] for r in runs[twin])
            for r in runs[name]:
                r["own_bytes"] = r["added_bytes"] - base
    rows = [_summary(name, runs[name], runs["pf-uncached"][0]) for name in names]
    return {
        "items": items,
        "epochs": epochs,
        "reps": reps,
        "sample_ms": cost,
        "jpeg_bytes": jpeg,
        "source_px": px,
        "rows": rows,
    }


#: The rows every run has: the others are compared with them.
_REFERENCES = ("pf-uncached", "torch-dict")
#: Each cached row's uncached twin: the same loader, whose added memory is not the cache's.
TWINS = {"pf-cache-workers": "pf-uncached", "pf-cache-main": "pf-uncached-samples"}
TWINS["torch-dict"] = "torch"


def _summary(name: str, runs: list[dict[str, Any]], reference: dict[str, Any]) -> Any:
    """A row's medians over its *runs*, and whether every run's output matched *reference*'s
    (each epoch's checksum and count)."""

    def med(key: str) -> float | None:
        values = [r[key] for r in runs if key in r]
        return statistics.median(values) if values else None

    same = all(r["sums"] == reference["sums"] and r["seen"] == reference["seen"] for r in runs)
    keys = (
        "epoch1_seconds",
        "epoch1_cpu",
        "later_rate",
        "added_bytes",
        "own_bytes",
        "shm_file_bytes",
    )
    return {
        "variant": name,
        "runs": runs,
        **{key: med(key) for key in (*keys, "shm_file_bytes", "cache_bytes")},
        "same_output": same,
    }


# -- the goals and the table ---------------------------------------------------------------------
GOALS = (
    ("epoch 1 time vs pf-uncached", "epoch1_seconds", "pf-uncached", "<=", 1.1),
    ("epochs 2-5 rate vs pf-uncached", "later_rate", "pf-uncached", ">=", 10.0),
    ("epochs 2-5 rate vs torch-dict", "later_rate", "torch-dict", ">=", 2.0),
    ("memory added vs torch-dict", "added_bytes", "torch-dict", "<=", 1 / WORKERS),
    ("  the cache's own (less its twin's)", "own_bytes", "torch-dict", "<=", 1 / WORKERS),
)


def paired(row: dict[str, Any], ref: dict[str, Any], key: str) -> tuple[float, list[float]]:
    """The median over the rounds of ``row / ref`` within a round, and each round's ratio."""
    ratios = [
        a[key] / b[key]
        for a, b in zip(row["runs"], ref["runs"])
        if a.get(key) is not None and b.get(key)
    ]
    return (statistics.median(ratios) if ratios else float("nan")), ratios


def goals(result: dict[str, Any]) -> list[dict[str, Any]]:
    """The goals (``GOALS``) of each cached pipeflow row: its median, the reference's, their
    ratio (see :func:`paired`), the target, whether it was met, and whether some round's
    ratio lies on the other side of the target."""
    by = {r["variant"]: r for r in result["rows"]}
    out = []
    for name in (v for v in CACHED if v in by):
        row = by[name]
        for what, key, against, op, limit in GOALS:
            ref = by[against]
            if row[key] is None or ref[key] is None:
                continue  # a twin that did not run
            ratio, rounds = paired(row, ref, key)
            met = ratio <= limit if op == "<=" else ratio >= limit
            flips = any((x <= limit if op == "<=" else x >= limit) != met for x in rounds)
            out.append(
                {
                    "row": name,
                    "goal": what,
                    "key": key,
                    "against": against,
                    "target": f"{op} {limit:g}x",
                    "ours": row[key],
                    "reference": ref[key],
                    "ratio": ratio,
                    "rounds": rounds,
                    "met": met,
                    "unsure": flips,
                }
            )
    return out


def format_table(result: dict[str, Any]) -> str:
    """The rows as a plain-text table, then the goals (MB = 2**20 bytes; ratios: see
    :func:`paired`)."""
    rows = result["rows"]
    by = {r["variant"]: r for r in rows}
    plain, torch_dict = by["pf-uncached"], by["torch-dict"]
    w = max(len(r["variant"]) for r in rows) + 2
    head = (
        f"{'row':<{w}}{'epoch 1 s':>10}{'x uncached':>11}{'cpu s':>7}{'x unc.':>7}"
        f"{'2-5 /s':>10}{'x uncached':>11}"
        f"{'x dict':>8}{'added MB':>10}{'x dict':>8}{'own MB':>9}{'x dict':>8}"
        f"{'cache MB':>10}{'same':>6}"
    )
    lines = [head, "-" * len(head)]
    for r in rows:

        def x(ref: dict[str, Any], key: str, width: int, r: dict[str, Any] = r) -> str:
            ratio = paired(r, ref, key)[0]
            return f"{'':>{width}}" if r[key] is None or ratio != ratio else f"{ratio:>{width}.2f}x"

        own = "" if r["own_bytes"] is None else f"{r['own_bytes'] / MB:.1f}"
        kept = f"{r['cache_bytes'] / MB:.1f}" if r["variant"].startswith("pf") else ""
        lines.append(
            f"{r['variant']:<{w}}{r['epoch1_seconds']:>10.2f}{x(plain, 'epoch1_seconds', 10)}"
            f"{r['epoch1_cpu']:>7.2f}{x(plain, 'epoch1_cpu', 6)}"
            f"{r['later_rate']:>10,.0f}{x(plain, 'later_rate', 10)}"
            f"{x(torch_dict, 'later_rate', 7)}"
            f"{r['added_bytes'] / MB:>10.1f}{x(torch_dict, 'added_bytes', 7)}"
            f"{own:>9}{x(torch_dict, 'own_bytes', 7)}"
            f"{kept:>10}{'yes' if r['same_output'] else 'NO':>6}"
        )
    lines.append("")
    lines += [f"  {name}: {DESCRIBE[name]}" for name in by]
    lines.append(
        "  cpu s: the CPU time of the process and its workers in epoch 1\n"
        "  added: peak PSS (anon + shmem) of the process tree, plus the cache's files in "
        "/dev/shm,\n    less the same before iter(loader); own: added less the uncached "
        "twin's (torch for torch-dict);\n    cache: stats()' bytes; same: every epoch's "
        "checksum equals pf-uncached's"
    )
    lines.append("")
    lines.append("goals (ratio: median of the rounds' ratios; *: some round on the other side):")
    for g in goals(result):
        verdict = ("met" if g["met"] else "NOT met") + ("*" if g["unsure"] else "")
        lines.append(
            f"  {g['row']:<18} {g['goal']:<36} {g['ratio']:>7.2f}x  {g['target']:<8} {verdict}"
        )
    return "\n".join(lines)


def run(quick: bool) -> list[Row]:
    """The goals as rows of ``python -m pipeflow bench cache``: the cached row in the
    pipeflow column, the reference the row names (``pf-uncached`` or ``torch-dict``) in the
    torch column."""
    result = results(QUICK_ITEMS if quick else ITEMS, reps=QUICK_REPS if quick else REPS)
    by = {r["variant"]: r for r in result["rows"]}
    units = {"epoch1_seconds": "seconds", "later_rate": "samples/s"}
    out = []
    for g in goals(result):
        key, scale = g["key"], 1.0 if g["key"] in units else MB
        place = "workers" if g["row"] == "pf-cache-workers" else "main process"
        title = g["goal"] if g["goal"].startswith(" ") else f"cache in {place}: {g['goal']}"
        out.append(
            Row(
                title,
                units.get(key, "MB"),
                g["ours"] / scale,
                g["reference"] / scale,
                g["target"],
                higher_is_better=key == "later_rate",
                samples={
                    "pipeflow": [r[key] / scale for r in by[g["row"]]["runs"]],
                    "torch": [r[key] / scale for r in by[g["against"]]["runs"]],
                },
            )
        )
    return out


def main(argv: list[str] | None = None) -> int:
    """``python benchmarks/cache.py [--quick] [--items N] [--epochs N] [--reps N] [--only ...]
    [--check] [--json]``."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS} items, 1 round")
    parser.add_argument("--items", type=int, default=None, help=f"samples (default {ITEMS})")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help="passes each run makes")
    parser.add_argument("--reps", type=int, default=None, help=f"rounds (default {REPS})")
    parser.add_argument("--px", type=int, default=SOURCE_PX, help="the JPEG's side in pixels")
    parser.add_argument("--only", nargs="+", metavar="ROW", help=f"rows, of {', '.join(VARIANTS)}")
    parser.add_argument("--check", action="store_true", help="digest every sample, in order")
    parser.add_argument("--json", action="store_true", help="print the results as JSON")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--folder", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.folder, args.items, args.epochs, args.check)
        return 0
    items = args.items or (QUICK_ITEMS if args.quick else ITEMS)
    reps = args.reps or (QUICK_REPS if args.quick else REPS)
    started = time.perf_counter()
    result = results(
        items, epochs=args.epochs, reps=reps, only=args.only, check=args.check, px=args.px
    )
    result["wall_seconds"] = time.perf_counter() - started
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{items} JPEGs of {args.px}x{args.px} px ({result['jpeg_bytes'] / 1e3:.0f} KB) -> "
        f"{OUT_PX}x{OUT_PX}x3 uint8; decode and resize: {result['sample_ms']:.2f} ms a sample "
        f"here; {args.epochs} epochs, batch {BATCH_SIZE}, {WORKERS} workers; medians of "
        f"{reps} run(s) a row; {os.cpu_count()} cores, load {os.getloadavg()[0]:.1f}\n"
    )
    print(format_table(result))
    print(f"\n{result['wall_seconds']:.0f} s in all")
    return 0


if __name__ == "__main__":
    sys.exit(main())
