"""engine/_decorate.py: ``@pf.stage`` — factories from generator functions, checked arguments, the epoch."""

from __future__ import annotations

import pytest

import pipeflow as pf
from tests.example_stages import add_noise, with_epoch


def test_stage_decorator_builds_validated_stage_factories() -> None:
    s = add_noise(scale=0.5)
    assert repr(s) == "add_noise(scale=0.5)"
    assert list(pf.from_iterable([1.0, 2.0]) | s) == [1.5, 2.5]
    assert len(pf.indices(4) | s) == 4
    with pytest.raises(TypeError, match="unexpected keyword argument 'sclae'"):
        add_noise(sclae=1)
    with pytest.raises(TypeError):
        add_noise(1, 2)


def test_stage_receives_the_epoch() -> None:
    loader = pf.indices(2) | with_epoch()
    loader.set_epoch(5)
    assert list(loader) == [(5, 0), (5, 1)]
    assert list(loader) == [(6, 0), (6, 1)]
    with pytest.raises(TypeError, match="supplied by the loader"):
        with_epoch(epoch=3)


def test_stage_that_is_not_a_generator_is_reported() -> None:
    @pf.stage
    def broken(items):
        return 3

    with pytest.raises(TypeError, match="must return an iterator"):
        iter(pf.indices(2) | broken())


def test_stage_decorator_leaves_the_function_alone() -> None:
    def plain(items):
        yield from items

    before = (plain.__name__, plain.__qualname__)
    factory = pf.stage(plain)
    assert (plain.__name__, plain.__qualname__) == before
    assert factory.__wrapped__ is plain


def test_stage_decorator_rejects_bad_functions() -> None:
    with pytest.raises(TypeError):
        pf.stage(3)  # type: ignore[call-overload]

    def no_args():
        yield 1

    with pytest.raises(TypeError, match="first positional parameter"):
        pf.stage(no_args)
