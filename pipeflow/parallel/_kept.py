"""The pool a parallel stage keeps between a loader's passes (``persistent=True``)."""

from __future__ import annotations

import weakref
from collections.abc import Callable, Mapping
from typing import Any

from pipeflow.parallel._settings import Settings

__all__ = ["Kept"]


class Kept:
    """A persistent pool, kept by the loader between its passes; and which pool each pass
    runs on."""

    __slots__ = ("busy", "facts", "passes", "pool")

    def __init__(self) -> None:
        self.pool: Any = None
        self.busy = False
        self.facts: Any = None
        # The pool each running pass borrowed, by the pass's epoch (kept or not): what
        # pf.DataLoader's iterator shows as its `_workers`.
        self.passes: weakref.WeakValueDictionary[int, Any] = weakref.WeakValueDictionary()

    def borrow(
        self, config: Settings, make: Callable[[], Any], facts: Any = None
    ) -> tuple[Any, bool]:
        """The pool for one pass, and whether it is the kept one (else close it after).

        A second pass running while the first is (``zip(loader, loader)``) gets its own; so
        does a pass told other *facts* (which the workers' job holds) than the kept pool's.
        """
        if not config.persistent or self.busy:
            return make(), False
        if self.pool is not None and (self.pool.closed or self.pool.broken or self.facts != facts):
            self.close()
        self.facts = facts
        if self.pool is None:
            self.pool = make()
        self.busy = True
        return self.pool, True

    def give_back(self, pool: Any, borrowed: bool) -> None:
        if not borrowed:
            pool.close()
            return
        self.busy = False
        if pool.broken:
            self.close()

    def close(self) -> None:
        pool, self.pool = self.pool, None
        if pool is not None:
            pool.close()


def pass_pool(resources: Mapping[Any, Mapping[Any, Any]], epoch: int) -> Any:
    """The pool the loader's pass of *epoch* runs on (its first parallel stage's), or
    ``None`` (no parallel stage, or the pass has not started it yet, or it is gone)."""
    for key in sorted(resources):
        kept = resources[key].get("pool")
        if isinstance(kept, Kept):
            pool = kept.passes.get(epoch)
            if pool is not None:
                return pool
    return None
