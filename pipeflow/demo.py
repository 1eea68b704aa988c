"""The main job: train a small CNN on images through a pipeflow pipeline, and show its stats.

``python -m pipeflow demo`` generates (once, in a few seconds, deterministically) a few
thousand small JPEG images of four shapes into a cache directory, or reads your own folder of
class sub-directories (``--data-dir``). Then it runs a real pipeline — list files, shuffle,
batch, decode and augment in parallel workers, collate — trains a small CNN on the CPU for
three epochs with a progress bar, prints the accuracy on held-out images after each epoch,
and ends with the loader's statistics table and its bottleneck.
"""

from __future__ import annotations

import os
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

import pipeflow as pf

SHAPES = ("circle", "square", "triangle", "cross")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".webp")


def default_cache() -> Path:
    """``$XDG_CACHE_HOME/pipeflow`` (``~/.cache/pipeflow`` by default)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(Path.home(), ".cache")
    return Path(base) / "pipeflow"


def make_shapes(root: Path, count: int, *, size: int = 32, seed: int = 0) -> Path:
    """Write *count* JPEG images of coloured shapes on noise, one sub-directory per shape.

    Deterministic for a given (count, size, seed); done once, then reused (a marker file
    records a finished set).
    """
    from PIL import Image, ImageDraw

    folder = root / f"shapes-{count}-{size}px-seed{seed}"
    if (folder / ".complete").exists():
        return folder
    rng = np.random.default_rng(seed)
    for name in SHAPES:
        (folder / name).mkdir(parents=True, exist_ok=True)
    for i in range(count):
        label = i % len(SHAPES)
        background = rng.integers(0, 90, size=(size, size, 3), dtype=np.uint8)
        img = Image.fromarray(background)
        draw = ImageDraw.Draw(img)
        color = tuple(int(c) for c in rng.integers(120, 256, size=3))
        r = int(rng.integers(size // 5, size // 3))
        cx, cy = (int(v) for v in rng.integers(r, size - r, size=2))
        box = (cx - r, cy - r, cx + r, cy + r)
        if label == 0:
            draw.ellipse(box, fill=color)
        elif label == 1:
            draw.rectangle(box, fill=color)
        elif label == 2:
            draw.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=color)
        else:
            w = max(r // 3, 1)
            draw.rectangle((cx - r, cy - w, cx + r, cy + w), fill=color)
            draw.rectangle((cx - w, cy - r, cx + w, cy + r), fill=color)
        img.save(folder / SHAPES[label] / f"{i:05d}.jpg", quality=90)
    (folder / ".complete").write_text(f"{count} images\n")
    return folder


def list_images(folder: Path) -> tuple[list[tuple[str, int]], list[str]]:
    """``(path, label)`` for every image under *folder*'s class sub-directories, sorted."""
    classes = sorted(d.name for d in folder.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        msg = f"demo: {folder} has no class sub-directories (expected <folder>/<class>/<image>)"
        raise ValueError(msg)
    records = [
        (str(path), label)
        for label, name in enumerate(classes)
        for path in sorted((folder / name).iterdir())
        if path.suffix.lower() in IMAGE_EXTENSIONS
    ]
    return records, classes


@dataclass(frozen=True)
class Decode:
    """``dataset[i]``: read and decode image *i*, resized to a square float32 CHW array."""

    records: list[tuple[str, int]]
    size: int

    def __len__(self) -> int:
        return len(self.records)

    def __repr__(self) -> str:
        return f"Decode({len(self.records)} images, {self.size}px)"

    def __getitem__(self, i: int) -> tuple[np.ndarray[Any, Any], int]:
        from PIL import Image

        path, label = self.records[i]
        with Image.open(path) as img:
            rgb = img.convert("RGB")
            if rgb.size != (self.size, self.size):
                rgb = rgb.resize((self.size, self.size))
            pixels = np.asarray(rgb, dtype=np.float32)
        return (pixels / 255.0 - 0.5).transpose(2, 0, 1).copy(), label


def augment(batch: list[tuple[np.ndarray[Any, Any], int]], rng: np.random.Generator) -> Any:
    """Random flips and brightness, from the batch's own generator (see ``random_map``)."""
    out = []
    for image, label in batch:
        if rng.random() < 0.5:
            image = image[:, :, ::-1]
        if rng.random() < 0.5:
            image = image[:, ::-1, :]
        out.append((np.ascontiguousarray(image * rng.uniform(0.8, 1.2)), label))
    return out


def build_model(classes: int) -> Any:
    """A small CNN for 32x32 images, with batch normalisation after each convolution.

    Measured on the generated shapes (held-out accuracy after each epoch, seed 0): without
    batch norm and with a constant rate, 42, 51, 60, 63, 86, 97 %; with batch norm and a
    one-cycle rate (see ``run_demo``), 100 % after three epochs for seeds 0 to 3.
    """
    import torch.nn as nn

    return nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1),
        nn.BatchNorm2d(16),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(16, 32, 3, padding=1),
        nn.BatchNorm2d(32),
        nn.ReLU(),
        nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1),
        nn.BatchNorm2d(64),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(64, classes),
    )


def _cores() -> int:
    """The CPU cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # macOS, Windows
        return os.cpu_count() or 1


def run_demo(
    *,
    data_dir: str | None,
    images: int,
    epochs: int,
    workers: int,
    backend: str,
    batch_size: int,
    seed: int,
    image_size: int,
    cache: str | None,
    progress: bool,
) -> int:
    """Generate or read the images, train, and print accuracy and the loader's stats."""
    start = time.perf_counter()
    import torch

    torch.manual_seed(seed)
    # The workers decode on their own cores; the training step gets the rest. Two intra-op
    # threads beside two workers on a shared two-core machine made training five times slower
    # (three epochs: 40 s against 7 s with one thread), not faster.
    threads = max(1, _cores() - workers)
    torch.set_num_threads(threads)
    if data_dir is None:
        t0 = time.perf_counter()
        folder = make_shapes(Path(cache) if cache else default_cache(), images, seed=seed)
        print(
            f"dataset: {images} generated images of {', '.join(SHAPES)} in {folder} "
            f"({time.perf_counter() - t0:.1f} s)"
        )
    else:
        folder = Path(data_dir)
        print(f"dataset: {folder}")
    records, classes = list_images(folder)
    order = np.random.default_rng(seed).permutation(len(records))
    held_out = max(len(records) // 5, 1)
    train = Decode([records[i] for i in order[held_out:]], image_size)
    test = Decode([records[i] for i in order[:held_out]], image_size)
    print(
        f"{len(train)} training and {len(test)} held-out images, {len(classes)} classes: "
        f"{', '.join(classes)}"
    )

    work = pf.fetch(train) | pf.random_map(augment, seed=seed) | pf.collate()
    loader = (
        pf.indices(train)
        | pf.shuffle(seed=seed)
        | pf.batch(batch_size)
        | pf.parallel_map(work, workers=workers, backend=backend, persistent=True, seed=seed)
        | pf.progress(unit="batch", force=progress)
    )
    evaluate = (
        pf.indices(test)
        | pf.batch(256)
        | pf.parallel_map(
            pf.fetch(test) | pf.collate(), workers=workers, backend=backend, seed=seed
        )
    )
    print(f"pipeline, one stage per line:\n{textwrap.indent(repr(loader), '  ')}")
    decoding = (
        f"{workers} {backend} worker{'s' if workers > 1 else ''}"
        if workers
        else "the training loop"
    )
    print(f"training on {threads} CPU thread{'s' if threads > 1 else ''}; decoding in {decoding}")
    model = build_model(len(classes))
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    # One cycle: the rate warms up, then anneals to nearly zero by the last step, so the last
    # epoch's model is a settled one (with batch norm and a constant rate, held-out accuracy
    # went 28, 84, 97, 100, 100, then 90 %).
    schedule = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=0.01, total_steps=max(epochs * len(loader), 1)
    )
    loss_fn = torch.nn.CrossEntropyLoss()
    with loader:
        for epoch in range(epochs):
            loader.set_epoch(epoch)
            model.train()
            total, seen = 0.0, 0
            for x, y in loader:
                optimizer.zero_grad()
                loss = loss_fn(model(x), y)
                loss.backward()
                optimizer.step()
                schedule.step()
                total += loss.item() * len(y)
                seen += len(y)
            model.eval()
            correct = n = 0
            with torch.no_grad():
                for x, y in evaluate:
                    correct += int((model(x).argmax(1) == y).sum())
                    n += len(y)
            print(
                f"epoch {epoch}: train loss {total / max(seen, 1):.3f}, "
                f"held-out accuracy {correct / max(n, 1):.1%}"
            )
        print()
        print(loader.stats())
    print(f"\ndone in {time.perf_counter() - start:.1f} s")
    return 0
