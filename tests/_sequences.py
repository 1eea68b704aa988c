"""Corpora and pipelines for the sequence-stage tests, importable by worker processes and by
the kill-then-resume scenario (``python -m tests._sequences save|rest STATE ROWS``).

A corpus's token ``1000 * i + j + 1`` is token ``j`` of sequence ``i``: every token says where
it came from, and none is 0, the pad value.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

import pipeflow as pf


class Corpus:
    """Sequences of the given lengths, by index (a dataset; it pickles for process workers)."""

    def __init__(self, lengths: list[int]) -> None:
        self.lengths = list(lengths)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, i: int) -> np.ndarray[Any, Any]:
        return np.arange(self.lengths[i], dtype=np.int64) + 1000 * i + 1


class Fetch:
    """A batch of indices to its sequences."""

    def __init__(self, corpus: Corpus) -> None:
        self.corpus = corpus

    def __call__(self, batch: list[int]) -> list[np.ndarray[Any, Any]]:
        return [self.corpus[i] for i in batch]


def origin(token: int) -> tuple[int, int]:
    """``(sequence, place in it)`` of a corpus token."""
    return (token - 1) // 1000, (token - 1) % 1000


#: The stages under test, by name: each takes a corpus's sequences (or, for ``bucket-index``,
#: its indices).
STAGES: dict[str, Callable[[Corpus], Any]] = {
    "pack-first_fit": lambda c: pf.pack(16, window=3),
    "pack-concat": lambda c: pf.pack(16, window=2, method="concat"),
    "batch-in-order": lambda c: pf.batch(max_tokens=48, length=len),
    "batch-window": lambda c: pf.batch(max_tokens=48, length=len, window=10, seed=5),
    "bucket-window": lambda c: pf.bucket([4, 12], length=len, batch_size=3, window=9, seed=6),
    "bucket-index": lambda c: pf.bucket(3, lengths=c.lengths, max_tokens=48, seed=7),
}


def loader(name: str, corpus: Corpus, workers: int = 0, backend: str = "thread") -> Any:
    """``indices | shuffle | fetch (maybe in workers) | <stage>``; ``bucket-index`` reads the
    indices and fetches after itself."""
    stage = STAGES[name](corpus)
    shuffled = pf.indices(corpus) | pf.shuffle(seed=3)
    if name == "bucket-index":
        fetch: Any = pf.map(Fetch(corpus))
        return shuffled | stage | _maybe_parallel(fetch, workers, backend)
    return shuffled | _maybe_parallel(pf.fetch(corpus, batched=False), workers, backend) | stage


def _maybe_parallel(work: Any, workers: int, backend: str) -> Any:
    return work if not workers else pf.parallel_map(work, workers=workers, backend=backend)


def plain(output: Any) -> Any:
    """An output as plain lists, to compare and to write as JSON."""
    if isinstance(output, dict):
        return {k: v.tolist() for k, v in output.items()}
    return [np.asarray(x).tolist() for x in output]


#: The scenario's corpus: long-tailed lengths, some longer than a 16-token row.
SCENARIO_LENGTHS = [int(n) for n in np.random.default_rng(1).lognormal(2.0, 0.9, size=400)]


def _scenario(what: str, state_path: str, rows_path: str, name: str, k: int) -> None:
    corpus = Corpus(SCENARIO_LENGTHS)
    run = loader(name, corpus, workers=2, backend="process")
    if what == "rest":
        with open(state_path) as f:
            run.load_state_dict(json.load(f))
        with open(rows_path, "w") as f:
            json.dump([plain(x) for x in run], f)
        return
    it = iter(run)
    for _ in range(k):
        next(it)
    with open(state_path + ".tmp", "w") as f:
        json.dump(run.state_dict(), f)
    os.replace(state_path + ".tmp", state_path)
    for _ in it:  # workers running, more on the way: the parent kills us in here
        time.sleep(0.01)
    time.sleep(60)


if __name__ == "__main__":
    _scenario(sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
