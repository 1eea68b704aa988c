"""_chain.py on its own: the watcher's counts and sampled times, and the consumer's iterator."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pipeflow as pf
from pipeflow import _chain


def slow_every(n_items: int, every: int, pause: float) -> Iterator[int]:
    for i in range(n_items):
        if i % every == 0:
            time.sleep(pause)
        yield i


def test_fast_items_are_counted_exactly_and_timed_on_a_sample() -> None:
    loader = pf.indices(200_000) | pf.map(abs)
    assert sum(1 for _ in loader) == 200_000
    stats = loader.stats()
    assert [s.items for s in stats.stages] == [200_000, 200_000]
    # every stage's own time is a positive estimate, and they add up to the consumer's span
    assert all(s.own_seconds > 0 for s in stats.stages)


def test_slow_items_are_all_timed() -> None:
    loader = pf.from_iterable(range(30)) | pf.map(lambda i: time.sleep(0.002) or i)
    list(loader)
    mapped = loader.stats().stages[1]
    assert mapped.items == 30
    assert mapped.own_seconds >= 30 * 0.002  # nothing estimated: every item was timed


def test_a_sampled_estimate_sees_a_periodic_cost() -> None:
    """A cost every 64 items is neither always hit nor always missed by the sampling gaps."""
    src = pf.from_iterable(_Periodic(5_000, 64, 0.0005))
    list(src)
    own = src.stats().stages[0].own_seconds
    expected = 5_000 / 64 * 0.0005
    assert 0.3 * expected < own < 3 * expected


class _Periodic:
    def __init__(self, n: int, every: int, pause: float) -> None:
        self.args = (n, every, pause)

    def __iter__(self) -> Iterator[int]:
        return slow_every(*self.args)


def test_the_consumers_iterator_raises_a_failure_and_goes_on() -> None:
    it = iter(pf.indices(4) | pf.map(lambda i: 1 // (i - 1)))
    assert isinstance(it, _chain._Pass)
    assert next(it) == -1
    try:
        next(it)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the failed item did not raise")
    assert list(it) == [1, 0]
