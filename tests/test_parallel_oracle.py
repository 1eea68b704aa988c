"""``parallel_map`` against a plain-Python oracle: ``list(map(fn, items))``.

The function tags each item with a value computed from it, ``(item, f(item))``, so a result
that is reordered, repeated, lost or paired with another item's input shows up (a function
such as ``len`` over full batches lets all of those pass). Ordered delivery must equal the
oracle exactly; unordered delivery must be the same multiset. Items sleep 0-3 ms, keyed by
their value, so that workers finish out of order and the reordering code has work to do.

Resumption: a state taken after any *k* outputs, loaded into a fresh loader built the same way
(with another worker count, too), yields exactly the rest of the epoch, then the next epoch.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Any

from hypothesis import example, given, settings
from hypothesis import strategies as st

import pipeflow as pf


def f(x: int) -> int:
    return (x * 2654435761 + 12345) % 1_000_003


def tag(x: int) -> tuple[int, int]:
    """``(x, f(x))``, after sleeping 0-3 ms chosen by *x*."""
    time.sleep((f(x) % 4) / 1000)
    return x, f(x)


def tag_batch(batch: list[int]) -> tuple[tuple[int, int], ...]:
    return tuple(tag(x) for x in batch)


def chunks(items: list[int], size: int | None) -> list[Any]:
    if size is None:
        return list(items)
    return [items[i : i + size] for i in range(0, len(items), size)]


def pipeline(
    source: pf.Loader,
    size: int | None,
    as_stage: bool,
    **kw: Any,
) -> pf.Loader:
    """*source*, batched when *size* is given, then ``parallel_map`` of the tagging function
    (as a plain function, or as a ``pf.map`` stage)."""
    fn: Any = tag if size is None else tag_batch
    if size is not None:
        source = source | pf.batch(size)
    return source | pf.parallel_map(pf.map(fn) if as_stage else fn, seed=0, **kw)


def oracle(items: list[int], size: int | None) -> list[Any]:
    fn: Any = tag_batch if size is not None else tag
    return list(map(fn, chunks(items, size)))


def same(got: list[Any], want: list[Any], ordered: bool) -> bool:
    return got == want if ordered else Counter(got) == Counter(want)


items_lists = st.lists(st.integers(-1000, 1000), max_size=40)
sizes = st.one_of(st.none(), st.integers(1, 9))
in_flight = st.one_of(st.none(), st.integers(1, 6))


# -- results: threads (and workers=0, the inline reference) ------------------------------------------
@given(
    items=items_lists,
    size=sizes,
    workers=st.integers(0, 3),
    ordered=st.booleans(),
    max_in_flight=in_flight,
    as_stage=st.booleans(),
)
@example(items=[], size=None, workers=2, ordered=True, max_in_flight=None, as_stage=False)
@example(items=[5], size=None, workers=3, ordered=False, max_in_flight=1, as_stage=False)
@example(items=[1, 2, 3], size=5, workers=2, ordered=True, max_in_flight=None, as_stage=True)
@example(items=list(range(12)), size=4, workers=3, ordered=False, max_in_flight=2, as_stage=False)
@example(
    items=[7, 7, 7, 1], size=None, workers=2, ordered=False, max_in_flight=None, as_stage=False
)
@settings(max_examples=40)
def test_threads_equal_the_plain_map(
    items: list[int],
    size: int | None,
    workers: int,
    ordered: bool,
    max_in_flight: int | None,
    as_stage: bool,
) -> None:
    loader = pipeline(
        pf.from_iterable(items),
        size,
        as_stage,
        workers=workers,
        backend="thread",
        ordered=ordered,
        max_in_flight=max_in_flight,
    )
    want = oracle(items, size)
    assert same(list(loader), want, ordered)
    assert same(list(loader), want, ordered)  # and the next epoch


# -- results: real process workers, a smaller set ---------------------------------------------------
@given(
    items=st.lists(st.integers(-1000, 1000), max_size=30),
    size=sizes,
    workers=st.integers(1, 3),
    ordered=st.booleans(),
    max_in_flight=in_flight,
    as_stage=st.booleans(),
    method=st.sampled_from(["fork", "forkserver"]),
)
@example(
    items=[], size=None, workers=1, ordered=True, max_in_flight=None, as_stage=False, method="fork"
)
@example(
    items=list(range(10)),
    size=3,
    workers=3,
    ordered=False,
    max_in_flight=1,
    as_stage=True,
    method="fork",
)
@settings(max_examples=10)
def test_processes_equal_the_plain_map(
    items: list[int],
    size: int | None,
    workers: int,
    ordered: bool,
    max_in_flight: int | None,
    as_stage: bool,
    method: str,
) -> None:
    loader = pipeline(
        pf.from_iterable(items),
        size,
        as_stage,
        workers=workers,
        backend="process",
        mp_context=method,
        ordered=ordered,
        max_in_flight=max_in_flight,
    )
    assert same(list(loader), oracle(items, size), ordered)


# -- resumption --------------------------------------------------------------------------------------
def interrupted(make: Any, k: int, make_resumed: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """Take *k* outputs of a fresh loader's first pass, save its state, close it; load the
    state into another fresh loader. Returns the *k* outputs, the resumed rest of the epoch
    and the pass after it."""
    first = make()
    it = iter(first)
    head = [next(it) for _ in range(k)]
    state = json.loads(json.dumps(first.state_dict()))
    it.close()
    first.close()
    second = make_resumed()
    second.load_state_dict(state)
    try:
        return head, list(second), list(second)
    finally:
        second.close()


@given(
    n=st.integers(0, 40),
    size=sizes,
    workers=st.integers(0, 3),
    resume_workers=st.integers(0, 3),
    ordered=st.booleans(),
    max_in_flight=in_flight,
    data=st.data(),
)
@example(n=0, size=None, workers=2, resume_workers=2, ordered=True, max_in_flight=None, data=None)
@example(n=12, size=4, workers=2, resume_workers=1, ordered=True, max_in_flight=None, data=None)
@example(n=12, size=4, workers=3, resume_workers=2, ordered=False, max_in_flight=2, data=None)
@settings(max_examples=40)
def test_a_state_after_k_items_resumes_to_exactly_the_rest(
    n: int,
    size: int | None,
    workers: int,
    resume_workers: int,
    ordered: bool,
    max_in_flight: int | None,
    data: Any,
) -> None:
    def make(w: int) -> pf.Loader:
        return pipeline(
            pf.indices(n),
            size,
            False,
            workers=w,
            backend="thread",
            ordered=ordered,
            max_in_flight=max_in_flight if w else None,
        )

    want = oracle(list(range(n)), size)
    # the explicit examples take the whole epoch: a state saved on the last step
    k = len(want) if data is None else data.draw(st.integers(0, len(want)), label="k")
    head, rest, after = interrupted(lambda: make(workers), k, lambda: make(resume_workers))
    assert len(head) + len(rest) == len(want)
    assert same(head + rest, want, ordered)
    assert same(after, want, ordered)  # then a whole next epoch


@given(
    n=st.integers(0, 30),
    size=sizes,
    workers=st.integers(1, 3),
    resume_workers=st.integers(0, 3),
    ordered=st.booleans(),
    data=st.data(),
)
@settings(max_examples=12)
def test_a_state_after_k_items_resumes_to_exactly_the_rest_on_processes(
    n: int, size: int | None, workers: int, resume_workers: int, ordered: bool, data: Any
) -> None:
    def make(w: int) -> pf.Loader:
        return pipeline(pf.indices(n), size, False, workers=w, backend="process", ordered=ordered)

    want = oracle(list(range(n)), size)
    k = data.draw(st.integers(0, len(want)), label="k")
    head, rest, after = interrupted(lambda: make(workers), k, lambda: make(resume_workers))
    assert same(head + rest, want, ordered) and len(head) + len(rest) == len(want)
    assert same(after, want, ordered)
