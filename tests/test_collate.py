"""default_collate / default_convert: every result is checked against torch's own functions."""

from __future__ import annotations

import enum
import importlib
import os
import subprocess
import sys
import types
from collections import Counter, OrderedDict, defaultdict, deque, namedtuple
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
import torch.utils.data
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import pipeflow as pf
from pipeflow.stages.collate import default_collate, default_convert

pf_collate = importlib.import_module(
    "pipeflow.stages._collate_torch"
)  # where default_collate lives

torch_collate = torch.utils.data.default_collate
torch_convert = torch.utils.data.default_convert


# --- comparing with torch --------------------------------------------------------------------


def assert_same(ours: Any, theirs: Any, path: str = "result") -> None:
    """Same structure, Python types, tensor dtypes, shapes and values (NaN equals NaN)."""
    assert type(ours) is type(theirs), f"{path}: {type(ours)!r} != {type(theirs)!r}"
    if isinstance(theirs, torch.Tensor):
        assert ours.dtype == theirs.dtype, f"{path}: {ours.dtype} != {theirs.dtype}"
        assert ours.shape == theirs.shape, f"{path}: {ours.shape} != {theirs.shape}"
        assert ours.layout == theirs.layout, path
        assert ours.is_contiguous() == theirs.is_contiguous(), path
        np.testing.assert_array_equal(ours.detach().numpy(), theirs.detach().numpy(), path)
    elif isinstance(theirs, np.ndarray):
        assert ours.dtype == theirs.dtype, path
        np.testing.assert_array_equal(ours, theirs, path)
    elif isinstance(theirs, Mapping):
        assert list(ours) == list(theirs), f"{path}: keys {list(ours)} != {list(theirs)}"
        for key in theirs:
            assert_same(ours[key], theirs[key], f"{path}[{key!r}]")
        if isinstance(theirs, defaultdict):
            assert ours.default_factory is theirs.default_factory, path
    elif isinstance(theirs, Sequence) and not isinstance(theirs, (str, bytes)):
        assert len(ours) == len(theirs), f"{path}: length {len(ours)} != {len(theirs)}"
        for i, (mine, other) in enumerate(zip(ours, theirs)):
            assert_same(mine, other, f"{path}[{i}]")
    elif isinstance(theirs, float) and theirs != theirs:  # NaN
        assert ours != ours, path
    else:
        assert ours == theirs, f"{path}: {ours!r} != {theirs!r}"


def outcome(function: Callable[[Any], Any], argument: Any) -> tuple[Any, BaseException | None]:
    try:
        return function(argument), None
    except Exception as error:  # the type is what gets compared
        return None, error


def assert_matches_torch(
    ours: Callable[[Any], Any], theirs: Callable[[Any], Any], data: Any
) -> None:
    """Both succeed with the same result, or both raise the same exception type."""
    expected, expected_error = outcome(theirs, data)
    result, error = outcome(ours, data)
    if expected_error is not None:
        assert error is not None, f"torch raised {expected_error!r}; we returned {result!r}"
        assert type(error) is type(expected_error), f"{error!r} != torch's {expected_error!r}"
    else:
        assert error is None, f"we raised {error!r}; torch returned {expected!r}"
        assert_same(result, expected)


# --- examples --------------------------------------------------------------------------------


Point = namedtuple("Point", ["x", "y"])


class Sample(NamedTuple):
    image: Any
    label: Any


class Color(enum.IntEnum):
    RED = 1
    GREEN = 2


class MyInt(int):
    pass


class MyFloat(float):
    pass


class MyArray(np.ndarray):
    pass


class FrozenMapping(Mapping[str, Any]):
    """A read-only mapping that can be built from a dict."""

    def __init__(self, data: Mapping[str, Any]) -> None:
        self._data = dict(data)

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


class PairMapping(FrozenMapping):
    """A mapping whose constructor takes two values, not a dict: torch falls back to a dict."""

    def __init__(self, a: Any, b: Any) -> None:
        super().__init__({"a": a, "b": b})


class Record(Sequence[Any]):
    """A read-only sequence that can be built from a list."""

    def __init__(self, items: Sequence[Any]) -> None:
        self._items = list(items)

    def __getitem__(self, index: Any) -> Any:
        return self._items[index]

    def __len__(self) -> int:
        return len(self._items)


def _arrays(dtype: Any, shape: tuple[int, ...] = (2, 3), n: int = 3) -> list[np.ndarray]:
    rng = np.random.default_rng(0)
    return [(rng.random(shape) * 10).astype(dtype) for _ in range(n)]


NUMERIC_DTYPES = [
    np.bool_,
    np.int8,
    np.int16,
    np.int32,
    np.int64,
    np.uint8,
    np.uint16,
    np.uint32,
    np.uint64,
    np.float16,
    np.float32,
    np.float64,
    np.complex64,
    np.complex128,
]
SCALAR_TYPES = [*NUMERIC_DTYPES, np.longdouble, np.clongdouble]

# Each is a function, so that every run gets fresh data.
COLLATE_EXAMPLES: dict[str, Callable[[], Any]] = {
    # Python numbers
    "ints": lambda: [0, 1, -5, 2**62],
    "bools": lambda: [True, False],
    "bool then int": lambda: [True, 2],
    "int then bool": lambda: [2, True],
    "int then float": lambda: [1, 2.5],
    "floats": lambda: [0.5, float("nan"), float("inf"), -0.0],
    "float then int": lambda: [0.5, 2],
    "int overflow": lambda: [1, 2**63],
    "int far overflow": lambda: [1, 2**80],
    "int enum": lambda: [Color.RED, Color.GREEN],
    "int subclass": lambda: [MyInt(1), MyInt(2)],
    "float subclass": lambda: [MyFloat(1.5), MyFloat(2.5)],
    "int then numpy int": lambda: [1, np.int32(2)],
    "int then string": lambda: [1, "a"],
    "int then None": lambda: [1, None],
    "float then numpy float32": lambda: [1.5, np.float32(2.5)],
    "complex": lambda: [1j, 2j],
    # NumPy scalars
    **{f"scalar {t.__name__}": (lambda t=t: [t(1), t(0), t(3)]) for t in SCALAR_TYPES},
    "numpy float64 then float": lambda: [np.float64(1.5), 2.5],
    "numpy scalars mixed": lambda: [np.float32(1), np.float64(2), np.int8(3)],
    "numpy int then float16": lambda: [np.int8(1), np.float16(2)],
    "numpy bool then int": lambda: [np.bool_(True), np.int64(3)],
    "numpy datetime": lambda: [np.datetime64("2020-01-01"), np.datetime64("2021-01-01")],
    "numpy timedelta": lambda: [np.timedelta64(1, "s"), np.timedelta64(2, "s")],
    "numpy void": lambda: [np.void(b"ab"), np.void(b"cd")],
    # NumPy arrays
    **{f"arrays {np.dtype(t).name}": (lambda t=t: _arrays(t)) for t in NUMERIC_DTYPES},
    "arrays 0-d": lambda: [np.array(1.5), np.array(2.5)],
    "arrays 0-d int": lambda: [np.array(1), np.array(2)],
    "arrays empty": lambda: [np.zeros((0,)), np.zeros((0,))],
    "arrays empty inner": lambda: [np.zeros((2, 0), np.int32), np.zeros((2, 0), np.int32)],
    "arrays one": lambda: _arrays(np.float32, n=1),
    "arrays non-contiguous": lambda: [a[:, ::2] for a in _arrays(np.float32, (4, 6))],
    "arrays fortran": lambda: [np.asfortranarray(a) for a in _arrays(np.float64, (3, 4))],
    "arrays read-only": lambda: [np.broadcast_to(np.arange(3.0), (2, 3)) for _ in range(2)],
    "arrays mixed dtypes": lambda: [np.zeros(3, np.float32), np.ones(3, np.float64)],
    "arrays int then float": lambda: [np.zeros(3, np.int64), np.ones(3, np.float32)],
    "arrays mixed shapes": lambda: [np.zeros(3), np.zeros(3), np.zeros(4)],
    "arrays mixed ndim": lambda: [np.zeros(3), np.zeros((3, 1))],
    "arrays mixed ndim 0-d": lambda: [np.array(1.0), np.zeros(1)],
    "arrays leading dim": lambda: [np.zeros((2, 3)), np.zeros((3, 2))],
    "arrays first dim, same total": lambda: [np.zeros((3, 2)), np.zeros((2, 2)), np.zeros((4, 2))],
    "array then list": lambda: [np.zeros(2), [1.0, 2.0]],
    "array then tensor": lambda: [np.zeros(2), torch.ones(2)],
    "array then tensor requiring grad": lambda: [
        np.zeros(2, np.float32),
        torch.ones(2, requires_grad=True),
    ],
    "array then scalar": lambda: [np.zeros(()), 1.0],
    "array subclass": lambda: [a.view(MyArray) for a in _arrays(np.float32)],
    "array then subclass": lambda: [np.zeros(2), np.ones(2).view(MyArray)],
    "masked arrays": lambda: [np.ma.array([1.0, 2.0], mask=[0, 1]) for _ in range(2)],
    "arrays big-endian": lambda: [np.zeros(3, ">f4"), np.ones(3, ">f4")],
    "arrays big-endian second": lambda: [np.zeros(3, "<f4"), np.ones(3, ">f4")],
    "arrays str": lambda: [np.array(["a"]), np.array(["b"])],
    "arrays bytes": lambda: [np.array([b"a"]), np.array([b"b"])],
    "arrays object": lambda: [np.array([None]), np.array([None])],
    "arrays float then object": lambda: [np.zeros(1), np.array([None])],
    "arrays longdouble": lambda: [np.zeros(2, np.longdouble), np.ones(2, np.longdouble)],
    "arrays datetime": lambda: [np.zeros(2, "M8[s]"), np.zeros(2, "M8[s]")],
    "arrays attosecond": lambda: [np.zeros(2, "m8[as]"), np.zeros(2, "m8[as]")],
    "arrays structured": lambda: [np.zeros(2, "i4,f4"), np.zeros(2, "i4,f4")],
    # tensors
    "tensors": lambda: [torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)],
    "tensors int": lambda: [torch.arange(3), torch.arange(3)],
    "tensors 0-d": lambda: [torch.tensor(1), torch.tensor(2)],
    "tensors non-contiguous": lambda: [torch.arange(12.0).reshape(3, 4).t() for _ in range(2)],
    "tensors mixed dtypes": lambda: [torch.zeros(2, dtype=torch.int64), torch.ones(2)],
    "tensors mixed shapes": lambda: [torch.zeros(3), torch.zeros(4)],
    "tensors requiring grad": lambda: [torch.ones(2, requires_grad=True) for _ in range(2)],
    "parameters": lambda: [torch.nn.Parameter(torch.ones(2)) for _ in range(2)],
    "tensor then array": lambda: [torch.zeros(2), np.ones(2)],
    "tensors sparse": lambda: [torch.eye(2).to_sparse() for _ in range(2)],
    "tensors nested": lambda: [
        torch.nested.nested_tensor([torch.zeros(2), torch.zeros(3)]) for _ in range(2)
    ],
    # strings
    "strings": lambda: ["a", "bc"],
    "bytes": lambda: [b"a", b"bc"],
    "numpy strings": lambda: [np.str_("a"), np.str_("b")],
    "numpy bytes": lambda: [np.bytes_(b"a"), np.bytes_(b"b")],
    "strings in a tuple batch": lambda: ("a", "b"),
    # mappings
    "dicts": lambda: [{"x": np.zeros(2), "y": 1, "z": "a"}, {"x": np.ones(2), "y": 2, "z": "b"}],
    "dicts nested": lambda: [{"a": {"b": [1, 2.0]}}, {"a": {"b": [3, 4.0]}}],
    "dicts missing key": lambda: [{"a": 1, "b": 2}, {"a": 1}],
    "dicts extra key": lambda: [{"a": 1}, {"a": 1, "b": 2}],
    "dicts reordered": lambda: [{"a": 1, "b": 2}, {"b": 3, "a": 4}],
    "dict empty": lambda: [{}, {}],
    "ordered dicts": lambda: [OrderedDict(b=1, a=2), OrderedDict(b=3, a=4)],
    "defaultdicts": lambda: [defaultdict(list, a=1), defaultdict(list, a=2)],
    "counters": lambda: [Counter(a=1), Counter(a=2)],
    "mapping proxies": lambda: [types.MappingProxyType({"a": 1}), types.MappingProxyType({"a": 2})],
    "frozen mappings": lambda: [FrozenMapping({"a": 1.0}), FrozenMapping({"a": 2.0})],
    "pair mappings": lambda: [PairMapping(1, "x"), PairMapping(2, "y")],
    # namedtuples and sequences
    "namedtuples": lambda: [Point(1, "a"), Point(2, "b")],
    "typed namedtuples": lambda: [Sample(np.zeros(2), 0), Sample(np.ones(2), 1)],
    "tuples": lambda: [(np.zeros(2, np.float32), 0), (np.ones(2, np.float32), 1)],
    "lists": lambda: [[1, 2.0, "a"], [3, 4.0, "b"]],
    "lists nested": lambda: [[[1, 2], [3]], [[4, 5], [6]]],
    "lists empty": lambda: [[], []],
    "lists unequal": lambda: [[1, 2], [3, 4], [5]],
    "tuples unequal": lambda: [(1, 2), (3,)],
    "tuple then list": lambda: [(1, 2), [3, 4]],
    "ranges": lambda: [range(3), range(3)],
    "deques": lambda: [deque([1, 2]), deque([3, 4])],
    "bytearrays": lambda: [bytearray(b"ab"), bytearray(b"cd")],
    "records": lambda: [Record([1, "a"]), Record([2, "b"])],
    "list of sets": lambda: [{1}, {2}],
    # not collatable
    "empty batch": list,
    "nones": lambda: [None, None],
    "objects": lambda: [object(), object()],
    "batch is a tuple": lambda: (1, 2),
}


@pytest.mark.filterwarnings("ignore:The given NumPy array is not writable")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors")
@pytest.mark.parametrize("make_batch", COLLATE_EXAMPLES.values(), ids=COLLATE_EXAMPLES.keys())
def test_default_collate_matches_torch(make_batch: Callable[[], Any]) -> None:
    assert_matches_torch(default_collate, torch_collate, make_batch())


CONVERT_EXAMPLES: dict[str, Callable[[], Any]] = {
    "int": lambda: 1,
    "float": lambda: 1.5,
    "string": lambda: "ab",
    "bytes": lambda: b"ab",
    "none": lambda: None,
    "tensor": lambda: torch.ones(2),
    **{f"scalar {t.__name__}": (lambda t=t: t(1)) for t in SCALAR_TYPES},
    **{f"array {np.dtype(t).name}": (lambda t=t: _arrays(t, n=1)[0]) for t in NUMERIC_DTYPES},
    "numpy str": lambda: np.str_("a"),
    "numpy bytes": lambda: np.bytes_(b"a"),
    "numpy datetime": lambda: np.datetime64("2020-01-01"),
    "array str": lambda: np.array(["a", "b"]),
    "array object": lambda: np.array([None, 1]),
    "array longdouble": lambda: np.zeros(2, np.longdouble),
    "array big-endian": lambda: np.zeros(2, ">f4"),
    "array non-contiguous": lambda: np.arange(10.0)[::2],
    "array subclass": lambda: np.zeros(2).view(MyArray),
    "array subclass str": lambda: np.array(["a"]).view(MyArray),
    "masked array": lambda: np.ma.array([1.0, 2.0], mask=[0, 1]),
    "dict": lambda: {"a": np.zeros(2), "b": [np.int64(1), "s"], "c": (np.float32(1),)},
    "ordered dict": lambda: OrderedDict(b=np.zeros(1), a=1),
    "defaultdict": lambda: defaultdict(int, a=np.ones(1)),
    "mapping proxy": lambda: types.MappingProxyType({"a": np.ones(1)}),
    "frozen mapping": lambda: FrozenMapping({"a": np.ones(1)}),
    "pair mapping": lambda: PairMapping(np.ones(1), 2),
    "namedtuple": lambda: Point(np.array(0), np.array([1, 2])),
    "tuple": lambda: (np.zeros(2), 1, "a"),
    "list": lambda: [np.zeros(2), [np.ones(1)], ()],
    "range": lambda: range(3),
    "deque": lambda: deque([np.zeros(1), 1]),
    "bytearray": lambda: bytearray(b"ab"),
    "record": lambda: Record([np.zeros(1), "a"]),
    "set": lambda: {1, 2},
    "object": lambda: object(),
}


@pytest.mark.parametrize("make_data", CONVERT_EXAMPLES.values(), ids=CONVERT_EXAMPLES.keys())
def test_default_convert_matches_torch(make_data: Callable[[], Any]) -> None:
    assert_matches_torch(default_convert, torch_convert, make_data())


def test_default_convert_shares_memory_like_torch() -> None:
    array = np.zeros(3, np.float32)
    default_convert(array)[0] = 1.0
    assert array[0] == 1.0


# --- generated batches -----------------------------------------------------------------------

COLLATABLE_SCALAR_TYPES = [t for t in NUMERIC_DTYPES if t is not np.uint64]  # torch refuses
NAMEDTUPLES = {n: namedtuple(f"Fields{n}", [f"f{i}" for i in range(n)]) for n in (1, 2, 3)}

shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=3)
leaf_schemas = st.one_of(
    st.tuples(st.just("array"), st.sampled_from(NUMERIC_DTYPES), shapes),
    st.tuples(st.just("tensor"), st.sampled_from(NUMERIC_DTYPES), shapes),
    st.tuples(st.just("numpy scalar"), st.sampled_from(COLLATABLE_SCALAR_TYPES)),
    st.sampled_from([("int",), ("float",), ("bool",), ("str",), ("bytes",)]),
)
schemas = st.recursive(
    leaf_schemas,
    lambda children: st.one_of(
        st.dictionaries(st.sampled_from("abcd"), children, max_size=3).map(lambda d: ("dict", d)),
        st.lists(children, min_size=1, max_size=3).map(lambda c: ("namedtuple", c)),
        st.lists(children, max_size=3).map(lambda c: ("tuple", c)),
        st.lists(children, max_size=3).map(lambda c: ("list", c)),
    ),
    max_leaves=6,
)


def samples(schema: tuple[Any, ...]) -> st.SearchStrategy[Any]:
    """Samples that all have the structure *schema* describes."""
    kind = schema[0]
    if kind == "array":
        return hnp.arrays(schema[1], schema[2])
    if kind == "tensor":
        return hnp.arrays(schema[1], schema[2]).map(torch.from_numpy)
    if kind == "numpy scalar":
        return hnp.from_dtype(np.dtype(schema[1])).map(schema[1])
    if kind == "dict":
        return st.fixed_dictionaries({key: samples(child) for key, child in schema[1].items()})
    if kind in ("namedtuple", "tuple", "list"):
        children = st.tuples(*(samples(child) for child in schema[1]))
        if kind == "namedtuple":
            return children.map(lambda values: NAMEDTUPLES[len(values)](*values))
        return children if kind == "tuple" else children.map(list)
    return {
        "int": st.integers(-(2**63), 2**63 - 1),
        "float": st.floats(),
        "bool": st.booleans(),
        "str": st.text(max_size=3),
        "bytes": st.binary(max_size=3),
    }[kind]


batches = schemas.flatmap(lambda schema: st.lists(samples(schema), min_size=1, max_size=5))
numpy_scalars = st.sampled_from(SCALAR_TYPES).flatmap(
    lambda t: st.integers(0, 100).map(lambda v: t(v) if t is not np.bool_ else t(v % 2))
)
loose_scalars = st.one_of(
    st.integers(-(2**70), 2**70), st.floats(), st.booleans(), numpy_scalars, st.just("s")
)


@settings(deadline=None, max_examples=150)
@given(batches)
def test_generated_batches_collate_like_torch(batch: list[Any]) -> None:
    assert_same(default_collate(batch), torch_collate(batch))


@settings(deadline=None, max_examples=100)
@given(schemas.flatmap(samples))
def test_generated_samples_convert_like_torch(sample: Any) -> None:
    assert_same(default_convert(sample), torch_convert(sample))


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@settings(deadline=None, max_examples=150)
@given(st.lists(loose_scalars, min_size=1, max_size=6))
def test_mixed_scalars_collate_like_torch(batch: list[Any]) -> None:
    # Exercises the checks that guard the NumPy shortcuts for numbers.
    assert_matches_torch(default_collate, torch_collate, batch)


@settings(deadline=None, max_examples=100)
@given(
    st.lists(
        st.tuples(
            st.sampled_from([np.float32, np.float64, np.int64]), st.sampled_from([(2,), (3,), (4,)])
        ).flatmap(lambda ds: hnp.arrays(*ds)),
        min_size=1,
        max_size=4,
    )
)
def test_mixed_arrays_collate_like_torch(batch: list[np.ndarray]) -> None:
    assert_matches_torch(default_collate, torch_collate, batch)


# --- errors ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("batch", "message"),
    [
        (
            [torch.zeros(3), torch.zeros(3), torch.zeros(4)],
            "default_collate: cannot stack items of different shapes: "
            "item 0 has shape (3,), item 2 has shape (4,)",
        ),
        (
            [np.zeros(3), np.zeros(3), np.zeros(4)],
            "default_collate: cannot stack items of different shapes: "
            "item 0 has shape (3,), item 2 has shape (4,)",
        ),
        (
            [np.zeros((2, 3), np.float32), np.zeros((2, 3), np.float32), np.zeros((3, 2))],
            "item 0 has shape (2, 3), item 2 has shape (3, 2)",
        ),
        ([np.array(1.0), np.zeros(1)], "item 0 has shape (), item 1 has shape (1,)"),
        (
            [{"x": torch.zeros(2, 2)}, {"x": torch.zeros(2, 2)}, {"x": torch.zeros(2, 3)}],
            "item 0 has shape (2, 2), item 2 has shape (2, 3)",
        ),
    ],
)
def test_shape_mismatch_names_items_and_shapes(batch: list[Any], message: str) -> None:
    with pytest.raises(RuntimeError) as torch_error:
        torch_collate(batch)
    with pytest.raises(RuntimeError) as error:
        default_collate(batch)
    assert type(error.value) is type(torch_error.value)
    assert message in str(error.value)


def test_shape_mismatch_counts_the_items_that_differ() -> None:
    with pytest.raises(RuntimeError, match=r"item 1 has shape \(4,\) \(2 of 3 items differ"):
        default_collate([np.zeros(3), np.zeros(4), np.zeros(5)])


def test_shape_mismatch_in_a_worker_names_items() -> None:
    batch = [torch.zeros(3), torch.zeros(4)]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(pf_collate, "_in_worker", lambda: True)
        with pytest.raises(RuntimeError, match=r"item 1 has shape \(4,\)"):
            default_collate(batch)


def test_unequal_lengths_keep_torchs_message_and_add_positions() -> None:
    with pytest.raises(RuntimeError, match="each element in list of batch should be of equal size"):
        torch_collate([[1, 2], [3, 4], [5]])
    with pytest.raises(
        RuntimeError,
        match=r"^each element in list of batch should be of equal size "
        r"\(item 0 has length 2, item 2 has length 1\)$",
    ):
        default_collate([[1, 2], [3, 4], [5]])


@pytest.mark.parametrize(
    "batch",
    [[object()], [None], [np.array(["a"])], [np.array([None])]],
    ids=["object", "None", "str array", "object array"],
)
def test_unsupported_type_message_is_torchs(batch: list[Any]) -> None:
    with pytest.raises(TypeError) as torch_error:
        torch_collate(batch)
    with pytest.raises(TypeError) as error:
        default_collate(batch)
    assert str(error.value) == str(torch_error.value)


# --- deliberate differences and fast paths ---------------------------------------------------


def test_negative_strides_are_accepted_where_torch_raises() -> None:
    # torch cannot view such arrays (ValueError); joining them in NumPy copies them anyway.
    batch = [np.arange(3.0)[::-1], np.arange(3.0)[::-1]]
    with pytest.raises(ValueError, match="negative"):
        torch_collate(batch)
    assert_same(default_collate(batch), torch_collate([a.copy() for a in batch]))


def test_array_batches_are_joined_without_a_tensor_per_item(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    def fail(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("converted an item on its own")

    batch = [(np.ones((3, 4), np.float32), np.int64(1), 2, 0.5) for _ in range(4)]
    expected = torch_collate(batch)
    monkeypatch.setattr(torch, "as_tensor", fail)
    monkeypatch.setattr(torch, "tensor", fail)
    assert_same(default_collate(batch), expected)


# --- worker processes ------------------------------------------------------------------------

WORKER_EXAMPLES: dict[str, Callable[[], Any]] = {
    "tensors": lambda: [torch.arange(6.0).reshape(2, 3), torch.ones(2, 3)],
    "arrays": lambda: _arrays(np.float32, (2, 3), n=4),
    "arrays 0-d": lambda: [np.array(1.5), np.array(2.5)],
    "arrays empty": lambda: [np.zeros((2, 0), np.int16), np.zeros((2, 0), np.int16)],
    "arrays mixed dtypes": lambda: [np.zeros(3, np.float32), np.ones(3, np.float32), np.ones(3)],
    "arrays big-endian": lambda: [np.zeros(3, ">f4"), np.ones(3, ">f4")],
    "tuples": lambda: [(np.ones(2, np.uint8), 1) for _ in range(3)],
}


@pytest.mark.parametrize("make_batch", WORKER_EXAMPLES.values(), ids=WORKER_EXAMPLES.keys())
def test_in_a_worker_batches_go_to_shared_memory_like_torch(
    make_batch: Callable[[], Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Both torch's collate and `_in_worker` ask `torch.utils.data.get_worker_info()`.
    monkeypatch.setattr(torch.utils.data, "get_worker_info", lambda: object())
    monkeypatch.setattr(pf_collate, "_TORCH_WORKER", [-1, False])  # forget the cached answer
    assert pf_collate._in_worker()
    assert_matches_torch(default_collate, torch_collate, make_batch())
    theirs, error = outcome(torch_collate, make_batch())
    if error is None:
        shared = [t.is_shared() for t in tensors_in(theirs)]
        assert [t.is_shared() for t in tensors_in(default_collate(make_batch()))] == shared


def tensors_in(data: Any) -> list[torch.Tensor]:
    if isinstance(data, torch.Tensor):
        return [data]
    if isinstance(data, Sequence) and not isinstance(data, (str, bytes)):
        return [t for item in data for t in tensors_in(item)]
    return []


def test_in_worker_hook_can_be_replaced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(pf_collate, "_in_worker", lambda: True)
    assert default_collate(_arrays(np.float64)).is_shared()
    assert default_collate([torch.ones(2), torch.ones(2)]).is_shared()
    monkeypatch.setattr(pf_collate, "_in_worker", lambda: False)
    assert not default_collate(_arrays(np.float64)).is_shared()


class _Pairs(torch.utils.data.Dataset[Any]):
    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> Any:
        return {"x": np.full((2, 3), index, np.float32), "y": index, "name": str(index)}


def test_in_a_dataloader_worker_process() -> None:
    def batches(collate_fn: Callable[[Any], Any]) -> list[Any]:
        loader = torch.utils.data.DataLoader(
            _Pairs(), batch_size=3, num_workers=1, collate_fn=collate_fn
        )
        return list(loader)

    assert_same(batches(default_collate), batches(torch_collate))


# --- import ----------------------------------------------------------------------------------


@pytest.mark.slow
def test_import_does_not_import_torch() -> None:
    root = Path(pf_collate.__file__).parents[1]
    code = (
        "import sys, pipeflow.stages.collate\n"
        "assert 'torch' not in sys.modules, sorted(m for m in sys.modules if 'torch' in m)\n"
    )
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert result.returncode == 0, result.stderr


def test_collate_failure_names_the_fetched_sample_indices() -> None:
    ragged = [[0.0, 1.0], [2.0, 3.0], [4.0], [5.0, 6.0]]
    np = pytest.importorskip("numpy")
    arrays = [np.array(r) for r in ragged]
    loader = pf.indices(4) | pf.batch(2) | pf.fetch(arrays) | pf.collate()
    with pytest.raises(
        RuntimeError, match=r"item 0 has shape \(1,\), item 1 has shape \(2,\)"
    ) as info:
        list(loader)
    assert info.value.__notes__ == [
        "pipeflow: stage 'collate' failed on the batch of sample indices [2, 3] (epoch 0)"
    ]
