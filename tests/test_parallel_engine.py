"""The engine's in-flight and ordering logic (:func:`pipeflow.parallel._run.run_parallel`)
against a fake pool: no threads, no processes, every schedule drawn by hypothesis.

The fake keeps the :class:`~pipeflow.parallel.pools._protocol.Pool` protocol in this thread: it
takes tasks while it has free slots, and each ``collect`` finishes some of the tasks out, in
an order drawn from the test's seed. So the reordering, the backpressure and the delivery
run exactly as they do over workers, one schedule at a time, reproducibly. It checks the
in-flight bound itself, at every task it is given: items sent and not yet taken by the
consumer never exceed the bound.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeflow.engine._context import Context, Hooks
from pipeflow.engine._failure import Failure
from pipeflow.parallel._kept import Kept
from pipeflow.parallel._run import run_parallel
from pipeflow.parallel._settings import Settings
from pipeflow.parallel._settings import settings as parallel_settings
from pipeflow.parallel.transport._wire import Reply


def f(x: int) -> tuple[int, int]:
    """Each item tagged with a value of it: a result paired with another input shows."""
    return x, (x * 2654435761 + 12345) % 1_000_003


class Job:
    """What the pool runs (and the calling thread, with ``workers=0``)."""

    name = "engine"

    def run(self, item: Any, epoch: int, seq: int) -> Any:
        if item < 0:
            raise ValueError(f"bad item {item}")
        return f(item)


class FakePool:
    """A pool whose "workers" are a list of tasks out, finished in an order drawn from
    *seed*. It has *slots* places for tasks (``submit`` says ``False`` when they are full)
    and fails the test when items out, less those the consumer took, pass *bound*."""

    backend = "thread"

    def __init__(self, seed: int, slots: int, plain: bool, taken: list[int]) -> None:
        self.name = "engine"
        self.workers = 2
        self.closed = self.broken = self.trims = False
        self.plain = plain  # True: results delivered as they are; False: through value()
        self.rng = random.Random(seed)
        self.slots = slots
        self.taken = taken  # how many results the consumer has had, counted by the test
        self.running: list[tuple[int, int, Any]] = []  # (pass_id, seq, item)
        self.pass_id = self.sent = 0
        self.bound = 0
        self.peak = 0  # the most items out at once, less those taken

    def start_pass(self, max_in_flight: int) -> None:
        self.pass_id += 1
        self.bound = max_in_flight
        self.sent = 0

    def backlog(self, in_flight: int) -> int:
        return in_flight

    def end_pass(self) -> None:
        pass

    def can_submit(self) -> bool:
        return True

    def submit(self, seq: int, epoch: int, item: Any) -> bool:
        if len(self.running) >= self.slots:
            return False
        self.sent += 1
        self.peak = max(self.peak, self.sent - self.taken[0])
        assert self.sent - self.taken[0] <= self.bound, "in-flight bound exceeded"
        self.running.append((self.pass_id, seq, item))
        return True

    def submit_many(self, items: list[tuple[int, Any]], epoch: int) -> int:
        for sent, (seq, item) in enumerate(items):
            if not self.submit(seq, epoch, item):
                return sent
        return len(items)

    def collect(self, timeout: float | None) -> list[Reply] | None:
        """Finish a drawn number of the tasks out, in a drawn order."""
        if not self.running:
            return []
        self.rng.shuffle(self.running)
        k = self.rng.randint(1, len(self.running))
        done, self.running = self.running[:k], self.running[k:]
        return [self._reply(pass_id, seq, item) for pass_id, seq, item in done]

    def _reply(self, pass_id: int, seq: int, item: Any) -> Reply:
        try:
            value = Job().run(item, 0, seq)
        except ValueError as e:
            return Reply(pass_id, "err", seq, 0, 0, [e])
        return Reply(pass_id, "ok", seq, 0, 1, value)

    def value(self, reply: Reply) -> Any:
        if reply.kind == "err":
            raise reply.payload.pop()
        return reply.payload

    def drop(self, reply: Reply) -> None:
        pass

    def in_flight(self) -> str:
        return f"{len(self.running)} items"

    def close(self) -> None:
        self.closed = True


def config(ordered: bool, max_in_flight: int) -> Settings:
    return parallel_settings(
        "parallel_map",
        workers=2,
        backend="thread",
        ordered=ordered,
        max_in_flight=max_in_flight,
        mp_context=None,
        worker_init=None,
        timeout=None,
        persistent=True,  # the pass borrows the kept pool: the fake
        seed=0,
    )


def run(
    items: list[int], ordered: bool, bound: int, pool: FakePool, taken: list[int]
) -> Iterator[Any]:
    """One pass over *pool*; *taken* counts what the consumer has had."""
    kept = Kept()
    kept.pool = pool
    hooks = Hooks(resources={"pool": kept})
    it = run_parallel(Job(), config(ordered, bound), "engine", items, Context(0), hooks)
    for value in it:
        taken[0] += 1
        yield value


schedules = {
    "items": st.lists(st.integers(0, 10_000), max_size=60),
    "bound": st.integers(1, 8),
    "slots": st.integers(1, 10),
    "seed": st.integers(0, 2**32 - 1),
    "plain": st.booleans(),
}


def fake(seed: int, slots: int, plain: bool) -> tuple[FakePool, list[int]]:
    taken = [0]
    return FakePool(seed, slots, plain, taken), taken


@settings(max_examples=200, deadline=None)
@given(**schedules)
def test_ordered_delivery_is_map(
    items: list[int], bound: int, slots: int, seed: int, plain: bool
) -> None:
    pool, taken = fake(seed, slots, plain)
    assert list(run(items, True, bound, pool, taken)) == list(map(f, items))
    assert pool.peak <= bound


@settings(max_examples=200, deadline=None)
@given(**schedules)
def test_unordered_delivery_is_each_item_once(
    items: list[int], bound: int, slots: int, seed: int, plain: bool
) -> None:
    pool, taken = fake(seed, slots, plain)
    got = list(run(items, False, bound, pool, taken))
    assert Counter(got) == Counter(map(f, items))
    assert pool.peak <= bound


@settings(max_examples=100, deadline=None)
@given(
    items=st.lists(st.integers(0, 10_000), min_size=1, max_size=40),
    bound=st.integers(1, 6),
    seed=st.integers(0, 2**32 - 1),
    ordered=st.booleans(),
)
def test_the_bound_is_reached_and_never_passed(
    items: list[int], bound: int, seed: int, ordered: bool
) -> None:
    """With room for every task, a consumer that takes nothing until the end keeps exactly
    the bound out (the bound is used, not just respected)."""
    pool, taken = fake(seed, slots=100, plain=True)
    it = run(items, ordered, bound, pool, taken)
    first = next(it)
    assert pool.peak == min(bound, len(items))
    rest = list(it)
    assert pool.peak <= bound
    assert len(rest) + 1 == len(items) and (not ordered or first == f(items[0]))


@settings(max_examples=100, deadline=None)
@given(
    items=st.lists(st.integers(-3, 50), max_size=30),
    seed=st.integers(0, 2**32 - 1),
    ordered=st.booleans(),
    plain=st.booleans(),
)
def test_a_failed_item_is_a_failure_at_its_place(
    items: list[int], seed: int, ordered: bool, plain: bool
) -> None:
    """A failed item is its Failure (naming its index), the rest go on; as ``workers=0``."""
    pool, taken = fake(seed, 3, plain)
    got = list(run(items, ordered, 4, pool, taken))
    inline = list(run_parallel(Job(), _inline(ordered), "engine", items, Context(0), Hooks()))

    def key(v: Any) -> Any:
        return ("failed", str(v.error), v.indices) if isinstance(v, Failure) else v

    if ordered:
        assert list(map(key, got)) == list(map(key, inline))
    else:
        assert Counter(map(key, got)) == Counter(map(key, inline))


def _inline(ordered: bool) -> Settings:
    import dataclasses

    return dataclasses.replace(config(ordered, 4), workers=0)


def test_the_fake_pool_catches_a_broken_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bound check has teeth: a pass told a larger backlog than the bound fails it."""
    monkeypatch.setattr(FakePool, "backlog", lambda self, in_flight: in_flight + 1)
    pool, taken = fake(0, slots=100, plain=True)
    with pytest.raises(AssertionError, match="in-flight bound exceeded"):
        list(run(list(range(10)), True, 2, pool, taken))
