"""Mistakes a new user made that pipeflow let pass in silence, or answered in Python's words:
each now says what went wrong and what to write instead.

1. ``pf.fetch`` forgotten: a pass of a dataset's indices warns at its first item;
2. ``next(loader)``: a TypeError that says to call ``iter(loader)`` first;
3. ``|`` with something that is not a stage: the message names stages as the user wrote them
   (``shuffle(seed=0)``), never a private class (``_FullShuffle``);
4. the bench's last lines tell "better than torch" apart from "short of its goal", in one
   spelling, without capitals;
5. a pass left open until the interpreter exits logs nothing after the program's output.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import BatchSampler, RandomSampler, TensorDataset

import pipeflow as pf

ROOT = Path(__file__).resolve().parents[1]
DATASET = TensorDataset(torch.randn(10, 3), torch.arange(10))
HINT = r"dataset indices, not samples .*Add pf\.fetch\(dataset\)"


def _pipeflow_warnings(run: Callable[[], Any]) -> list[warnings.WarningMessage]:
    """The warnings pipeflow gave while *run* ran (every one, not once per place)."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run()
    return [w for w in caught if str(w.message).startswith("pipeflow:")]


# -- 1. pf.fetch forgotten --------------------------------------------------------------------
def test_a_dataset_s_indices_batched_without_fetch_warn_at_the_first_batch() -> None:
    loader = pf.indices(DATASET) | pf.shuffle(seed=0) | pf.batch(4) | pf.collate()
    it = iter(loader)
    with pytest.warns(UserWarning, match=HINT) as caught:
        first = next(it)  # the training loop's line: the warning points here
    assert first.dtype == torch.int64
    assert caught[0].filename == __file__
    assert "pf.indices(len(dataset))" in str(caught[0].message)
    # once per loader: the rest of the pass and the next passes are quiet
    assert not _pipeflow_warnings(lambda: (list(it), list(loader), list(loader)))


def test_a_dataset_s_indices_unpacked_as_samples_warn_before_the_unpacking_fails() -> None:
    loader = pf.indices(DATASET) | pf.shuffle(seed=0)
    with pytest.warns(UserWarning, match=HINT), pytest.raises(TypeError, match="unpack"):
        for x, y in loader:  # type: ignore[misc]  # noqa: B007 (mypy knows: a Loader[int])
            pass


@pytest.mark.parametrize(
    "source",
    [
        lambda: pf.from_sampler(RandomSampler(DATASET)) | pf.batch(4),
        lambda: pf.from_sampler(BatchSampler(RandomSampler(DATASET), 4, False)) | pf.collate(),
    ],
    ids=["sampler", "batch sampler"],
)
def test_a_torch_sampler_s_indices_without_fetch_warn(source: Callable[[], Any]) -> None:
    caught = _pipeflow_warnings(lambda: next(iter(source())))
    assert len(caught) == 1
    assert re.search(HINT, str(caught[0].message))
    assert "filterwarnings" in str(caught[0].message)


def label(i: int) -> int:
    return int(DATASET[i][1])


def noisy(i: int, rng: Any) -> float:
    return i + float(rng.random())


@pf.stage
def passthrough(items: Iterator[int]) -> Iterator[int]:
    yield from items


QUIET = {
    # the user asked for numbers
    "indices(10)": lambda: pf.indices(10) | pf.shuffle(seed=0) | pf.batch(4) | pf.collate(),
    "indices(len)": lambda: pf.indices(len(DATASET)) | pf.batch(4),
    "a list as sampler": lambda: pf.from_sampler([3, 1, 2]) | pf.batch(2),
    # a source alone: a look at the indices, not a pipeline
    "indices(dataset)": lambda: pf.indices(DATASET),
    "from_sampler alone": lambda: pf.from_sampler(RandomSampler(DATASET)),
    # a stage reads the dataset, or runs a function of the user's: integers may be data
    "fetch": lambda: pf.indices(DATASET) | pf.shuffle(seed=0) | pf.fetch(DATASET),
    "map": lambda: pf.indices(DATASET) | pf.map(label) | pf.batch(2),
    "filter": lambda: pf.indices(DATASET) | pf.filter(bool),
    "@pf.stage": lambda: pf.indices(DATASET) | passthrough(),
    "collate(fn)": lambda: pf.indices(DATASET) | pf.batch(2) | pf.collate(list),
    # a loader read by pipeflow's own code is a part of a larger pipeline
    "mix": lambda: pf.mix([pf.indices(DATASET) | pf.batch(2)], seed=0),
    "thread workers": lambda: pf.parallel_source(
        pf.indices(DATASET) | pf.batch(2), workers=2, backend="thread"
    ),
}


@pytest.mark.parametrize("make", QUIET.values(), ids=QUIET.keys())
def test_pipelines_that_mean_their_integers_do_not_warn(make: Callable[[], Any]) -> None:
    loader = make()
    assert not _pipeflow_warnings(lambda: list(loader))


def test_the_check_costs_nothing_after_the_first_item_of_a_pass() -> None:
    """The check runs once, on the first item; ``next()`` then calls the last stage
    directly, as for any loader (and a loader that can't warn never checks at all)."""
    loader = pf.indices(DATASET) | pf.shuffle(seed=0) | pf.batch(4)
    it: Any = iter(loader)
    assert it.on_first is not None
    with pytest.warns(UserWarning, match=HINT):
        next(it)
    assert it.on_first is None and it.pull == it.chain[-1].__next__
    assert iter(pf.indices(10) | pf.batch(4)).on_first is None  # type: ignore[attr-defined]
    assert iter(loader).on_first is None  # type: ignore[attr-defined]  # warned already


# -- 2. next(loader) --------------------------------------------------------------------------
def test_next_on_a_loader_says_to_call_iter_first() -> None:
    loader = pf.indices(4) | pf.batch(2)
    with pytest.raises(TypeError) as e:
        next(loader)  # type: ignore[call-overload]
    assert str(e.value).startswith("'Loader' object is not an iterator: a loader is re-iterable")
    assert "it = iter(loader); batch = next(it)" in str(e.value)
    it = iter(loader)
    assert next(it) == [0, 1]  # the pass is the iterator


def test_a_loader_is_still_taken_as_re_iterable_by_the_sources() -> None:
    """``__next__`` makes ``isinstance(loader, Iterator)`` true at run time: the sources
    that refuse or spend one-shot iterators still take a loader as re-iterable."""
    inner = pf.indices(3)
    outer = pf.from_iterable(inner)
    assert list(outer) == list(outer) == [0, 1, 2]  # a second epoch, not an error
    assert list(pf.from_sampler(inner)) == [0, 1, 2]


# -- 3. `|` names stages as the user wrote them -----------------------------------------------
def _stages() -> dict[str, Callable[[], Any]]:
    """Every public stage factory, built."""
    return {
        "batch": lambda: pf.batch(2),
        "bucket": lambda: pf.bucket([4], length=len, batch_size=2, window=8),
        "cache": lambda: pf.map(abs) | pf.cache(),
        "collate": lambda: pf.collate(),
        "fetch": lambda: pf.fetch(DATASET),
        "filter": lambda: pf.filter(bool),
        "ignore_errors": lambda: pf.ignore_errors(),
        "map": lambda: pf.map(abs),
        "pack": lambda: pf.pack(8),
        "parallel_map": lambda: pf.parallel_map(abs, workers=1),
        "pin_memory": lambda: pf.pin_memory(),
        "progress": lambda: pf.progress(),
        "random_map": lambda: pf.random_map(noisy, seed=0),
        "read_jsonl": lambda: pf.read_jsonl(),
        "read_parquet": lambda: pf.read_parquet(),
        "read_tar": lambda: pf.read_tar(),
        "shard": lambda: pf.shard(0, 2),
        "shuffle": lambda: pf.shuffle(seed=0),
        "shuffle(buffer_size)": lambda: pf.shuffle(seed=0, buffer_size=4),
        "stage": lambda: passthrough(),
        "to_device": lambda: pf.to_device("cpu"),
        "unbatch": lambda: pf.unbatch(),
        "chain": lambda: pf.shuffle(seed=0) | pf.batch(2),
    }


def _sources() -> dict[str, Callable[[], Any]]:
    return {
        "indices": lambda: pf.indices(3),
        "from_iterable": lambda: pf.from_iterable([1, 2]),
        "from_sampler": lambda: pf.from_sampler([0, 1]),
        "mix": lambda: pf.mix([pf.indices(2)], seed=0),
        "parallel_source": lambda: pf.parallel_source(pf.indices(2), workers=1),
        "shards": lambda: pf.shards(["a.jsonl", "b.jsonl"], seed=0),
        "loader": lambda: pf.indices(3) | pf.shuffle(seed=0) | pf.batch(2),
    }


def test_the_table_holds_every_public_factory() -> None:
    made = {n.split("(")[0] for n in [*_stages(), *_sources()]}
    for name in pf.__all__:
        obj = getattr(pf, name)
        if inspect.isfunction(obj) or inspect.isfunction(getattr(obj, "__wrapped__", None)):
            returns = str(inspect.signature(obj).return_annotation)
            if re.search(r"\b(Stage|Loader|Reader)\b", returns):
                assert name in made, f"add pf.{name} to the table"


OTHERS = [
    3,
    None,
    "x",
    [1, 2],
    {1},
    {"a": 1},
    np.arange(3),
    torch.arange(3),
    DATASET,
    abs,
    lambda x: x,
    pf.batch,
    pf.indices,
    int,
    object(),
]
_PRIVATE = re.compile(r"(?<![\w.])_\w+")


def _message(run: Callable[[], Any]) -> str:
    with pytest.raises(TypeError) as e:
        run()
    return str(e.value)


@pytest.mark.parametrize(
    "make", [*_stages().values(), *_sources().values()], ids=[*_stages(), *_sources()]
)
def test_a_bar_error_never_names_a_private_class(make: Callable[[], Any]) -> None:
    loaders = [pf.indices(2), pf.from_iterable([1])]  # before a stage they are a pipeline
    for other in [*OTHERS, *loaders, pf.indices(2).source]:
        thing = make()
        runs = [lambda a=thing, b=other: a | b]
        if all(other is not x for x in loaders) or isinstance(thing, pf.Loader):
            runs.append(lambda a=thing, b=other: b | a)
        for run in runs:
            text = _message(run)
            assert not _PRIVATE.findall(text), text
            assert text.startswith("unsupported operand type(s) for |: "), text


@pytest.mark.parametrize("make", _stages().values(), ids=_stages().keys())
def test_a_bar_error_names_the_stage_as_the_user_wrote_it(make: Callable[[], Any]) -> None:
    stage = make()
    first, last = repr(stage.stages[0]), repr(stage.stages[-1])
    assert last in _message(lambda: stage | 3)
    assert first in _message(lambda: {1} | stage)
    assert last in _message(lambda: stage | pf.indices(3))  # a source in the middle
    assert repr(stage.stages[-1]) in _message(lambda: pf.indices(3) | stage | None)


def test_a_bar_error_with_a_number_names_the_stage_and_says_what_goes_there() -> None:
    assert _message(lambda: pf.shuffle(seed=0) | 3) == (
        "unsupported operand type(s) for |: 'Stage' and 'int' (shuffle(seed=0) | 3): the "
        "right side of | must be a pipeflow stage, such as pf.batch(32) or pf.map(fn)"
    )
    assert _message(lambda: pf.shuffle(seed=0) | pf.indices(3)).startswith(
        "unsupported operand type(s) for |: 'Stage' and 'Loader' (shuffle(seed=0) | "
        "indices(3)): the right side is a loader, with a source of its own (indices(3))"
    )
    assert "pf.from_iterable(items)" in _message(lambda: 3 | pf.indices(3))


def test_a_class_whose_own_bar_knows_pipeflow_objects_still_answers() -> None:
    class Knows:
        def __ror__(self, other: object) -> str:
            return f"took {other!r}"

    assert pf.batch(2) | Knows() == "took batch(size=2, drop_last=False)"
    assert pf.indices(2) | Knows() == "took indices(2)"


# -- 4. the bench's reading -------------------------------------------------------------------
def test_the_bench_reading_tells_better_than_torch_from_short_of_a_goal() -> None:
    from benchmarks._harness import Row, table

    rows = [
        Row("fast", "samples/s", 30.0, 10.0, ">= 2x"),  # better than torch, goal met
        Row("close", "samples/s", 20.0, 10.0, ">= 3x"),  # better than torch, goal missed
        Row("start", "seconds", 2.0, 1.0, "<= 0.5x", higher_is_better=False),
    ]
    text = table(rows)
    lines = text.splitlines()
    assert "NOT" not in text and "beat" not in text and "missed:" not in text
    assert "not met" in lines[3] and "not met" in lines[4]
    assert lines[-2] == "goals: 1 of 3 met, 2 not met"
    assert lines[-1] == (
        "reading: better than torch in 2 of 3 rows; 2 rows short of their goal: 'close', 'start'"
    )


# -- 5. nothing logged after the program's output ---------------------------------------------
def test_a_pass_left_open_until_exit_logs_nothing_after_the_output() -> None:
    script = textwrap.dedent(
        """
        import gc
        import pipeflow as pf

        gc.disable()  # the cycle below lasts until the interpreter exits

        def load(i):
            if i in (2, 5):
                raise OSError(f"bad {i}")
            return i

        def epoch(stop):
            loader = pf.indices(12) | pf.map(load) | pf.ignore_errors()
            it = iter(loader)
            for _ in range(stop):
                next(it)
            try:  # a cycle keeps this frame, and the pass, until the interpreter exits
                raise ValueError
            except ValueError as e:
                kept = e
            return it

        it = epoch(3)  # dropped 1 item so far: closed below, logged then
        it.close()
        epoch(5)  # dropped 2 items; open at exit
        print("the program's last line", flush=True)
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=True,
    )
    assert "ignore_errors dropped 1 failed item in epoch 0" in done.stderr
    assert "dropped 2" not in done.stderr, done.stderr
