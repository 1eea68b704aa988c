"""read_tar against webdataset's own reader: the same samples, field by field, from shards that
tarfile (ustar, pax, GNU), webdataset's TarWriter and GNU tar write; where each sample starts
(the first record of its first file, as tarfile's ``TarInfo.offset``); the one place pipeflow
differs (two files of one extension: a failure in the sample's place, not the shard's end)."""

from __future__ import annotations

import io
import json
import os
import tarfile
from collections.abc import Callable
from typing import Any

import pytest

import pipeflow as pf
from tests._tar_writers import (
    FORMATS,
    TAR,
    Members,
    drain,
    pipeflow_items,
    webdataset_samples,
    write_gnu_tar,
    write_tarfile,
    write_webdataset,
)

_LONG_DIR = "d" * 60 + "/" + "k" * 70  # 131 bytes: ustar holds it (prefix and name)
_LONG = "k" * 120  # no slash: ustar can't hold it

#: Shards' members, each set with what tests the grouping.
CASES: dict[str, list[tuple[str, bytes | None]]] = {
    "plain": [("a.txt", b"1"), ("a.cls", b"2"), ("b.txt", b"3"), ("b.cls", b"")],
    "non-ascii": [("名前-1.txt", b"x"), ("名前-1.json", b"{}"), ("café-2.txt", b"y" * 600)],
    "long names": [
        (f"{_LONG_DIR}-1.txt", b"1"),
        (f"{_LONG_DIR}-1.cls", b"2"),
        (f"{_LONG}-2.txt", b"3"),
        (f"名前/{_LONG}-3.txt", b"4"),
    ],
    "extensionless": [("a.txt", b"1"), ("README", b"r"), ("a.cls", b"2"), ("b.txt", b"3")],
    "mixed case": [("A.JPG", b"1"), ("A.Cls", b"2"), ("b.TXT", b"3"), ("B.txt", b"4")],
    "multi-dot": [("a.seg.png", b"1"), ("a.b.c", b"2"), ("x.y/z", b"3"), ("x.y/z.w.q", b"4")],
    "directories": [
        ("d", None),
        ("d/a.txt", b"1"),
        ("d/a.cls", b"2"),
        ("d/e", None),
        ("d/e/a.txt", b"3"),
        ("d/.hidden", b"4"),
    ],
    "meta files": [
        ("__meta__", b"m"),
        ("__x__", None),
        ("__x__/a.txt", b"m"),
        ("a.txt", b"1"),
        ("__a__.txt", b"2"),
    ],
}


def _fits_ustar(members: Members) -> bool:
    """Whether every name fits ustar's name field, or its prefix and name fields."""
    for name, _ in members:
        raw = name.encode()
        if len(raw) <= 100:
            continue
        cuts = [i for i, c in enumerate(raw) if c == ord("/") and i <= 155]
        if not any(len(raw) - i - 1 <= 100 for i in cuts):
            return False
    return True


def _writers() -> list[Any]:
    out: list[Any] = [pytest.param(f"tarfile-{fmt}", id=f"tarfile-{fmt}") for fmt in FORMATS]
    for fmt in ("gnu", "posix", "ustar"):
        out.append(
            pytest.param(
                f"tar-{fmt}",
                id=f"gnu-tar-{fmt}",
                marks=pytest.mark.skipif(TAR is None, reason="GNU tar is not installed"),
            )
        )
    return out


def _write(writer: str, path: str, members: Members, folder: str) -> None:
    tool, fmt = writer.split("-", 1)
    if fmt == "ustar" and not _fits_ustar(members):
        pytest.skip("ustar can't hold a name over 100 bytes without a '/' to split it at")
    if tool == "tarfile":
        write_tarfile(path, members, fmt)
    else:
        write_gnu_tar(path, members, fmt, folder)


def _same_as_webdataset(path: str) -> list[dict[str, Any]]:
    """pipeflow's samples, checked against webdataset's field by field."""
    ours = pipeflow_items([path])
    for item in ours:
        assert isinstance(item, dict), item
    assert [s["__index__"] for s in ours] == list(range(len(ours)))
    theirs = webdataset_samples(path)
    assert [{k: v for k, v in s.items() if k != "__index__"} for s in ours] == theirs
    assert all(s["__url__"] == path for s in ours)
    return ours


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("writer", _writers())
def test_samples_are_webdataset_s(writer: str, case: str, tmp_path: Any) -> None:
    path = str(tmp_path / "shard.tar")
    _write(writer, path, CASES[case], str(tmp_path / "files"))
    assert _same_as_webdataset(path)  # not empty: every case has samples


def test_what_the_cases_group_to(tmp_path: Any) -> None:
    """The grouping, spelled out (the webdataset comparison could agree on a wrong answer)."""
    expected = {
        "extensionless": [("a", ["cls", "txt"]), ("b", ["txt"])],  # README splits nothing
        "mixed case": [("A", ["cls", "jpg"]), ("b", ["txt"]), ("B", ["txt"])],
        "multi-dot": [("a", ["b.c", "seg.png"]), ("x.y/z", ["w.q"])],
        "directories": [("d/a", ["cls", "txt"]), ("d/e/a", ["txt"]), ("d/", ["hidden"])],
        "meta files": [("a", ["txt"]), ("__a__", ["txt"])],
    }
    for case, want in expected.items():
        path = str(tmp_path / f"{case}.tar")
        write_tarfile(path, CASES[case], "pax")
        got = [
            (s["__key__"], sorted(k for k in s if not k.startswith("__")))
            for s in pipeflow_items([path])
        ]
        assert got == want, case


@pytest.mark.parametrize("case", ["plain", "non-ascii", "long names", "mixed case", "multi-dot"])
def test_webdataset_tar_writer_shards(case: str, tmp_path: Any) -> None:
    samples: list[tuple[str, dict[str, bytes]]] = []
    for name, data in CASES[case]:
        if "." not in os.path.basename(name):
            continue  # TarWriter writes key.extension names only
        key, ext = os.path.basename(name).split(".", 1)
        key = os.path.join(os.path.dirname(name), key)
        if not samples or samples[-1][0] != key:
            samples.append((key, {}))
        samples[-1][1][ext] = data or b""
    path = str(tmp_path / "shard.tar")
    write_webdataset(path, samples)
    ours = _same_as_webdataset(path)
    assert [s["__key__"] for s in ours] == [k for k, _ in samples]


@pytest.mark.parametrize("twice", [("a.txt", "a.txt"), ("a.txt", "a.TXT")])
def test_two_files_of_one_extension_fail_their_sample_not_the_shard(
    twice: tuple[str, str], tmp_path: Any
) -> None:
    path, again = str(tmp_path / "shard.tar"), str(tmp_path / "again.tar")
    members = [
        ("z.txt", b"0"),
        (twice[0], b"1"),
        ("a.cls", b"2"),
        (twice[1], b"3"),
        ("b.txt", b"4"),
    ]
    write_tarfile(path, members, "pax")
    write_tarfile(again, members, "pax")
    with pytest.raises(ValueError, match="duplicate file name"):
        webdataset_samples(path)  # webdataset: the shard's stream ends
    items = pipeflow_items([path, again])
    assert [s["__key__"] if isinstance(s, dict) else type(s) for s in items] == [
        "z",
        ValueError,
        "b",
        "z",
        ValueError,
        "b",
    ]  # the pass goes on, in this shard and the next
    message = str(items[1])
    assert repr(path) in message and "'a'" in message and "'txt'" in message
    assert items[2]["__index__"] == 2  # the failure stood for sample 1
    dropping = pf.shards([path], shuffle=False) | pf.read_tar(decode=False) | pf.ignore_errors()
    assert [s["__key__"] for s in dropping] == ["z", "b"]


def _tarinfo(name: str, size: int, kind: bytes = tarfile.REGTYPE) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type, info.mtime = size, kind, 1_700_000_000
    return info


def test_links_devices_and_global_headers_are_passed_over(tmp_path: Any) -> None:
    path = str(tmp_path / "shard.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_tarinfo("a.txt", 1), io.BytesIO(b"1"))
        link = _tarinfo("a.lnk", 0, tarfile.SYMTYPE)
        link.linkname = "t" * 150  # a GNU long link record ('K') before it
        tar.addfile(link)
        tar.addfile(_tarinfo("a.fifo", 0, tarfile.FIFOTYPE))
        hard = _tarinfo("a.hard", 0, tarfile.LNKTYPE)
        hard.linkname = "a.txt"
        tar.addfile(hard)
        tar.addfile(_tarinfo("a.cls", 1), io.BytesIO(b"2"))
    assert [sorted(s) for s in _same_as_webdataset(path)] == [
        ["__index__", "__key__", "__url__", "cls", "txt"]
    ]
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT, pax_headers={"comment": "x"}) as tar:
        tar.addfile(_tarinfo("名前.txt", 1), io.BytesIO(b"1"))  # after a global header ('g')
    assert [s["__key__"] for s in _same_as_webdataset(path)] == ["名前"]


def _reheader(raw: bytearray, at: int, field: slice, value: bytes) -> None:
    """Set a header field at *at* and make its checksum right again."""
    raw[at + field.start : at + field.stop] = value.ljust(field.stop - field.start, b"\0")
    raw[at + 148 : at + 156] = b" " * 8
    raw[at + 148 : at + 156] = b"%06o\0 " % sum(raw[at : at + 512])


def test_a_pax_size_replaces_the_header_s(tmp_path: Any) -> None:
    path = str(tmp_path / "shard.tar")
    with tarfile.open(path, "w", format=tarfile.PAX_FORMAT) as tar:
        info = _tarinfo("a.txt", 700)
        info.pax_headers = {"size": "700", "path": "名前.txt"}
        tar.addfile(info, io.BytesIO(b"x" * 700))
        tar.addfile(_tarinfo("b.txt", 1), io.BytesIO(b"y"))
    with open(path, "rb") as f:
        raw = bytearray(f.read())
    _reheader(raw, 1024, slice(124, 136), b"00000000001")  # the header says 1 byte
    with open(path, "wb") as f:
        f.write(raw)
    ours = _same_as_webdataset(path)
    assert [(s["__key__"], len(s["txt"])) for s in ours] == [("名前", 700), ("b", 1)]


def test_names_that_are_not_utf8_are_kept_as_tarfile_keeps_them(tmp_path: Any) -> None:
    path = str(tmp_path / "shard.tar")
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT) as tar:
        tar.addfile(_tarinfo("k\udcff.txt", 1), io.BytesIO(b"1"))  # the byte 0xff
        tar.addfile(_tarinfo("k\udcff" + "x" * 120 + ".txt", 1), io.BytesIO(b"2"))  # a GNU L record
    assert [s["__key__"] for s in _same_as_webdataset(path)] == ["k\udcff", "k\udcff" + "x" * 120]


# -- where samples start ----------------------------------------------------------------------
def _first_offsets(path: str) -> list[int]:
    """Where each sample starts, as tarfile gives its first member (``TarInfo.offset``: the
    first record, a pax or GNU long-name one when there is one)."""
    out, key = [], None
    with tarfile.open(path) as tar:
        for m in tar.getmembers():
            k = m.name.split(".", 1)[0]
            if k != key:
                out.append(m.offset)
                key = k
    return out


@pytest.mark.parametrize("fmt", ["pax", "gnu", "webdataset"])
def test_a_sample_starts_at_its_first_record_and_a_resume_reads_its_name(
    fmt: str, tmp_path: Any
) -> None:
    keys = ["名前-0", "café-1", "x" * 110 + "-2", "名前-3", "s-4"]
    path = str(tmp_path / "shard.tar")
    if fmt == "webdataset":
        write_webdataset(path, [(k, {"txt": k.encode(), "cls": b"1"}) for k in keys])
    else:
        write_tarfile(path, [(f"{k}.{e}", k.encode()) for k in keys for e in ("txt", "cls")], fmt)
    starts = _first_offsets(path)

    def make() -> Any:
        return pf.shards([path], shuffle=False) | pf.read_tar(decode=False)

    loader = make()
    for k in range(1, len(keys)):
        loader.set_epoch(0)
        it = iter(loader)
        drain(it, k)
        state = json.loads(json.dumps(loader.state_dict()))
        (record,) = state["stages"].values()
        assert (record["start"], record["offset"]) == (k, starts[k])
        resumed = make()
        resumed.load_state_dict(state)
        assert [(s["__key__"], s["txt"]) for s in resumed] == [(k, k.encode()) for k in keys[k:]]


# -- decoders by extension -----------------------------------------------------------------
@pytest.mark.parametrize(
    ("table", "want"),
    [
        ({"seg.png": bytes.upper}, {"seg.png": b"AB", "png": "image"}),
        ({"png": bytes.upper}, {"seg.png": b"AB", "png": b"AB"}),
        ({"seg.png": None, "png": bytes.upper}, {"seg.png": b"aB", "png": b"AB"}),
    ],
)
def test_a_decoder_is_found_by_the_whole_extension_then_its_last_part(
    table: dict[str, Callable[[bytes], Any] | None], want: dict[str, Any], tmp_path: Any
) -> None:
    path = str(tmp_path / "shard.tar")
    write_tarfile(path, [("a.seg.png", b"aB"), ("a.png", b"aB")], "pax")
    it = iter(pf.shards([path]) | pf.read_tar(decode=table))
    (item,) = drain(it)
    if want["png"] == "image":  # the default png decoder, on bytes that are no image
        assert isinstance(item, Exception) and "'png'" in " ".join(getattr(item, "__notes__", []))
        return
    assert {k: item[k] for k in want} == want
