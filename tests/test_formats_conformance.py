"""The readers against the formats' own parsers: Parquet row for row against pyarrow's
``pq.read_table``, JSON lines line for line against ``json.loads``; with the edge cases each
format has (row groups, nulls, nested columns, a misspelt column, schemas that drift from
file to file; blank lines, ``\\r\\n``, bad and cut lines, a byte order mark), and an exact
resume from every save point."""

from __future__ import annotations

import json
import os
import re
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf

POSITION = ("__key__", "__url__", "__index__")

Make = Callable[[], Any]


def _drain(it: Iterator[Any], limit: int | None = None) -> list[Any]:
    """What a pass gives, failures in their place: ``("ok", sample)`` or ``("error", exc)``;
    at most *limit* items."""
    out: list[Any] = []
    while limit is None or len(out) < limit:
        try:
            out.append(("ok", next(it)))
        except StopIteration:
            break
        except Exception as e:  # a failure in its place: the pass goes on
            out.append(("error", e))
    return out


def _resumed(make: Make, k: int) -> tuple[list[Any], list[Any]]:
    """The first *k* items of a pass, and the rest from a fresh loader given the state after
    them (through JSON, as a checkpoint stores it)."""
    loader = make()
    head = _drain(iter(loader), k)
    state = json.loads(json.dumps(loader.state_dict()))
    fresh = make()
    fresh.load_state_dict(state)
    return head, _drain(iter(fresh))


# -- Parquet ------------------------------------------------------------------------------------
pa = pytest.importorskip("pyarrow")
pq = pytest.importorskip("pyarrow.parquet")


def _table(n: int, seed: int) -> Any:
    """*n* rows with every kind of column a reader must carry: nulls in each, a string, a
    binary, a list, a struct, a list of structs."""

    def some(i: int, value: Any) -> Any:
        return None if (i * 7 + seed) % 5 == 0 else value

    return pa.table(
        {
            "i": pa.array([some(i, i * 10 + seed) for i in range(n)], pa.int64()),
            "f": pa.array([some(i + 1, i / 4) for i in range(n)], pa.float64()),
            "s": pa.array([some(i + 2, f"row {i} é") for i in range(n)], pa.string()),
            "b": pa.array([some(i + 3, bytes([i % 256, 0, 255])) for i in range(n)], pa.binary()),
            "l": pa.array(
                [some(i + 4, list(range(i % 4))) for i in range(n)], pa.list_(pa.int32())
            ),
            "st": pa.array(
                [some(i, {"a": i, "b": some(i + 1, str(i))}) for i in range(n)],
                pa.struct([("a", pa.int64()), ("b", pa.string())]),
            ),
            "ls": pa.array(
                [some(i + 1, [{"x": j} for j in range(i % 3)]) for i in range(n)],
                pa.list_(pa.struct([("x", pa.int16())])),
            ),
        }
    )


@pytest.fixture(scope="module")
def parquet_files() -> Iterator[list[str]]:
    """Three files of 10, 1 and 7 rows, in row groups of 3 (the last one shorter)."""
    with tempfile.TemporaryDirectory() as folder:
        paths = []
        for k, n in enumerate([10, 1, 7]):
            path = os.path.join(folder, f"part-{k}.parquet")
            pq.write_table(_table(n, k), path, row_group_size=3)
            paths.append(path)
        yield paths


def _expected(paths: list[str], columns: list[str] | None = None) -> list[dict[str, Any]]:
    """pyarrow's rows of each file in turn, with the position pipeflow adds."""
    return [
        {"__key__": str(i), "__url__": path, "__index__": i, **row}
        for path in paths
        for i, row in enumerate(pq.read_table(path, columns=columns).to_pylist())
    ]


def _rows(make: Make) -> list[Any]:
    return [s for _, s in _drain(iter(make()))]


def test_parquet_rows_are_pyarrows_row_for_row(parquet_files: list[str]) -> None:
    assert pq.ParquetFile(parquet_files[0]).metadata.num_row_groups == 4
    rows = _rows(lambda: pf.shards(parquet_files, shuffle=False) | pf.read_parquet())
    assert rows == _expected(parquet_files)
    assert [list(r)[:3] for r in rows] == [list(POSITION)] * len(rows)


@pytest.mark.parametrize("columns", [["i"], ["s", "b"], ["ls", "st", "f"], ["l"], []])
def test_parquet_column_subsets_are_pyarrows(parquet_files: list[str], columns: list[str]) -> None:
    rows = _rows(lambda: pf.shards(parquet_files, shuffle=False) | pf.read_parquet(columns=columns))
    assert rows == _expected(parquet_files, columns)


def test_parquet_a_nested_field_is_read_as_pyarrows_file_reader_reads_it(
    parquet_files: list[str],
) -> None:
    path = parquet_files[0]
    rows = _rows(lambda: pf.shards([path]) | pf.read_parquet(columns=["st.a"]))
    assert [r["st"] for r in rows] == [
        r["st"] for r in pq.ParquetFile(path).read(columns=["st.a"]).to_pylist()
    ]


@pytest.mark.parametrize("columns", [None, ["st", "s"]])
def test_parquet_resumes_exactly_from_every_save_point(
    parquet_files: list[str], columns: list[str] | None
) -> None:
    def make() -> Any:
        return pf.shards(parquet_files, shuffle=False) | pf.read_parquet(columns=columns)

    full = _expected(parquet_files, columns)
    for k in range(len(full) + 1):  # inside a row group, at its end, at a file's end
        head, rest = _resumed(make, k)
        assert [s for _, s in head + rest] == full, k


@pytest.mark.parametrize("prefetch", [0, 2])
def test_parquet_a_resume_reads_the_row_group_of_its_next_row_and_none_before(
    tmp_path: Any, monkeypatch: Any, prefetch: int
) -> None:
    path = str(tmp_path / "big.parquet")
    pq.write_table(pa.table({"x": list(range(100))}), path, row_group_size=10)
    read: list[int] = []
    row_group = pq.ParquetFile.read_row_group

    def spy(self: Any, group: int, *args: Any, **kwargs: Any) -> Any:
        read.append(group)
        return row_group(self, group, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetFile, "read_row_group", spy)
    for k, groups in [(75, [7, 8, 9]), (80, [8, 9]), (99, [9]), (100, [])]:
        loader = pf.shards([path]) | pf.read_parquet(prefetch=prefetch)
        it = iter(loader)
        head = [next(it)["x"] for _ in range(k)]
        state = json.loads(json.dumps(loader.state_dict()))
        read.clear()
        fresh = pf.shards([path]) | pf.read_parquet(prefetch=prefetch)
        fresh.load_state_dict(state)
        assert head + [s["x"] for s in fresh] == list(range(100))
        assert read == groups, (k, read)


def test_a_missing_column_is_an_error_naming_it_the_file_and_its_columns(
    parquet_files: list[str],
) -> None:
    loader = pf.shards(parquet_files[:2], shuffle=False) | pf.read_parquet(columns=["labl", "s"])
    out = _drain(iter(loader))
    assert [kind for kind, _ in out] == ["error", "error"]  # one per shard, in its place
    for path, (_, error) in zip(parquet_files, out):
        assert isinstance(error, pf.ShardReadError)
        message = str(error)
        assert "no column 'labl'" in message and repr(path) in message
        assert "'i', 'f', 's', 'b', 'l', 'st', 'ls'" in message  # what the file has
    nested = pf.shards(parquet_files[:1]) | pf.read_parquet(columns=["st.zz", "st.a"])
    ((_, error),) = _drain(iter(nested))
    assert "no column 'st.zz'" in str(error)


def _write(path: str, columns: dict[str, Any]) -> str:
    pq.write_table(pa.table(columns), path)
    return path


@pytest.fixture
def drifting(tmp_path: Any) -> list[str]:
    """Four files: the first two alike, then a type changed, then a column added and one
    missing."""
    d = str(tmp_path)
    return [
        _write(f"{d}/a.parquet", {"x": pa.array([1, 2]), "y": pa.array(["p", "q"])}),
        _write(f"{d}/b.parquet", {"x": pa.array([3]), "y": pa.array(["r"])}),
        _write(f"{d}/c.parquet", {"x": pa.array(["4"]), "y": pa.array(["s"])}),
        _write(f"{d}/d.parquet", {"x": pa.array([5]), "z": pa.array([0.5])}),
    ]


def test_schema_drift_is_an_error_naming_the_file_and_the_difference(drifting: list[str]) -> None:
    a, _, c, d = drifting
    out = _drain(iter(pf.shards(drifting, shuffle=False) | pf.read_parquet()))
    assert [s["x"] for kind, s in out if kind == "ok"] == [1, 2, 3]
    errors = [e for kind, e in out if kind == "error"]
    assert len(errors) == 2 and all(isinstance(e, pf.ShardReadError) for e in errors)
    assert repr(c) in str(errors[0]) and f"'x': string here, int64 in {a!r}" in str(errors[0])
    assert repr(d) in str(errors[1])
    assert "column 'z' added" in str(errors[1]) and "column 'y' missing" in str(errors[1])
    # the selected columns only: c's x still differs, d has x as a's
    selected = _drain(iter(pf.shards(drifting, shuffle=False) | pf.read_parquet(columns=["x"])))
    assert [kind for kind, _ in selected] == ["ok", "ok", "ok", "error", "ok"]


def test_a_resumed_pass_takes_the_first_file_it_reads_as_the_schema(drifting: list[str]) -> None:
    """The documented rule: a state does not carry the schema, so a pass resumed after the
    first file has that file's successor as its first, and holds the rest to it."""
    a, _, c, _ = drifting
    e = _write(c.replace("c.parquet", "e.parquet"), {"x": pa.array(["5"]), "y": pa.array(["t"])})

    def make() -> Any:
        return pf.shards([a, c, e], shuffle=False) | pf.read_parquet()

    assert [kind for kind, _ in _drain(iter(make()))] == ["ok", "ok", "error", "error"]
    head, rest = _resumed(make, 2)  # in a (its end not seen yet): a is read again, first
    assert [kind for kind, _ in head + rest] == ["ok", "ok", "error", "error"]
    head, rest = _resumed(make, 3)  # c done: the resumed pass starts with e
    assert [(kind, s["x"]) for kind, s in rest] == [("ok", "5")]
    head, rest = _resumed(lambda: pf.shards([a, e, c], shuffle=False) | pf.read_parquet(), 3)
    assert [kind for kind, _ in rest] == ["ok"]  # e's failure before; c now first, alike


def test_each_pass_takes_its_own_first_file_as_the_schema(drifting: list[str]) -> None:
    a, _, c, _ = drifting
    loader = pf.shards([a, c], seed=1) | pf.read_parquet()
    firsts = set()
    for epoch in range(8):  # the order changes with the epoch
        loader.set_epoch(epoch)
        out = _drain(iter(loader))
        kinds = [kind for kind, _ in out]
        assert kinds in (["ok", "ok", "error"], ["ok", "error"]), (epoch, kinds)
        firsts.add(out[0][1]["__url__"])
    assert firsts == {a, c}


def test_a_null_column_matches_any_type_and_the_first_typed_one_fixes_it(tmp_path: Any) -> None:
    d = str(tmp_path)
    paths = [
        _write(f"{d}/0.parquet", {"n": pa.array([None, None])}),  # a writer's guess: null
        _write(f"{d}/1.parquet", {"n": pa.array([1, None])}),
        _write(f"{d}/2.parquet", {"n": pa.array([None], pa.null())}),
        _write(f"{d}/3.parquet", {"n": pa.array(["s"])}),
    ]
    out = _drain(iter(pf.shards(paths, shuffle=False) | pf.read_parquet()))
    assert [s["n"] for kind, s in out if kind == "ok"] == [None, None, 1, None, None]
    ((_, error),) = out[5:]
    assert f"'n': string here, int64 in {paths[1]!r}" in str(error)


# -- JSON lines ---------------------------------------------------------------------------------
BOM = b"\xef\xbb\xbf"


def _oracle(data: bytes) -> list[tuple[str, Any]]:
    """What a pass must give, from ``json.loads`` of each line: ``("ok", value)`` or
    ``("error", (line number, its byte))`` per non-blank line."""
    out: list[tuple[str, Any]] = []
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()  # no line after the last newline
    at = 0
    for number, raw in enumerate(lines, 1):
        line = raw[:-1] if raw.endswith(b"\r") else raw  # a \r\n end (a last \r: blank)
        line = line[len(BOM) :] if line.startswith(BOM) else line
        if line.strip(b" \t\r"):
            try:
                out.append(("ok", json.loads(line.decode("utf-8"))))
            except ValueError:
                out.append(("error", (number, at)))
        at += len(raw) + 1
    return out


def _seen(out: list[Any], path: str) -> list[tuple[str, Any]]:
    """A pass's items in the oracle's form; a failure's note must name its shard and byte
    (and its line, unless the pass seeked into the shard)."""
    seen: list[tuple[str, Any]] = []
    for kind, item in out:
        if kind == "ok":
            assert item["__url__"] == path
            seen.append(("ok", item["json"]))
            continue
        assert isinstance(item, ValueError), item
        (note,) = [n for n in getattr(item, "__notes__", ()) if "is not JSON" in n]
        assert f"of shard {path!r}" in note, note
        m = re.search(r"pipeflow: (?:line (\d+) \(byte (\d+)\)|the line at byte (\d+))", note)
        assert m is not None, note
        line = int(m.group(1)) if m.group(1) else None
        seen.append(("error", (line, int(m.group(2) or m.group(3)))))
    return seen


def _jsonl(folder: str, data: bytes) -> tuple[str, Make]:
    path = os.path.join(folder, "rows.jsonl")
    with open(path, "wb") as f:
        f.write(data)
    return path, lambda: pf.shards([path], shuffle=False) | pf.read_jsonl()


def _check_jsonl(folder: str, data: bytes) -> None:
    """One pass equals the oracle; so does a resume from every save point (a failure read
    after a seek names its byte, not its line)."""
    path, make = _jsonl(folder, data)
    expected = _oracle(data)
    full = _drain(iter(make()))
    assert _seen(full, path) == expected
    assert [s["__index__"] for kind, s in full if kind == "ok"] == [
        i for i, (kind, _) in enumerate(expected) if kind == "ok"
    ]
    for k in range(len(full) + 1):
        head, rest = _resumed(make, k)
        got = _seen(head, path) + _seen(rest, path)
        unnumbered = [
            (kind, (None, x[1]) if kind == "error" and i >= k else x)
            for i, (kind, x) in enumerate(expected)
        ]
        assert got in (expected, unnumbered), k


CASES = {
    "blank lines": b'\n{"a": 1}\n\n  \n\t\n[2]\n\n',
    "crlf": b'{"a": 1}\r\n\r\n"two"\r\n3\r\n',
    "a bad line": b'{"a": 1}\n\n{not json\n[3]\n',
    "a cut last line": b'{"a": 1}\n{"b": [1, 2',
    "a last line without newline": b'{"a": 1}\r\n\r\n{"b": 2}',
    "a bom": BOM + b'{"a": 1}\n2\n',
    "a bom on a blank first line": BOM + b"\r\n2\n",
    "bad utf-8": b'"\xff"\n2\n',
    "a raw nul": b"1\x00\n2\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_jsonl_is_json_loads_of_each_non_blank_line(tmp_path: Any, name: str) -> None:
    _check_jsonl(str(tmp_path), CASES[name])


def test_jsonl_a_bad_line_is_named_by_its_line_number_counting_blank_lines(tmp_path: Any) -> None:
    path, make = _jsonl(str(tmp_path), b"1\r\n\r\n\n2\r\n  \n{bad\n3")
    out = _drain(iter(make()))
    assert [kind for kind, _ in out] == ["ok", "ok", "error", "ok"]
    assert f"pipeflow: line 6 (byte 12) of shard {path!r} is not JSON" in out[2][1].__notes__
    assert [s["__index__"] for kind, s in out if kind == "ok"] == [0, 1, 3]


def test_jsonl_a_byte_order_mark_is_dropped_from_the_value_and_the_bytes(tmp_path: Any) -> None:
    path, _ = _jsonl(str(tmp_path), BOM + b'{"a": 1}\r\n2\n')
    raw = [s["json"] for s in pf.shards([path]) | pf.read_jsonl(decode=False)]
    assert raw == [b'{"a": 1}', b"2"]  # the line's bytes, without its end or the mark


def test_jsonl_a_resume_seeks_past_crlf_and_blank_lines(tmp_path: Any) -> None:
    _, make = _jsonl(str(tmp_path), b"1\r\n\r\n\n2\r\n\r\n3\r\n")
    loader = make()
    it = iter(loader)
    assert [next(it)["json"] for _ in range(2)] == [1, 2]
    ((_, record),) = loader.state_dict()["stages"].items()
    assert (record["start"], record["offset"]) == (2, 9)  # after "2\r\n": nothing re-read
    fresh = make()
    fresh.load_state_dict(loader.state_dict())
    assert [s["json"] for s in fresh] == [3]


def _lines() -> st.SearchStrategy[bytes]:
    values = st.recursive(
        st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
        lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner),
        max_leaves=4,
    )
    good = st.builds(lambda v, a: json.dumps(v, ensure_ascii=a).encode(), values, st.booleans())
    blank = st.sampled_from([b"", b" ", b"\t", b" \t "])
    bad = st.sampled_from([b"{", b"nope", b"[1,", b'{"a": 1', b"1\r2", b'"\xff"'])
    line = st.tuples(st.one_of(good, good, blank, bad), st.sampled_from([b"\n", b"\r\n"]))
    return st.builds(
        lambda bom, lines, last: (BOM if bom else b"") + b"".join(a + b for a, b in lines) + last,
        st.booleans(),
        st.lists(line, max_size=12),
        st.one_of(st.just(b""), good, bad),  # a last line without its newline, or none
    )


@settings(max_examples=40, deadline=None)
@given(_lines())
def test_jsonl_property_every_good_line_once_in_order_a_failure_per_bad_one_and_exact_resume(
    data: bytes,
) -> None:
    with tempfile.TemporaryDirectory() as folder:
        _check_jsonl(folder, data)
