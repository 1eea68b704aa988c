"""A state taken in one process, that process killed, resumed by a new loader in another.

The property: for any dataset kind (map-style drawing from torch's global generator or from a
generator of its own; iterable, with a state of its own or none), batch size, worker count
(0, 1, 2), persistent or not, shuffled or not, in order or not, and any step, the items
after the step in the new process are exactly the rest of the uninterrupted epoch and the
next epoch — items, order, and the draws made from the workers' and the dataset's own
generators (out of order, the same items). The uninterrupted run is made in a process of its
own too.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests._resume_cases import Case, interrupted, uninterrupted

pytestmark = pytest.mark.slow


@st.composite
def cases(draw: Any) -> Case:
    kind = draw(st.sampled_from(["squares", "own_rng", "stream", "plain_stream"]))
    workers = draw(st.sampled_from([0, 1, 2]))
    return Case(
        kind=kind,
        n=draw(st.integers(1, 23)),  # torch refuses a RandomSampler over nothing
        batch_size=draw(st.sampled_from([None, 1, 3, 4])),
        workers=workers,
        persistent=draw(st.booleans()),
        shuffle=draw(st.booleans()),
        in_order=draw(st.booleans()) if workers else True,
    )


def _sorted(epoch: list[Any]) -> list[Any]:
    return sorted(map(repr, epoch))


def _view(case: Case, epoch: list[Any]) -> list[Any]:
    """What must match: everything, but the draws where no run could make them the same —
    the main process's global generator (0 workers: it is the training loop's too, the
    user's to save), and a map's workers out of order (which worker draws for which sample
    depends on timing)."""
    if case.kind not in ("squares", "own_rng"):
        return epoch
    exact = case.workers > 0 and case.in_order if case.kind == "squares" else case.in_order
    if exact:
        return epoch

    def index(x: Any) -> Any:
        return x[0] if isinstance(x, list) and len(x) == 2 and isinstance(x[0], int) else x

    return [[index(x) for x in b] if case.batch_size else index(b) for b in epoch]


@settings(max_examples=12)
@given(case=cases(), data=st.data())
def test_a_killed_run_resumes_exactly_in_a_new_process(case: Case, data: Any) -> None:
    whole = [_view(case, e) for e in uninterrupted(case, epochs=1)]
    k = data.draw(st.integers(0, len(whole[0])), label="k")
    got, rest = interrupted(case, k, epochs=1)
    got, rest = _view(case, got), [_view(case, e) for e in rest]
    if case.in_order:
        assert got + rest[0] == whole[0]
        assert rest[1] == whole[1]
    else:  # out of order: the same items, each once
        assert _sorted(got + rest[0]) == _sorted(whole[0])
        assert _sorted(rest[1]) == _sorted(whole[1])


@pytest.mark.parametrize("kind", ["squares", "stream"])
@pytest.mark.parametrize("k", [0, 3, 7])
def test_persistent_workers_resume_the_draws_of_later_epochs_too(kind: str, k: int) -> None:
    case = Case(kind, 17, 2, workers=2, persistent=True, shuffle=True, in_order=True)
    whole = uninterrupted(case, epochs=2)
    got, rest = interrupted(case, k, epochs=2)
    assert got + rest[0] == whole[0]
    assert rest[1:] == whole[1:]


def test_a_state_taken_between_epochs_resumes_the_next_one() -> None:
    case = Case("stream", 10, 3, workers=2, persistent=True, shuffle=False, in_order=True)
    whole = uninterrupted(case, epochs=2)
    got, rest = interrupted(case, len(whole[0]), epochs=2)
    assert got == whole[0] and rest[0] == [] and rest[1:] == whole[1:]


@pytest.mark.parametrize("kind", ["plain_stream", "stream"])
def test_a_worker_that_had_run_out_starts_the_next_epoch_afresh(kind: str) -> None:
    # Out of order, worker 0 ran out first: the resumed pass gives it no task, so what it
    # restores is for its next pass, which starts at the beginning of its replica (it once
    # skipped its old count there, and the next epoch lost worker 0's batches).
    case = Case(kind, 7, 3, workers=2, persistent=True, shuffle=False, in_order=False)
    whole = uninterrupted(case, epochs=1)
    got, rest = interrupted(case, len(whole[0]), epochs=1)
    assert _sorted(got) == _sorted(whole[0]) and rest[0] == []
    assert _sorted(rest[1]) == _sorted(whole[1])
