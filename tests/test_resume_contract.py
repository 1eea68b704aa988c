"""The resume contract: a state either resumes exactly, or is refused, or resumes at another
valid place; never wrong data, never an error at ``next()``, never a hang.

1. Honest states always load and resume exactly. For each pipeline of
   :mod:`tests._contract_cases`, a state taken after every step ``k`` of an epoch (``0`` to its
   length, and once the pass has ended), given to a freshly built loader, yields exactly the
   rest of the reference epoch, then the next epoch as the reference does.
2. Tampered states never give wrong data and never hang. A state taken mid-epoch is mutated,
   one place at a time, everywhere in the records pipeflow keeps (``state["stages"]``,
   ``state["source"]``, and the top-level ``"position"`` and ``"epoch"``; the user's own
   objects' states are only removed or blanked, never changed inside; the pipeline's identity,
   seeds and any other top-level key are tests/test_state_fuzz.py's): a value out of range or of the wrong type, a key removed, an
   unknown key added, a record swapped with the record at the same place of the same
   pipeline's state over other data. A fresh loader given it must either refuse it at
   ``load_state_dict`` with a ``ValueError``, or load it and yield, within a time limit, an
   exact suffix of an epoch's reference (it resumed at another valid place).

Pipelines whose output order is not deterministic (an unordered ``parallel_map``) are compared
as multisets: the rest must be what the epoch has and the consumer had not taken (exactly), or
some part of the epoch, each item at most as often as the epoch has it (another place).

``CONTRACT_TIMEOUT`` (seconds, default 10) bounds every pass (2 s after a first hang in a
sweep). ``CONTRACT_ONLY`` keeps only the mutations whose text holds it (as the failures'
"rerun" lines show).
"""

from __future__ import annotations

import copy
import functools
import json
import os
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._contract_cases import PIPELINES, Pipeline, bounded, items

TIMEOUT = float(os.environ.get("CONTRACT_TIMEOUT", "10"))
AFTER_A_HANG = 2.0

#: Keys whose values are the user's objects' states (a dataset's, an iterator's) or their
#: generators': the contract removes them or blanks them, never reaches inside.
USERS = frozenset({"object", "iterator", "dataset", "rng"})

Path = tuple[Any, ...]
_MISSING = object()
#: What a record (a dict) is replaced with to be of the wrong type.
_BLANKS: list[Any] = ["x", None, []]


# -- references ----------------------------------------------------------------------------------
@functools.cache
def reference(name: str, seed: int, size: int, epoch: int) -> list[Any] | None:
    """Epoch *epoch* of a pipeline, from a fresh loader (``None`` if it cannot run that
    epoch: no state naming it may then load).

    Args:
        name: The pipeline.
        seed: Its seed.
        size: Its size.
        epoch: The epoch.

    Returns:
        The epoch's items made plain.
    """
    loader = PIPELINES[name].build(seed, size, 0)
    try:
        loader.set_epoch(epoch)
        got = bounded(lambda: items(loader), TIMEOUT)
    except ValueError:
        return None
    finally:
        loader.close()
    if got.error is not None or got.hung:
        return None
    value: list[Any] = got.value
    return value


def epochs(name: str, seed: int, size: int, count: int) -> list[list[Any]]:
    """The first *count* epochs of a pipeline, passes of one fresh loader."""
    loader = PIPELINES[name].build(seed, size, 0)
    try:
        out = [bounded(lambda: items(loader), TIMEOUT) for _ in range(count)]
    finally:
        loader.close()
    for got in out:
        assert not got.hung and got.error is None, (name, got)
    return [got.value for got in out]


def canonical(x: Any) -> str:
    """A plain item as text, to count items in multisets."""
    return json.dumps(x, sort_keys=True)


def counted(xs: list[Any]) -> Counter[str]:
    """Plain items as a multiset."""
    return Counter(canonical(x) for x in xs)


# -- taking states -------------------------------------------------------------------------------
@dataclass
class Taken:
    """A state and what the consumer had taken when it was saved.

    Attributes:
        state: The state, through JSON (as a checkpoint stores it).
        head: The items taken before it, made plain.
        ended: Whether the pass had ended (``StopIteration`` seen).
    """

    state: dict[str, Any]
    head: list[Any]
    ended: bool = False


class StateRefused(Exception):
    """``state_dict()`` refused (or hung) where the contract says it gives a state."""


def take(
    pipeline: Pipeline, seed: int, size: int, k: int, ended: bool = False, variant: int = 0
) -> Taken:
    """Run a fresh loader *k* steps (and to its end if *ended*) and take its state.

    Args:
        pipeline: The pipeline.
        seed: Its seed.
        size: Its size.
        k: How many items to take first.
        ended: Whether to run the pass to its end before taking the state.
        variant: Which data the pipeline reads.

    Returns:
        The state and the items taken.

    Raises:
        StateRefused: if the steps or ``state_dict()`` raised or hung.
    """
    loader = pipeline.build(seed, size, variant)

    def run() -> Taken:
        it = iter(loader)
        head = [items([next(it)])[0] for _ in range(k)]
        if ended:
            head += items(it)
        return Taken(json.loads(json.dumps(loader.state_dict())), head, ended)

    try:
        got = bounded(run, TIMEOUT)
    finally:
        loader.close()
    if got.hung:
        raise StateRefused(f"{k} steps and state_dict() hung")
    if got.error is not None:
        raise StateRefused(f"state_dict() raised {type(got.error).__name__}: {got.error}")
    taken: Taken = got.value
    return taken


# -- the honest contract -------------------------------------------------------------------------
def honest_failure(
    pipeline: Pipeline, seed: int, size: int, k: int, ended: bool = False
) -> str | None:
    """Whether a state taken after *k* steps (or at the pass's end) resumes exactly.

    Args:
        pipeline: The pipeline.
        seed: Its seed.
        size: Its size.
        k: The steps taken before the state.
        ended: Whether the state was taken after the pass ended.

    Returns:
        ``None`` if it does, else what went wrong.
    """
    name = pipeline.name
    where = f"{name} seed={seed} size={size}, state after {'the pass ended' if ended else k}"
    want = epochs(name, seed, size, 3)
    try:
        taken = take(pipeline, seed, size, k, ended)
    except StateRefused as e:
        return f"{where}: {e}"
    loader = pipeline.build(seed, size, 0)
    try:
        try:
            loader.load_state_dict(taken.state)
        except Exception as e:
            return f"{where}: refused at load: {type(e).__name__}: {e}"
        rest = bounded(lambda: [items(loader), items(loader)], TIMEOUT)
    finally:
        loader.close()
    if rest.hung:
        return f"{where}: hung (no end of the two passes within {TIMEOUT:g} s)"
    if rest.error is not None:
        return f"{where}: error at next(): {type(rest.error).__name__}: {rest.error}"
    got, following = rest.value
    first = 1 if ended else 0
    if pipeline.ordered:
        if taken.head != want[0][: len(taken.head)]:
            return f"{where}: the first {k} items differ from the reference"
        if got != want[first][0 if ended else k :]:
            return f"{where}: the rest of the pass: {_diff(want[first], got, first)}"
        if following != want[first + 1]:
            return f"{where}: the next pass: {_diff(want[first + 1], following, first + 1)}"
        return None
    if counted(got) != counted(want[first]) - (Counter() if ended else counted(taken.head)):
        return f"{where}: the rest of the pass is not what the consumer had not taken"
    if counted(following) != counted(want[first + 1]):
        return f"{where}: the next pass is not the next epoch"
    return None


FAST = sorted(name for name, p in PIPELINES.items() if not p.slow)
SLOW = sorted(name for name, p in PIPELINES.items() if p.slow)


def steps(pipeline: Pipeline, seed: int, size: int) -> list[tuple[int, bool]]:
    """Every step of an epoch (``0`` to its length), then the pass's end."""
    n = len(epochs(pipeline.name, seed, size, 1)[0])
    return [*((k, False) for k in range(n + 1)), (n, True)]


def sweep(name: str, every: int = 1) -> list[str]:
    """The honest contract after every *every*-th step of a pipeline's epoch (and its end)."""
    pipeline = PIPELINES[name]
    seed, size = 5, pipeline.sizes[0]
    chosen = steps(pipeline, seed, size)
    chosen = sorted(set(chosen[::every] + chosen[-2:]))
    found = (honest_failure(pipeline, seed, size, k, ended) for k, ended in chosen)
    return [f for f in found if f is not None]


def _listed(failures: list[str], node: str) -> str:
    return f"{len(failures)} failures; rerun: .venv/bin/pytest '{node}'\n" + "\n".join(failures)


@pytest.mark.parametrize("name", FAST)
def test_an_honest_state_resumes_exactly_after_every_step(name: str) -> None:
    failures = sweep(name)
    rerun = f"tests/test_resume_contract.py::test_an_honest_state_resumes_exactly_after_every_step[{name}]"
    assert not failures, _listed(failures, rerun)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_an_honest_state_of_a_process_pipeline_resumes_exactly(name: str) -> None:
    failures = sweep(name, every=3)
    rerun = f"tests/test_resume_contract.py::test_an_honest_state_of_a_process_pipeline_resumes_exactly[{name}]"
    assert not failures, _listed(failures, rerun)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(FAST),
    seed=st.integers(0, 2**32),
    which=st.integers(0, 2),
    data=st.data(),
)
def test_an_honest_state_resumes_exactly_for_any_seed_size_and_step(
    name: str, seed: int, which: int, data: st.DataObject
) -> None:
    pipeline = PIPELINES[name]
    size = pipeline.sizes[which % len(pipeline.sizes)]
    n = len(epochs(name, seed, size, 1)[0])
    k = data.draw(st.integers(0, n + 1), label="k")  # n + 1: after the pass ended
    failure = honest_failure(pipeline, seed, size, min(k, n), ended=k > n)
    assert failure is None, failure


# -- tampering -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Mutation:
    """One change to a state.

    Attributes:
        path: Where, as keys from the state's top.
        kind: ``"set"`` (to *value*), ``"delete"`` (the key), ``"add"`` (an unknown key to the
            dict there), ``"swap"`` (the other pipeline's record there, *value*).
        value: The value set or swapped in.
    """

    path: Path
    kind: str
    value: Any = None

    def __str__(self) -> str:
        where = "/".join(map(str, self.path))
        if self.kind == "delete":
            return f"{where}: removed"
        if self.kind == "add":
            return f"{where}: unknown key 'bogus' added"
        shown = json.dumps(self.value)
        shown = shown if len(shown) <= 60 else shown[:57] + "..."
        return f"{where}: {'swapped for' if self.kind == 'swap' else '='} {shown}"

    def applied(self, state: dict[str, Any]) -> dict[str, Any]:
        """A copy of *state* with this change made."""
        out = copy.deepcopy(state)
        target: Any = out
        for key in self.path[:-1]:
            target = target[key]
        last = self.path[-1]
        if self.kind == "delete":
            del target[last]
        elif self.kind == "add":
            target[last]["bogus"] = 0
        else:
            target[last] = copy.deepcopy(self.value)
        return out


def _wrong(value: Any) -> list[Any]:
    """Values out of range or of the wrong type for a leaf holding *value*."""
    if isinstance(value, bool):
        out: list[Any] = [not value, 1]
    elif isinstance(value, int):
        out = [value + 1, value - 1, -1, 2**63]
    elif isinstance(value, float):
        out = [value + 1, -1.0]
    elif isinstance(value, str):
        out = ["", "0" + value]
    elif isinstance(value, list):
        out = [[*value, value[-1] if value else 0], value[:-1] if value else [0]]
    else:
        out = [0]
    out += ["x", None, 2.5, [value] if not isinstance(value, list) else {}]
    kept: list[Any] = []
    for v in out:  # each once, and a change (True == 1 and 2.5 != "x" both count)
        if all(json.dumps(v) != json.dumps(w) for w in [value, *kept]):
            kept.append(v)
    return kept


def _walk(value: Any, path: Path) -> Iterator[tuple[Path, Any]]:
    """Every place under *path* (itself included) that is pipeflow's, not the user's."""
    yield path, value
    if path and path[-1] in USERS:
        return
    if isinstance(value, dict):
        for key, v in value.items():
            yield from _walk(v, (*path, key))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _walk(v, (*path, i))


def _at(state: Any, path: Path) -> Any:
    for key in path:
        try:
            state = state[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return state


def mutations(state: dict[str, Any], other: dict[str, Any] | None) -> list[Mutation]:
    """Every single change the contract makes to *state*.

    Args:
        state: A state taken mid-epoch.
        other: The same pipeline's state over other data, whose records are swapped in.

    Returns:
        The mutations, in a stable order.
    """
    out: list[Mutation] = []
    for key in ("position", "epoch"):
        out += [Mutation((key,), "set", v) for v in _wrong(state[key])]
    for top in ("stages", "source"):
        if top not in state:
            continue
        for path, value in _walk(state[top], (top,)):
            if path[-1] in USERS:  # the user's: only whether it is there is ours
                out += [Mutation(path, "delete"), Mutation(path, "set", None)]
                continue
            if len(path) > 1 and isinstance(_at(state, path[:-1]), dict):
                out.append(Mutation(path, "delete"))
            if isinstance(value, dict):
                out.append(Mutation(path, "add"))
                out += [Mutation(path, "set", v) for v in _BLANKS]
                theirs = _at(other, path) if other is not None else _MISSING
                if theirs is not _MISSING and theirs != value:
                    out.append(Mutation(path, "swap", theirs))
            else:
                out += [Mutation(path, "set", v) for v in _wrong(value)]
    unique: dict[str, Mutation] = {}
    before = json.dumps(state, sort_keys=True)
    for m in out:  # each once, and each a change
        if json.dumps(m.applied(state), sort_keys=True) != before:
            unique.setdefault(f"{m.kind} {m.path} {json.dumps(m.value)}", m)
    return list(unique.values())


@dataclass
class Outcome:
    """What a tampered state did.

    Attributes:
        verdict: ``"refused"``, ``"exact"``, ``"other position"``, or a failure:
            ``"wrong data"``, ``"error at next()"``, ``"hang"``, ``"refused wrongly"``.
        detail: The message, or how the data was wrong.
    """

    verdict: str
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict not in {"refused", "exact", "other position"}


def judge(
    pipeline: Pipeline,
    seed: int,
    size: int,
    taken: Taken,
    state: dict[str, Any],
    timeout: float = TIMEOUT,
) -> Outcome:
    """Give *state* to a fresh loader and judge what the rest of its pass is.

    Args:
        pipeline: The pipeline.
        seed: Its seed.
        size: Its size.
        taken: The untampered state and the items taken before it.
        state: The tampered state.
        timeout: How long the rest of the pass may take, in seconds.

    Returns:
        The outcome.
    """
    loader = pipeline.build(seed, size, 0)
    try:
        try:
            loader.load_state_dict(state)
        except ValueError as e:
            return Outcome("refused", str(e))
        except Exception as e:
            return Outcome("refused wrongly", f"{type(e).__name__}: {e}")
        epoch = loader.epoch
        got = bounded(lambda: items(loader), timeout)
    finally:
        closing = bounded(loader.close, timeout)
    if got.hung:
        return Outcome("hang", f"no end of the pass within {timeout:g} s")
    if got.error is not None:
        return Outcome("error at next()", f"{type(got.error).__name__}: {got.error}")
    if closing.hung or closing.error is not None:
        return Outcome("error at close()", repr(closing.error) if closing.error else "hung")
    want = reference(pipeline.name, seed, size, epoch)
    if want is None:
        return Outcome("wrong data", f"loaded epoch {epoch}, which a fresh loader cannot run")
    rest: list[Any] = got.value
    same_epoch = epoch == taken.state["epoch"]
    if pipeline.ordered:
        p = len(want) - len(rest)
        if p < 0 or want[p:] != rest:
            return Outcome("wrong data", _diff(want, rest, epoch))
        exact = same_epoch and p == len(taken.head)
        return Outcome("exact" if exact else "other position", f"epoch {epoch}, step {p}")
    if counted(rest) - counted(want):
        extra = list((counted(rest) - counted(want)).elements())[:3]
        return Outcome("wrong data", f"epoch {epoch}: items not in the epoch {extra}")
    exact = same_epoch and counted(rest) + counted(taken.head) == counted(want)
    return Outcome("exact" if exact else "other position", f"epoch {epoch}, {len(rest)} items")


def _diff(want: list[Any], got: list[Any], epoch: int) -> str:
    shown = json.dumps(got)
    shown = shown if len(shown) < 200 else shown[:197] + "..."
    return f"{len(got)} items, no suffix of epoch {epoch}'s {len(want)}: {shown}"


@functools.cache
def tampered_cases(name: str, seed: int, size: int, k: int) -> tuple[Taken, tuple[Mutation, ...]]:
    """The state of a pipeline after *k* steps and every mutation of it (those whose text
    holds ``CONTRACT_ONLY``, when set).

    Raises:
        AssertionError: if the pipeline gives no state there (the honest contract's failure).
    """
    pipeline = PIPELINES[name]
    try:
        taken = take(pipeline, seed, size, k)
        other = take(pipeline, seed, size, k, variant=1).state
    except StateRefused as e:
        raise AssertionError(f"{name} seed={seed} size={size}, after {k} steps: {e}") from e
    only = os.environ.get("CONTRACT_ONLY", "")
    return taken, tuple(m for m in mutations(taken.state, other) if only in str(m))


TAMPERED = "tests/test_resume_contract.py::test_every_tampered_field_is_refused_or_resumes_at_a_valid_place"


def command(name: str, mutation: Mutation) -> str:
    """How to run one mutation of the full sweep again."""
    where = "/".join(map(str, mutation.path))
    return f"CONTRACT_ONLY='{where}:' .venv/bin/pytest '{TAMPERED}[{name}]'"


def check_tampered(
    name: str, seed: int, size: int, k: int, picked: list[int] | None = None
) -> list[tuple[Mutation, Outcome]]:
    """Judge mutations of a state taken after *k* steps.

    Args:
        name: The pipeline.
        seed: Its seed.
        size: Its size.
        k: The steps taken before the state.
        picked: Which mutations, by index (``None``: all).

    Returns:
        Each mutation and its outcome.
    """
    pipeline = PIPELINES[name]
    taken, all_ = tampered_cases(name, seed, size, k)
    chosen = all_ if picked is None else [all_[i % len(all_)] for i in picked]
    out: list[tuple[Mutation, Outcome]] = []
    for m in chosen:
        # After a hang, a shorter limit: a pass takes well under a second, and a sweep with
        # many hangs must still end within pytest's timeout.
        hung = any(o.verdict == "hang" for _, o in out)
        limit = min(TIMEOUT, AFTER_A_HANG) if hung else TIMEOUT
        out.append((m, judge(pipeline, seed, size, taken, m.applied(taken.state), limit)))
    return out


def report(name: str, seed: int, size: int, k: int, results: list[tuple[Mutation, Outcome]]) -> str:
    """The failures among *results*, each with its outcome and how to run it again."""
    failures = [(m, o) for m, o in results if o.failed]
    tally = dict(Counter(o.verdict for _, o in results))
    lines = [
        f"{name} seed={seed} size={size}, state after {k} steps: {len(failures)} of "
        f"{len(results)} tampered states broke the contract {tally}"
    ]
    for m, o in failures:
        lines.append(f"  [{o.verdict}] {m}\n      {o.detail}\n      rerun: {command(name, m)}")
    return "\n".join(lines)


def middle(name: str, seed: int, size: int) -> int:
    """A step in the middle of a pipeline's epoch."""
    return max(1, len(epochs(name, seed, size, 1)[0]) // 2)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", FAST)
def test_every_tampered_field_is_refused_or_resumes_at_a_valid_place(name: str) -> None:
    seed, size = 5, PIPELINES[name].sizes[0]
    k = middle(name, seed, size)
    results = check_tampered(name, seed, size, k)
    assert results or os.environ.get("CONTRACT_ONLY"), "the state has no field to tamper with"
    assert not any(o.failed for _, o in results), report(name, seed, size, k, results)


@pytest.mark.slow
@pytest.mark.parametrize("name", SLOW)
def test_a_tampered_state_of_a_process_pipeline_is_refused_or_resumes_validly(name: str) -> None:
    seed, size = 5, PIPELINES[name].sizes[0]
    k = middle(name, seed, size)
    _, all_ = tampered_cases(name, seed, size, k)
    picked = list(range(0, len(all_), max(1, len(all_) // 12)))
    results = check_tampered(name, seed, size, k, picked)
    assert not any(o.failed for _, o in results), report(name, seed, size, k, results)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    name=st.sampled_from(FAST),
    seed=st.integers(0, 2**32),
    which=st.integers(0, 2),
    data=st.data(),
)
def test_a_tampered_state_is_refused_or_resumes_for_any_seed_size_and_step(
    name: str, seed: int, which: int, data: st.DataObject
) -> None:
    size = PIPELINES[name].sizes[which % len(PIPELINES[name].sizes)]
    n = len(epochs(name, seed, size, 1)[0])
    k = data.draw(st.integers(1, max(1, n - 1)), label="k")
    _, all_ = tampered_cases(name, seed, size, k)
    if not all_:
        return  # CONTRACT_ONLY left none
    i = data.draw(st.integers(0, len(all_) - 1), label="mutation")
    results = check_tampered(name, seed, size, k, [i])
    assert not results[0][1].failed, report(name, seed, size, k, results)
