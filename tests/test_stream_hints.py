"""Hints where users land with streamed shards: a URL whose file system's package is not
installed fails when ``pf.shards`` is built, naming the package and how to install it; a
store that refuses the credentials (moto's S3 on 127.0.0.1 with its authentication on, or
no credentials at all) gives an error with a note naming the shard and how to pass them;
and a brace pattern of local files names the first one that does not exist."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from typing import Any

import pytest

import pipeflow as pf
from tests._servers import s3_server
from tests._shards import write_shards

pytestmark = pytest.mark.timeout(120)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


# -- a file system's package not installed ------------------------------------------------------
def _build_without(blocked: list[str], urls: Any) -> str:
    """Build ``pf.shards(urls)`` in a fresh interpreter where *blocked* cannot be imported
    (``sys.modules[name] = None``: a real import failure); what happened, as text."""
    code = textwrap.dedent(
        f"""
        import sys
        for name in {blocked!r}:
            sys.modules[name] = None
        import pipeflow as pf
        try:
            pf.shards({urls!r})
        except ImportError as e:
            print("ImportError at build:", e)
        else:
            print("built")
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


_STREAM = "pip install 'pipeflow[stream]'"


@pytest.mark.parametrize(
    ("blocked", "urls", "package", "how", "named"),
    [
        (["s3fs"], ["s3://b/x.tar", "s3://b/y.tar"], "s3fs", _STREAM, "s3://b/x.tar"),
        (["s3fs"], "s3://b/train-*.tar", "s3fs", _STREAM, "s3://b/train-*.tar"),  # a glob
        (["s3fs"], "s3://b/train-{0..3}.tar", "s3fs", _STREAM, "s3://b/train-0.tar"),
        (
            ["aiohttp"],
            ["https://example.org/a.tar"],
            "aiohttp",
            _STREAM,
            "https://example.org/a.tar",
        ),
        (["gcsfs"], ["gs://b/a.tar"], "gcsfs", "pip install gcsfs", "gs://b/a.tar"),
        (["adlfs"], ["az://c/a.tar"], "adlfs", "pip install adlfs", "az://c/a.tar"),
    ],
)
def test_a_missing_file_system_package_fails_at_build_naming_it(
    blocked: list[str], urls: Any, package: str, how: str, named: str
) -> None:
    pytest.importorskip("fsspec")
    out = _build_without(blocked, urls)
    assert out.startswith("ImportError at build:"), out
    assert f"needs {package}, which is not installed: {how}" in out, out
    assert repr(named) in out, out


def test_a_missing_fsspec_fails_at_build_naming_the_extra() -> None:
    out = _build_without(["fsspec"], ["s3://bucket/a.tar"])
    assert out.startswith("ImportError at build:") and "pipeflow[stream]" in out, out
    assert "fsspec" in out, out


def test_local_shards_need_no_file_system_package() -> None:
    assert _build_without(["fsspec", "s3fs", "aiohttp"], ["a.tar", "file:///b.tar"]) == "built\n"


# -- credentials ----------------------------------------------------------------------------------
@pytest.fixture
def bucket(tmp_path: Any) -> Any:
    """moto's S3 on 127.0.0.1 with a bucket holding one shard: ``(storage options, the
    shard's URL)`` (a bucket of its own: moto keeps its buckets for the whole process)."""
    s3fs = pytest.importorskip("s3fs")
    pytest.importorskip("moto")
    (path,) = write_shards(str(tmp_path), [3])
    name = f"hints-{uuid.uuid4().hex[:12]}"
    with s3_server() as options:
        fs = s3fs.S3FileSystem(**options)
        fs.mkdir(name)
        fs.put(path, f"{name}/shard-0000.tar")
        yield options, f"s3://{name}/shard-0000.tar"


def _notes(error: BaseException) -> str:
    return "\n".join(getattr(error, "__notes__", []))


def _read(url: str, options: dict[str, Any]) -> BaseException:
    loader = pf.shards([url]) | pf.read_tar(storage_options=options, retries=3, timeout=20)
    with pytest.raises(pf.ShardReadError) as info:
        list(loader)
    return info.value


def test_wrong_credentials_get_a_note_on_how_to_pass_them(bucket: Any, monkeypatch: Any) -> None:
    import moto.settings

    options, url = bucket
    monkeypatch.setattr(moto.settings, "INITIAL_NO_AUTH_ACTION_COUNT", 0)  # check credentials
    error = _read(url, {**options, "key": "wrong", "secret": "wrong"})
    note = _notes(error)
    assert url in str(error) and url in note, (str(error), note)
    assert "refused the credentials" in note, note
    assert "storage_options={'key': ..., 'secret': ..." in note and "endpoint_url" in note, note
    assert "AWS_ACCESS_KEY_ID" in note and "AWS_SECRET_ACCESS_KEY" in note, note
    assert "failed 4 times" not in str(error)  # not retried: a retry does not mend it
    # listing a glob with them, at build: the store's error, with the same note
    pattern = url.replace("shard-0000", "*")
    with pytest.raises(PermissionError) as info:
        pf.shards(pattern, storage_options={**options, "key": "wrong"})
    assert "refused the credentials" in _notes(info.value), _notes(info.value)
    assert pattern in _notes(info.value)


def test_no_credentials_get_a_note_on_how_to_pass_them(
    bucket: Any, monkeypatch: Any, tmp_path: Any
) -> None:
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance metadata lookup
    options, url = bucket
    error = _read(url, {k: v for k, v in options.items() if k not in ("key", "secret")})
    note = _notes(error)
    assert url in note and "found no credentials" in note, note
    assert "storage_options=" in note and "AWS_ACCESS_KEY_ID" in note, note


# -- local names a pattern stands for ---------------------------------------------------------
def test_a_brace_pattern_of_local_files_names_the_first_missing(tmp_path: Any) -> None:
    write_shards(str(tmp_path), [1, 1, 1])  # shard-0000.tar .. shard-0002.tar
    ok = pf.shards(str(tmp_path / "shard-{0000..0002}.tar"), shuffle=False)
    assert len(list(ok)) == 3
    with pytest.raises(ValueError) as info:
        pf.shards(str(tmp_path / "shard-{0000..0009}.tar"))
    text = str(info.value)
    assert repr(str(tmp_path / "shard-0003.tar")) in text and "7 of the 10" in text, text
    with pytest.raises(ValueError, match="does not exist"):
        pf.shards("file://" + str(tmp_path / "{shard-0000,other}.tar"))
    with pytest.raises(ValueError, match="does not exist"):
        pf.shards(str(tmp_path / "no-folder" / "x-{0..1}.tar"))
