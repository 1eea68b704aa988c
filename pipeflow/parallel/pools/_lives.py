"""The lives of a pool's workers (processes, or Ray actors): a worker that dies is replaced
within a budget of restarts per pass, and a sample at the heart of repeated deaths is named as
a poison sample.

A new worker takes a dead one's id (and so its seed and its share under round-robin), but
its shared-memory segments are its own: new file names, and a new key under which the main
process's :class:`~pipeflow.parallel.transport._shm.Reader` maps them, so that a segment of the dead
worker that a result still uses is never handed to the new one. What the dead worker left
(its mappings in the reader, its files in ``/dev/shm``) is cleaned when the next pass starts,
once no reply of the pass it died in can still be decoded.
"""

from __future__ import annotations

from typing import Any

from pipeflow.parallel.pools._protocol import held
from pipeflow.parallel.transport import _segments

__all__ = ["POISON_DEATHS", "Lives"]

#: A sample that was being worked on when this many workers died is a "poison" sample.
POISON_DEATHS = 2


class Lives:
    """Which life each worker of a pool is in, and what a pass may still spend on deaths.

    Examples:
        >>> lives = Lives(2, restarts=1, prefix="pipeflow-1-0-")
        >>> lives.name(1), lives.keys
        ('1', [0, 1])
        >>> lives.may_restart(), lives.may_restart()
        (True, False)
        >>> lives.next_life(1)
        >>> lives.name(1), lives.keys
        ('1r1', [0, 2])
        >>> lives.poison({5: 5, 8: 8}, "pid 11 exited with code 1") is None
        True
        >>> lives.poison({5: 5, 8: 8}, "pid 12 exited with code 1")  # doctest: +ELLIPSIS
        'a worker died at each of 2 tries of sample indices [5] (pid 11 ...; pid 12 ...)...'
    """

    def __init__(self, workers: int, restarts: int, prefix: str, concurrent: bool = False):
        self.restarts = restarts
        self.used = 0  # restarts spent this pass
        self.prefix = prefix  # the pool's segment-name prefix
        self.concurrent = concurrent  # a worker runs many items at once (event loops)
        self.lives = [0] * workers
        self.keys = list(range(workers))  # each worker's key in the Reader
        self._next_key = workers
        self.dead: list[tuple[int, str]] = []  # (key, prefix) of ended lives, to clean
        self.suspects: dict[int, list[str]] = {}  # item number -> the deaths it was at

    def name(self, wid: int) -> str:
        """Worker *wid*'s segment names: ``"1"``, then ``"1r1"``, ``"1r2"`` for new lives."""
        life = self.lives[wid]
        return f"{wid}r{life}" if life else str(wid)

    def may_restart(self) -> bool:
        """Whether this pass may replace one more dead worker (and count it if so)."""
        if self.used >= self.restarts:
            return False
        self.used += 1
        return True

    def next_life(self, wid: int) -> None:
        """Worker *wid* died: what its life left is cleaned at the next pass."""
        self.dead.append((self.keys[wid], f"{self.prefix}{self.name(wid)}-"))
        self.lives[wid] += 1
        self.keys[wid] = self._next_key
        self._next_key += 1

    def poison(self, items: dict[int, Any], death: str) -> str | None:
        """Note a death among *items* (number -> item, in the order sent); the words that
        name a poison sample when one was being worked on at :data:`POISON_DEATHS` deaths.

        A worker works on its items in the order they were sent, so the first is the one it
        was running; an event loop runs all of them at once.
        """
        if not items:
            return None
        seqs = list(items) if self.concurrent else [next(iter(items))]
        for seq in seqs:
            self.suspects.setdefault(seq, []).append(death)
        worst = max(seqs, key=lambda seq: len(self.suspects[seq]))
        deaths = self.suspects[worst]
        if len(deaths) < POISON_DEATHS:
            return None
        return (
            f"a worker died at each of {len(deaths)} tries of {held({worst: items[worst]})} "
            f"({'; '.join(deaths)}): it is taken for a poison sample (one that kills the "
            "worker that reads it); fix it, or leave it out of the dataset"
        )

    def start_pass(self, reader: Any = None) -> None:
        """A new pass: its own budget; the ended lives' mappings and files go (*reader*
        ``None``: the workers have none, as Ray actors, whose results travel in Ray's object
        store)."""
        self.used = 0
        self.suspects.clear()
        if reader is not None:
            for key, prefix in self.dead:
                reader.forget(key)
                _segments.sweep(prefix)
        self.dead.clear()
