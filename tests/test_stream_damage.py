"""A damaged tar shard: one ShardReadError that names it, after every sample complete before
the damage, and the pass goes on with the next shard; an exact resume from every state, with
pax and GNU long and non-ASCII names.

The property writes 2 to 4 shards in a random tar format and damages one of them (garbage in
a header block, a cut at any byte, the end-of-archive blocks dropped) or none; the layout it
wrote (:func:`tests._tar_writers.layout`) says which samples lie whole before the damage.
Garbage goes in header blocks only: in a file's data it would be a changed file, which no
reader can see.
"""

from __future__ import annotations

import json
import os
import tarfile
import tempfile
from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pipeflow as pf
from tests._tar_writers import Span, drain, layout, pipeflow_items, write_tarfile

#: A shard as written: its samples, ``(key, [(extension, data), ...])``.
Samples = list[tuple[str, list[tuple[str, bytes]]]]


# -- shards -----------------------------------------------------------------------------------
@st.composite
def _keys(draw: st.DrawFn, fmt: str, shard: int, i: int) -> str:
    """A sample's key: short, non-ASCII, over 100 bytes (ustar only with a '/' to split at)."""
    styles = ["plain", "accent", "cjk", "long dir"] + (["long"] if fmt != "ustar" else [])
    style = draw(st.sampled_from(styles))
    tail = f"{shard}-{i}"
    return {
        "plain": f"s{tail}",
        "accent": f"café-{tail}",
        "cjk": f"名前-{tail}",
        "long dir": "d" * 70 + "/" + "名" * 20 + tail,
        "long": "k" * 110 + tail,
    }[style]


@st.composite
def _shard_sets(draw: st.DrawFn, formats: Sequence[str]) -> tuple[str, list[Samples]]:
    fmt = draw(st.sampled_from(formats))
    shards = []
    for k in range(draw(st.integers(2, 4))):
        samples: Samples = []
        for i in range(draw(st.integers(0, 4))):
            exts = draw(
                st.lists(
                    st.sampled_from(["txt", "cls", "seg.png"]), min_size=1, max_size=3, unique=True
                )
            )
            files = [(e, draw(st.binary(max_size=700))) for e in exts]
            samples.append((draw(_keys(fmt, k, i)), files))
        shards.append(samples)
    return fmt, shards


def _write(folder: str, fmt: str, shards: list[Samples]) -> list[str]:
    paths = []
    for k, samples in enumerate(shards):
        path = os.path.join(folder, f"shard-{k}.tar")
        write_tarfile(path, [(f"{key}.{e}", d) for key, files in samples for e, d in files], fmt)
        paths.append(path)
    return paths


# -- damage -------------------------------------------------------------------------------------
#: Where garbage goes in a header block: not the name and prefix (a damaged name read as
#: another is no damage a reader can see), not the checksum field (bytes after its NUL are
#: not read).
_GARBAGE_AT = [*range(100, 148), *range(156, 345)]


def _damage(data: st.DataObject, path: str) -> int | None:
    """Damage the shard at *path* as *data* draws; the byte where the damage is (a header
    block's start, or where the shard now ends), ``None`` for a cut past tar's end block."""
    spans, end = layout(path)
    kind = data.draw(st.sampled_from(["garbage", "cut", "no end blocks"]))
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    if kind == "garbage":
        block = data.draw(st.sampled_from([h for s in spans for h in s.headers] + [end]))
        at = block + data.draw(st.sampled_from(_GARBAGE_AT))
        new = data.draw(st.binary(min_size=1, max_size=4))[: 345 - (at - block)]
        old = raw[block : block + 512]
        raw[at : at + len(new)] = new
        while _checksum_passes(bytes(raw[block : block + 512])) or raw[block : block + 512] == old:
            raw[at] = (raw[at] + 1) % 256  # garbage that the checksum catches
        where: int | None = block
    else:
        cut = end if kind == "no end blocks" else data.draw(st.integers(0, len(raw)))
        del raw[cut:]
        where = cut if cut < end + 512 else None
    with open(path, "wb") as f:
        f.write(raw)
    return where


def _checksum_passes(block: bytes) -> bool:
    try:
        stored = tarfile.nti(block[148:156])  # type: ignore[attr-defined]
        return stored in tarfile.calc_chksums(block)  # type: ignore[attr-defined]
    except tarfile.HeaderError:
        return False


def _expected(
    path: str, samples: Samples, spans: list[Span], damage: int | None
) -> list[list[Any]]:
    """What a read of the shard may give, each a list of items: its samples whole before the
    *damage* and an error; and where the damage cuts a sample after its first file, that
    sample with the files before the damage too (a cut between two files of a sample looks
    like one between samples)."""
    items = [(path, key, sorted(files)) for key, files in samples]
    if damage is None:
        return [items]
    owner = [j for j, (_, files) in enumerate(samples) for _ in files]  # a member's sample
    hit = next((m for m, s in enumerate(spans) if s.end > damage), len(spans))
    whole = owner[hit] if hit < len(spans) else len(samples)
    error = ("error", path)
    out = [[*items[:whole], error]]
    if hit < len(spans) and owner.index(whole) < hit:  # the cut sample had files before
        key, files = samples[whole]
        out.append([*items[:whole], (path, key, sorted(files[: hit - owner.index(whole)])), error])
    return out


def _items(found: list[Any], paths: list[str]) -> list[Any]:
    """Read items as the expectations spell them: a sample's shard, key and fields; an
    error's shard."""
    out: list[Any] = []
    for item in found:
        if isinstance(item, Exception):
            assert isinstance(item, pf.ShardReadError), repr(item)
            (path,) = [p for p in paths if repr(p) in str(item)]
            assert "at byte" in str(item) and "delivered before it" in str(item), str(item)
            out.append(("error", path))
        else:
            files = sorted((k, v) for k, v in item.items() if not k.startswith("__"))
            out.append((item["__url__"], item["__key__"], files))
    return out


@settings(max_examples=40)
@given(_shard_sets(["ustar", "pax", "gnu"]), st.data())
def test_a_damaged_shard_gives_its_whole_samples_then_one_error(
    shard_set: tuple[str, list[Samples]], data: st.DataObject
) -> None:
    fmt, shards = shard_set
    with tempfile.TemporaryDirectory() as folder:
        paths = _write(folder, fmt, shards)
        which = data.draw(st.sampled_from([None, *range(len(paths))]))
        layouts = [layout(p)[0] for p in paths]
        damage = None if which is None else _damage(data, paths[which])
        found = _items(pipeflow_items(paths), paths)
    done: list[Any] = []
    for k, (path, samples) in enumerate(zip(paths, shards)):
        options = _expected(path, samples, layouts[k], damage if k == which else None)
        mine = found[len(done) : len(done) + max(len(o) for o in options)]
        match = [o for o in options if mine[: len(o)] == o]
        assert match, (k, damage, found, options)
        done += match[-1]
    assert found == done


# -- resume -------------------------------------------------------------------------------------
@settings(max_examples=15)
@given(_shard_sets(["pax", "gnu"]), st.data())
def test_a_resume_from_every_state_continues_the_run_exactly(
    shard_set: tuple[str, list[Samples]], data: st.DataObject
) -> None:
    fmt, shards = shard_set
    with tempfile.TemporaryDirectory() as folder:
        paths = _write(folder, fmt, shards)
        which = data.draw(st.sampled_from([None, *range(len(paths))]))
        if which is not None:
            _damage(data, paths[which])

        def make() -> Any:
            return pf.shards(paths, shuffle=False) | pf.read_tar(decode=False)

        loader = make()
        full = _items(drain(iter(loader)), paths)
        for k in range(len(full) + 1):
            loader.set_epoch(0)
            head = _items(drain(iter(loader), k), paths)
            resumed = make()
            resumed.load_state_dict(json.loads(json.dumps(loader.state_dict())))
            assert head + _items(drain(iter(resumed)), paths) == full, k


# -- one of each ---------------------------------------------------------------------------------
def _shards(folder: str, fmt: str = "ustar", count: int = 20) -> list[str]:
    shards = [
        [(f"k{k}_{i:03d}", [("txt", f"{k}-{i}".encode()), ("cls", b"1")]) for i in range(count)]
        for k in range(3)
    ]
    return _write(folder, fmt, shards)


def _patch(path: str, at: int, new: bytes, checksum: bool = False) -> None:
    with open(path, "r+b") as f:
        f.seek(at)
        f.write(new)
        if checksum:
            block = at - at % 512
            f.seek(block)
            raw = bytearray(f.read(512))
            raw[148:156] = b" " * 8
            f.seek(block + 148)
            f.write(b"%06o\0 " % sum(raw))


def _keys_and_errors(paths: list[str]) -> list[str]:
    return [
        f"error: {item}" if isinstance(item, Exception) else item["__key__"]
        for item in pipeflow_items(paths)
    ]


def test_garbage_in_a_header_ends_its_shard_not_the_epoch(tmp_path: Any) -> None:
    paths = _shards(str(tmp_path))
    _patch(paths[0], 11 * 2048 + 124, b"zz")  # the size field of sample 11's first header
    out = _keys_and_errors(paths)
    assert len(out) == 52 and out[:11] == [f"k0_{i:03d}" for i in range(11)]
    assert out[12:] == [f"k{k}_{i:03d}" for k in (1, 2) for i in range(20)]
    assert out[11] == (
        f"error: shard {paths[0]!r} is truncated or malformed at byte 22528: a header's "
        "checksum is wrong (bytes 148-155); 11 of its samples were delivered before it, "
        "the last 'k0_010'"
    )


def test_a_number_that_is_not_one_is_damage(tmp_path: Any) -> None:
    paths = _shards(str(tmp_path), count=2)
    _patch(paths[1], 2048 + 124, b"zz", checksum=True)  # the checksum right, the size not
    out = _keys_and_errors(paths)
    assert out[:3] == ["k0_000", "k0_001", "k1_000"] and out[4:] == ["k2_000", "k2_001"]
    assert "at byte 2048: the header's size is not a number; 1 of its samples" in out[3]


@pytest.mark.parametrize(
    ("fmt", "cut", "what"),
    [
        ("pax", 5 * 512 + 20, "a pax or long-name record of"),  # in the 2nd sample's pax data
        ("gnu", 5 * 512 + 20, "a pax or long-name record of"),  # in its GNU long name
        ("gnu", 4 * 512 + 300, "a header is cut short (300 of 512 bytes)"),  # in the L header
        ("pax", 6 * 512 + 300, "a header is cut short"),  # in its own header, after the pax
        ("pax", 7 * 512 + 3, "is cut short at byte"),  # in its data
    ],
)
def test_a_cut_anywhere_gives_the_samples_before_then_one_error(
    fmt: str, cut: int, what: str, tmp_path: Any
) -> None:
    """One file per sample, each behind a pax or GNU long-name record: sample 1's records
    start at 2048 (its header at 3072, its data at 3584)."""
    names = [("k" * 110 + f"-{i}.txt", b"x") for i in range(3)]
    path = str(tmp_path / "shard.tar")
    write_tarfile(path, names, fmt)
    assert layout(path)[0][1].first == 2048 and layout(path)[0][1].headers[-1] == 3072
    with open(path, "r+b") as f:
        f.truncate(cut)
    out = _keys_and_errors([path])
    assert out[0] == "k" * 110 + "-0" and len(out) == 2, out
    assert what in out[1] and f"{path!r}" in out[1], out[1]
    assert "1 of its samples was delivered before it, the last 'kkk" in out[1]


def test_no_end_blocks_gives_the_last_sample_then_the_error(tmp_path: Any) -> None:
    paths = _shards(str(tmp_path), "pax", count=3)
    _, end = layout(paths[0])
    with open(paths[0], "r+b") as f:
        f.truncate(end)  # a writer killed before close()
    out = _keys_and_errors(paths)
    assert out[:3] == ["k0_000", "k0_001", "k0_002"] and len(out) == 10
    assert "ends without tar's end-of-archive block; 3 of its samples" in out[3]


def test_a_cut_in_a_sample_s_second_file_header_drops_that_sample(tmp_path: Any) -> None:
    """The header's name tells the cut file is the sample's: the sample is not whole."""
    paths = _shards(str(tmp_path), count=3)
    with open(paths[0], "r+b") as f:
        f.truncate(3072 + 100)  # sample 1's .cls header, its name whole
    with open(paths[1], "r+b") as f:
        f.truncate(4096 + 100)  # sample 2's .txt header: sample 1 is whole
    out = _keys_and_errors(paths)
    assert [x[:6] for x in out[:5]] == ["k0_000", "error:", "k1_000", "k1_001", "error:"]
    assert "1 of its samples was delivered before it, the last 'k0_000'" in out[1]
    assert "2 of its samples were delivered before it, the last 'k1_001'" in out[4]


def test_an_error_in_a_resumed_pass_says_the_samples_came_before_it(tmp_path: Any) -> None:
    paths = _shards(str(tmp_path), count=4)
    with open(paths[0], "r+b") as f:
        f.truncate(3 * 2048 + 10)

    def make() -> Any:
        return pf.shards(paths[:1], shuffle=False) | pf.read_tar(decode=False)

    loader = make()
    it = iter(loader)
    drain(it, 3)
    resumed = make()
    resumed.load_state_dict(loader.state_dict())
    (error,) = drain(iter(resumed))
    assert "3 of its samples were delivered before it, before this pass resumed" in str(error)


def test_a_file_that_fails_to_read_is_a_shard_error(tmp_path: Any, monkeypatch: Any) -> None:
    paths = _shards(str(tmp_path), count=2)
    from pipeflow.sources.readers import _bytes

    real = _bytes._LocalStream.read

    def failing(self: Any, n: int) -> bytes:
        if self.pos >= 2048 and self.file.name == paths[0]:
            raise OSError(5, "Input/output error")
        return real(self, n)

    monkeypatch.setattr(_bytes._LocalStream, "read", failing)
    out = _keys_and_errors(paths)
    assert out[1:] == ["k1_000", "k1_001", "k2_000", "k2_001"]  # k0_000 might go on: not sent
    assert "can't be read at byte 2048: OSError" in out[0] and repr(paths[0]) in out[0]


def test_the_tar_helpers_here_write_what_they_say(tmp_path: Any) -> None:
    paths = _shards(str(tmp_path), "gnu", count=2)
    spans, end = layout(paths[0])
    assert [s.name for s in spans] == ["k0_000.txt", "k0_000.cls", "k0_001.txt", "k0_001.cls"]
    assert end == 4 * 1024
