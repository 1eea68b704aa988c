"""The messages for a new user's first mistakes (issue 27): each says what to write instead.

Python's own words for these named two types or said "not iterable"; here each message is
checked for the fix it gives, for the keyword check on every public function (a property),
and for ``|`` with anything that is not a stage (a property).
"""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import assume, given
from hypothesis import strategies as st
from strategies import misspellings, not_stages

import pipeflow as pf

ROOT = Path(__file__).resolve().parents[1]
DATASET = torch.utils.data.TensorDataset(torch.randn(10, 3), torch.arange(10))


# -- `|` --------------------------------------------------------------------------------------
def _has_ror(thing: Any) -> bool:
    """Whether *thing*'s class has a `|` of its own that Python asks (int, set, dict)."""
    return any(vars(c).get("__ror__") is not None for c in type(thing).__mro__)


def test_a_dataset_after_a_source_says_fetch() -> None:
    with pytest.raises(TypeError) as e:
        pf.indices(DATASET) | DATASET
    assert str(e.value) == (
        "unsupported operand type(s) for |: 'Loader' and 'TensorDataset' (indices(10) | "
        "<TensorDataset>): to read a TensorDataset by index, put pf.fetch(...) in the "
        "pipeline: pf.indices(dataset) | "
        "pf.fetch(dataset), where dataset is your TensorDataset"
    )


@pytest.mark.parametrize("factory", [pf.fetch, pf.batch, pf.collate, pf.shuffle, pf.map])
def test_a_factory_without_parentheses_says_call_it(factory: Any) -> None:
    name = factory.__name__
    for left in (pf.indices(4), pf.batch(2)):  # after a source, after a stage
        with pytest.raises(
            TypeError, match=rf"pf\.{name} is a stage factory; call it: \| pf\.{name}\(\.\.\.\)"
        ):
            left | factory


def test_a_stage_decorated_factory_without_parentheses_says_call_it() -> None:
    @pf.stage
    def twice(items):
        for x in items:
            yield x
            yield x

    with pytest.raises(TypeError, match=r"twice is a stage factory; call it: \| twice\(\.\.\.\)"):
        pf.indices(3) | twice
    assert list(pf.indices(2) | twice()) == [0, 0, 1, 1]


def test_a_plain_function_after_a_source_says_map() -> None:
    with pytest.raises(TypeError, match=r"wrap it: \| pf\.map\(fn\); a generator function"):
        pf.indices(3) | abs


def test_a_loader_after_a_loader_says_mix() -> None:
    with pytest.raises(TypeError, match=r"a source of its own \(indices\(2\)\).*pf\.mix"):
        pf.indices(3) | (pf.indices(2) | pf.batch(1))


@pytest.mark.parametrize(
    "data", [[1, 2, 3], np.arange(3), DATASET], ids=["list", "array", "dataset"]
)
def test_data_before_a_stage_says_which_source(data: Any) -> None:
    with pytest.raises(TypeError) as e:
        data | pf.batch(2)
    assert f"'{type(data).__name__}' and 'Stage'" in str(e.value)
    assert "pf.from_iterable(items)" in str(e.value) and "pf.indices(dataset)" in str(e.value)


def test_a_source_factory_without_parentheses_says_call_it() -> None:
    with pytest.raises(
        TypeError, match=r"pf\.indices is a factory; call it: pf\.indices\(\.\.\.\)"
    ):
        pf.indices | pf.batch(2)


@given(thing=not_stages)
def test_anything_but_a_stage_after_a_loader_or_stage_is_a_type_error_with_a_fix(thing) -> None:
    """Either side of `|` that is not a pipeflow object: a TypeError, as Python gives; with a
    fix after the two type names, unless the thing has a `|` of its own (an int, a dict),
    which is asked first (and declines here)."""
    for left in (pf.indices(3), pf.batch(2)):
        with pytest.raises(TypeError) as e:
            left | thing
        text = str(e.value)
        head = f"unsupported operand type(s) for |: '{type(left).__name__}' and '{type(thing).__name__}'"
        assert text.startswith(head)
        if not _has_ror(thing):
            assert len(text) > len(head) + 20 and "pf." in text[len(head) :]


# -- iterating a stage ------------------------------------------------------------------------
def test_iterating_a_stage_says_it_needs_a_source() -> None:
    with pytest.raises(TypeError) as e:
        list(pf.batch(32))
    assert str(e.value).startswith(
        "batch(size=32, drop_last=False) is not iterable: it is a stage, a recipe with no "
        "items of its own. Put a source before it"
    )
    assert "pf.indices(n) | stage" in str(e.value)


def test_iterating_stages_joined_by_bar_does_not_speak_of_pipes() -> None:
    with pytest.raises(TypeError) as e:
        for _ in pf.batch(2) | pf.collate():
            pass
    assert "Pipe" not in str(e.value)
    assert str(e.value).startswith(
        "batch(size=2, drop_last=False) | collate() is not iterable: it is a chain of stages"
    )


def test_a_stage_is_still_refused_as_a_source() -> None:
    """Stage.__iter__ exists only to raise: sources still refuse a stage when built."""
    with pytest.raises(
        TypeError, match=r"from_iterable: iterable must hold items, and batch\(.*\) is a stage"
    ):
        pf.from_iterable(pf.batch(2))
    with pytest.raises(
        TypeError,
        match=r"from_sampler: sampler must hold items.*pf\.from_sampler\(items\) \| stage",
    ):
        pf.from_sampler(pf.batch(2) | pf.collate())


# -- keywords -----------------------------------------------------------------------------
def _public_functions() -> list[tuple[str, Any, list[str]]]:
    out = []
    for name in pf.__all__:
        fn = getattr(pf, name)
        if inspect.isfunction(fn) and hasattr(fn, "__wrapped__"):
            params = inspect.signature(fn).parameters.values()
            names = [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
            out.append((name, fn, names))
    return out


PUBLIC = _public_functions()


def test_every_public_function_with_keywords_checks_them() -> None:
    names = {name for name, _, _ in PUBLIC}
    assert {"batch", "shuffle", "parallel_map", "parallel_source", "collate", "fetch"} <= names
    assert {"map", "ignore_errors", "progress", "shards", "mix", "pack", "stage"} <= names
    assert len(names) == 30  # every function in pf.__all__ but default_collate, default_convert


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (
            lambda: pf.batch(2, drop_lst=True),
            "batch() got an unexpected keyword argument 'drop_lst'. Did you mean 'drop_last'?",
        ),
        (
            lambda: pf.shuffle(sed=0),
            "shuffle() got an unexpected keyword argument 'sed'. Did you mean 'seed'?",
        ),
        (
            lambda: pf.parallel_map(abs, worker=2),
            "parallel_map() got an unexpected keyword argument 'worker'. Did you mean 'workers'?",
        ),
        (
            lambda: pf.DataLoader(DATASET, batchsize=2),
            "DataLoader() got an unexpected keyword argument 'batchsize'. Did you mean 'batch_size'?",
        ),
        (
            lambda: pf.StatefulDataLoader(DATASET, num_worker=2),
            "StatefulDataLoader() got an unexpected keyword argument 'num_worker'. Did you mean 'num_workers'?",
        ),
        (
            lambda: pf.batch(2, colour="red"),
            "batch() got an unexpected keyword argument 'colour'. It takes: size, drop_last, max_tokens, length, window, seed.",
        ),
    ],
    ids=["batch", "shuffle", "parallel_map", "DataLoader", "StatefulDataLoader", "no close one"],
)
def test_a_misspelt_keyword_gets_did_you_mean(call: Any, message: str) -> None:
    with pytest.raises(TypeError) as e:
        call()
    assert str(e.value) == message


def test_a_stage_decorated_factory_suggests_its_own_parameters() -> None:
    @pf.stage(length="same")
    def scale(items, *, factor=2):
        for x in items:
            yield x * factor

    with pytest.raises(
        TypeError,
        match=r"^stage 'scale': got an unexpected keyword argument 'factr'\. Did you mean 'factor'\?$",
    ):
        scale(factr=3)


@given(data=st.data())
def test_any_slip_in_any_keyword_of_any_public_function_is_refused_with_a_suggestion(data) -> None:
    """The invariant: a keyword the function doesn't take raises TypeError before the function
    runs, naming the keyword and suggesting one it takes (or listing them all)."""
    _, fn, params = data.draw(st.sampled_from([p for p in PUBLIC if p[2]]))
    wanted = data.draw(st.sampled_from(params))
    slip = data.draw(misspellings(wanted))
    assume(slip not in params and slip.isidentifier())
    with pytest.raises(TypeError) as e:
        fn(**{slip: None})
    text = str(e.value)
    assert f"got an unexpected keyword argument {slip!r}." in text
    suggested = text.rsplit("Did you mean ", 1)[-1].strip("'?") if "Did you mean" in text else None
    assert suggested in params if suggested else "It takes: " in text


def test_the_check_keeps_each_signature() -> None:
    assert str(inspect.signature(pf.batch)) == str(inspect.signature(pf.batch.__wrapped__))
    assert pf.batch(2, drop_last=True) == pf.batch.__wrapped__(2, drop_last=True)


# -- collate without batch ----------------------------------------------------------------
def test_collate_of_one_sample_says_batch_first() -> None:
    loader = pf.indices(DATASET) | pf.fetch(DATASET) | pf.collate()
    with pytest.raises(RuntimeError) as e:
        next(iter(loader))
    assert "item 0 has shape (3,), item 1 has shape ()" in str(e.value)
    assert e.value.__notes__ == [
        "pipeflow: collate takes a batch, a list of samples, but got a tuple: if that is one "
        "sample, put pf.batch(n) before pf.collate()",
        "pipeflow: stage 'collate' failed on sample index 0 (epoch 0)",
    ]


def test_collate_of_one_tensor_says_batch_first_and_the_pass_goes_on() -> None:
    loader = pf.indices(3) | pf.map(lambda i: torch.zeros(2)) | pf.collate()
    it = iter(loader)
    for _ in range(3):  # each item fails at its turn; the pass goes on
        with pytest.raises(TypeError) as e:
            next(it)
        assert (
            "got a Tensor: if that is one sample, put pf.batch(n) before pf.collate()"
            in e.value.__notes__[0]
        )
    with pytest.raises(StopIteration):
        next(it)


def test_collate_of_batches_gets_no_hint() -> None:
    ragged = [np.zeros(3), np.zeros(4)]
    loader = pf.indices(2) | pf.batch(2) | pf.fetch(ragged) | pf.collate()
    with pytest.raises(RuntimeError, match=r"pad them with pf\.collate") as e:
        next(iter(loader))
    assert not any("pf.batch(n)" in note for note in e.value.__notes__)


# -- an unseeded shuffle resumes ----------------------------------------------------------
def test_an_unseeded_shuffle_resumes_in_a_new_process() -> None:
    """Issue 27 listed "an unseeded shuffle refused on resume" among the unhelpful messages;
    since the drawn seed travels in the state, there is no refusal left to word."""
    first = pf.indices(20) | pf.shuffle() | pf.batch(3)
    it = iter(first)
    taken = [next(it) for _ in range(2)]
    rest = list(it)
    first.set_epoch(0)
    it = iter(first)
    [next(it) for _ in range(2)]
    state = json.dumps(first.state_dict())
    code = textwrap.dedent(
        f"""
        import json, sys
        import pipeflow as pf
        loader = pf.indices(20) | pf.shuffle() | pf.batch(3)  # draws another seed here
        loader.load_state_dict(json.loads({state!r}))
        print(json.dumps(list(loader)))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    assert json.loads(done.stdout) == rest
    assert sorted(i for b in taken + rest for i in b) == list(range(20))
