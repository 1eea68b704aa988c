"""engine/_stage.py: Stage and ``|`` — composition, what ``|`` refuses, and every stage's recipe
(eager checks, pickling, repr, immutability)."""

from __future__ import annotations

import dataclasses
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

import pipeflow as pf
from pipeflow.resume.state import Form, Int, Record, Rule
from tests.example_stages import add_noise, with_epoch
from tests.strategies import batch_sizes


# -- composition and `|` ----------------------------------------------------------------------
@given(items=st.lists(st.integers(), max_size=50), size=batch_sizes)
def test_composition_is_associative(items: list[int], size: int) -> None:
    a, b, c = pf.map(lambda x: x * 3), pf.filter(lambda x: x % 2 == 0), pf.batch(size)
    left = (a | b) | c
    right = a | (b | c)
    assert left == right
    assert left.stages == right.stages == (a, b, c)
    src = pf.from_iterable(items)
    assert list(src | left) == list(src | right) == list(((src | a) | b) | c)


def test_stage_pipes_compose_before_data_exists() -> None:
    ds = ["a", "b", "c", "d"]
    prep = pf.fetch(ds) | pf.map(str.upper)
    assert isinstance(prep, pf.Stage)
    loader = pf.indices(4) | prep
    assert list(loader) == ["A", "B", "C", "D"]
    assert len(loader) == 4


@pytest.mark.parametrize(
    "other", [1, "x", [1, 2], None, object(), lambda x: x], ids=lambda o: type(o).__name__
)
def test_or_with_non_pipeflow_operand_raises_type_error(other: object) -> None:
    with pytest.raises(TypeError):
        pf.batch(2) | other
    with pytest.raises(TypeError):
        other | pf.batch(2)
    with pytest.raises(TypeError):
        pf.indices(3) | other
    with pytest.raises(TypeError):
        other | pf.indices(3)


def test_numpy_array_cannot_take_over_the_pipe() -> None:
    np = pytest.importorskip("numpy")
    with pytest.raises(TypeError):
        np.arange(3) | pf.batch(2)


def test_loader_or_loader_and_stage_or_loader_raise() -> None:
    with pytest.raises(TypeError):
        pf.indices(3) | pf.indices(3)
    with pytest.raises(TypeError):
        pf.batch(2) | pf.indices(3)


# -- every stage: eager validation, pickling, repr, immutability ------------------------------
BAD_ARGUMENTS = [
    (pf.batch, (0,), {}, ValueError, r"batch: size must be at least 1 \(got 0\)"),
    (pf.batch, (2.0,), {}, TypeError, "size must be an integer"),
    (pf.batch, (2,), {"drop_last": "yes"}, TypeError, "drop_last must be a bool"),
    (pf.shuffle, (), {"seed": -1}, ValueError, "seed"),
    (pf.shuffle, (), {"seed": "a"}, TypeError, "seed"),
    (pf.shuffle, (), {"buffer_size": 0}, ValueError, r"buffer_size must be at least 1 \(got 0\)"),
    (pf.fetch, (3,), {}, TypeError, "dataset"),
    (pf.fetch, ([1],), {"batched": "no"}, TypeError, "batched"),
    (pf.map, (3,), {}, TypeError, "fn must be callable"),
    (pf.filter, (None,), {}, TypeError, "predicate must be callable"),
    (pf.collate, (3,), {}, TypeError, "collate"),
    (pf.indices, (-1,), {}, ValueError, "indices"),
]


@pytest.mark.parametrize(("factory", "args", "kwargs", "exc", "match"), BAD_ARGUMENTS)
def test_bad_arguments_raise_when_the_stage_is_built(factory, args, kwargs, exc, match) -> None:
    with pytest.raises(exc, match=match):
        factory(*args, **kwargs)


def _double(x: int) -> int:
    return 2 * x


def _even(x: int) -> bool:
    return x % 2 == 0


ALL_STAGES = [
    pf.batch(3),
    pf.batch(3, drop_last=True),
    pf.unbatch(),
    pf.shuffle(seed=1),
    pf.shuffle(seed=1, buffer_size=4),
    pf.fetch([10, 11, 12]),
    pf.map(_double),
    pf.filter(_even),
    pf.collate(),
    pf.collate(list),
    add_noise(scale=1.0),
    with_epoch(),
    pf.batch(2) | pf.unbatch(),
    pf.parallel_map(_double, workers=2, seed=3),
    pf.parallel_map(pf.fetch([1, 2]) | pf.map(_double), workers=2, backend="process", seed=4),
]


@pytest.mark.parametrize("s", ALL_STAGES, ids=repr)
def test_stages_pickle_compare_and_have_readable_reprs(s: pf.Stage) -> None:
    clone = pickle.loads(pickle.dumps(s))
    assert clone == s
    assert hash(clone) == hash(s)
    assert repr(clone) == repr(s)
    assert "object at 0x" not in repr(s)
    assert repr(s).startswith(s.stages[0].name + "(")


@pytest.mark.parametrize("s", ALL_STAGES, ids=repr)
def test_stages_are_immutable(s: pf.Stage) -> None:
    with pytest.raises(AttributeError):
        s._config = {}  # type: ignore[misc]


# -- how a stage resumes: a rule, declared once ------------------------------------------------
def test_a_subclass_that_still_answers_resumption_is_refused_when_it_is_defined() -> None:
    with pytest.raises(TypeError, match=r"defines resumption, which pipeflow no longer"):

        class Old(pf.Stage):  # type: ignore[type-arg]
            def resumption(self, k: int, context: object) -> object:
                return None


@pytest.mark.parametrize(
    ("method", "field"),
    [
        ("computed", "compute"),
        ("context_after", "publish"),
        ("drops_failures", "drops"),
        ("without_torch", "numpy"),
    ],
)
def test_a_subclass_that_still_answers_an_engine_question_is_refused(
    method: str, field: str
) -> None:
    with pytest.raises(TypeError, match=rf"defines {method}, .*Traits\({field}=\.\.\.\)"):
        type("Old", (pf.Stage,), {method: lambda self, *args: None})


def _tag(context: pf.Context, *, label: str) -> pf.Context:
    return dataclasses.replace(context, facts={**context.facts, "label": label})


def _read_tag(items, *, context):  # type: ignore[no-untyped-def]
    for x in items:
        yield (x, context.facts.get("label"))


def test_traits_are_data_that_travel_with_the_stage_and_reach_the_next_one() -> None:
    tagging = pf.Stage(
        lambda items, label: iter(items),
        "tag",
        {"label": "a"},
        length="same",
        traits=pf.Traits(publish=_tag),
    )
    assert tagging.traits == pf.Traits(publish=_tag)
    assert pickle.loads(pickle.dumps(pf.Stage(iter, "x", failures="pass"))).traits == (
        pf.Traits(failures="pass")
    )
    reading = pf.Stage(_read_tag, "read", length="same")
    assert list(pf.from_iterable([1, 2]) | tagging | reading) == [(1, "a"), (2, "a")]


def test_skip_and_a_whole_rule_are_one_or_the_other() -> None:
    with pytest.raises(TypeError, match="give skip= or resume=, not both"):
        pf.Stage(iter, "x", skip="same", resume=Rule.seek())


def test_a_recording_stage_gets_its_record_as_it_gets_its_context() -> None:
    seen: list[Count] = []

    def evens(items, *, record):  # type: ignore[no-untyped-def]
        seen.append(record)
        for x in items:
            record.made += 1
            yield 2 * x

    rule = Rule.recorded(Count)
    loader = pf.indices(6) | pf.Stage(evens, "evens", length="same", resume=rule)
    it = iter(loader)
    assert [next(it), next(it)] == [0, 2]
    state = loader.state_dict()
    assert state["stages"] == {"0": {"inputs": 2}}
    assert seen[0].made == 2
    again = pf.indices(6) | pf.Stage(evens, "evens", length="same", resume=rule)
    again.load_state_dict(state)
    assert list(again) == [4, 6, 8, 10]
    assert seen[-1].offset == 2


class Count(Record):
    """A record declared once: its form (checked at load), how a pass begins it."""

    FORM = Form({"inputs": Int(0, "total")})

    @classmethod
    def begin(cls, stage: object, context: pf.Context, saved: object) -> Count:
        return cls(context.offset)

    def __init__(self, offset: int) -> None:
        self.offset, self.made = offset, 0

    def after(self, consumed: int) -> dict[str, int]:
        return {"inputs": self.offset + consumed}


def test_a_record_is_checked_against_its_declared_form() -> None:
    loader = pf.indices(6) | pf.Stage(
        lambda items, *, record: iter(items), "x", resume=Rule.recorded(Count)
    )
    state = loader.state_dict()
    state["stages"] = {"0": {"inputs": 7}}
    with pytest.raises(ValueError, match=r"\['inputs'\] must be between 0 and 6 \(got 7\)"):
        loader.load_state_dict(state)
    state["stages"] = {"0": {"inputs": 1, "more": 2}}
    with pytest.raises(ValueError, match="has an unknown key 'more'"):
        loader.load_state_dict(state)
