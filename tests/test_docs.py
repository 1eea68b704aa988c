"""Run every example in the documentation, page by page, and check the output it shows.

The conventions for ``docs/**/*.md``:

* Every fenced block tagged ``python`` runs. The blocks of one page run in order in one
  namespace (a fresh module per page), so a later block can use what an earlier one defined.
  A block that must not run takes another tag (``bash``, ``text``, ...). The tags ``py``,
  ``py3``, ``python3``, ``pycon`` and ``pytb`` are refused, so that no Python is skipped by a
  typo.
* Shown output is checked in one of two ways:

  1. A block with ``>>>`` prompts is a doctest: what is shown under each prompt must match what
     it prints (with doctest's ``ELLIPSIS``, ``...`` matches anything, for object addresses).
  2. A plain block may be followed by its output: a block tagged ``text`` with the line
     ``<!-- output -->`` just before its fence (prose may come between the two blocks). The
     captured stdout of the plain block must equal that text exactly. A plain block without
     an output block must print nothing, so that no output goes unshown or unchecked.

* After each page, the threads and child processes its examples started must be gone, and
  freeing the page's objects must print nothing (an unclosed generator whose ``finally``
  prints would otherwise print into another page's output).

* Blocks inside admonitions (indented) count too.

Each page is one test: ``pytest tests/test_docs.py -k tutorial/batch.md``. Tracebacks point at
the line of the Markdown file. The pages are skipped on Python 3.10, which does not print the
exception notes the pages show. Two more checks: every name in ``pipeflow.__all__`` has a
``::: ...`` entry in ``docs/reference/``, and the harness itself fails pages that break the
rules above.
"""

from __future__ import annotations

import contextlib
import difflib
import doctest
import gc
import io
import multiprocessing
import re
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path

import pytest

import pipeflow as pf

DOCS = Path(__file__).resolve().parent.parent / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
OUTPUT_MARKER = "<!-- output -->"
REFUSED_TAGS = {"py", "py3", "python3", "pycon", "pytb", "ipython", "Python"}
CLEANUP_GRACE = 5.0  # seconds for the threads and processes of a page to finish
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")


@dataclass
class Block:
    lang: str
    text: str
    lineno: int  # line of the first line of code (1-based)
    is_output: bool  # a `text` block marked as the output of the python block before it


def parse_blocks(path: Path) -> list[Block]:
    """The fenced code blocks of a Markdown page, with the lines dedented to their fence."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Block] = []
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if m is None:
            if lines[i].strip() == OUTPUT_MARKER:
                nxt = FENCE.match(lines[i + 1]) if i + 1 < len(lines) else None
                if nxt is None or nxt["info"].split(" ")[0] != "text":
                    pytest.fail(f"{path}:{i + 1}: {OUTPUT_MARKER} must be followed by a text fence")
            i += 1
            continue
        indent, fence, info = m["indent"], m["fence"], m["info"].strip()
        lang = info.split(" ")[0].strip("{}.") if info else ""
        marked = i > 0 and lines[i - 1].strip() == OUTPUT_MARKER
        start = i + 1
        j = start
        closing = re.compile(rf"^[ \t]*{fence[0]}{{{len(fence)},}}[ \t]*$")
        while j < len(lines) and not closing.match(lines[j]):
            j += 1
        if j == len(lines):
            pytest.fail(f"{path}:{i + 1}: unclosed code fence")
        body = [
            ln[len(indent) :] if ln.startswith(indent) else ln.lstrip() for ln in lines[start:j]
        ]
        blocks.append(Block(lang, "\n".join(body) + "\n" if body else "", start + 1, marked))
        i = j + 1
    return blocks


def is_doctest(block: Block) -> bool:
    return any(line.lstrip().startswith(">>>") for line in block.text.splitlines())


def run_doctest(block: Block, path: Path, namespace: dict[str, object]) -> None:
    parser = doctest.DocTestParser()
    test = parser.get_doctest(block.text, {}, f"{path.name}:{block.lineno}", str(path), 0)
    test.globs = namespace  # share the page's namespace (get_doctest copies the dict it gets)
    for example in test.examples:  # report lines of the Markdown file
        example.lineno += block.lineno - 1
    report: list[str] = []
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS, verbose=False)
    result = runner.run(test, out=report.append, clear_globs=False)
    if result.failed:
        pytest.fail("".join(report), pytrace=False)


def run_plain(block: Block, path: Path, namespace: dict[str, object]) -> str:
    # Pad with blank lines so that tracebacks name the line of the Markdown file.
    code = compile("\n" * (block.lineno - 1) + block.text, str(path), "exec")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(code, namespace)
    return out.getvalue()


def check_output(path: Path, block: Block, got: str, shown: Block | None) -> None:
    want = shown.text if shown is not None else ""
    if got == want:
        return
    where = f"{path}:{block.lineno}"
    if shown is None:
        pytest.fail(
            f"{where}: the block printed output but the page shows none; add a ```text block "
            f"marked {OUTPUT_MARKER} after it:\n{got}",
            pytrace=False,
        )
    diff = "".join(
        difflib.unified_diff(
            want.splitlines(keepends=True), got.splitlines(keepends=True), "shown", "printed"
        )
    )
    pytest.fail(f"{where}: printed output differs from the page (line {shown.lineno}):\n{diff}")


def wait_for_cleanup(threads_before: set[threading.Thread], path: Path) -> None:
    deadline = time.monotonic() + CLEANUP_GRACE
    while True:
        threads = [t for t in threading.enumerate() if t not in threads_before and t.is_alive()]
        children = multiprocessing.active_children()  # also reaps the finished ones
        if not threads and not children:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{path}: examples left threads {threads} and processes {children} running")
        time.sleep(0.02)


def page_id(path: Path) -> str:
    return path.relative_to(DOCS).as_posix()


def test_there_are_pages() -> None:
    assert len(PAGES) > 10


def run_page(path: Path, module_name: str) -> None:
    """Run every python block of the page at *path*, checking what it prints."""
    blocks = parse_blocks(path)
    # A module per page: functions and classes defined in examples get a real __module__, so
    # pickle can find them by name (as it would in a user's script).
    module = types.ModuleType(module_name)
    module.__file__ = str(path)
    namespace = module.__dict__
    sys.modules[module_name] = module
    threads_before = set(threading.enumerate())
    try:
        for k, block in enumerate(blocks):
            if block.lang in REFUSED_TAGS:
                pytest.fail(f"{path}:{block.lineno}: tag the block ```python (or bash, text...)")
            if block.is_output:
                prev = blocks[k - 1] if k else None
                if prev is None or prev.lang != "python" or is_doctest(prev):
                    pytest.fail(
                        f"{path}:{block.lineno}: an output block must follow a plain python "
                        "block (doctest blocks show their output after the prompts)"
                    )
            if block.lang != "python":
                continue
            nxt = blocks[k + 1] if k + 1 < len(blocks) else None
            shown = nxt if nxt is not None and nxt.is_output else None
            if is_doctest(block):
                run_doctest(block, path, namespace)
            else:
                check_output(path, block, run_plain(block, path, namespace), shown)
    finally:
        del sys.modules[module_name]
        # Free what the page made (unfinished generators run their `finally` now), and make
        # sure that nothing prints late, into another page's output.
        late = io.StringIO()
        with contextlib.redirect_stdout(late):
            namespace.clear()
            gc.collect()
    if late.getvalue():
        pytest.fail(f"{path}: printed when its objects were freed:\n{late.getvalue()}")
    wait_for_cleanup(threads_before, path)


@pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="the pages show exception notes (PEP 678), which Python 3.10 does not print",
)
@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_page_examples(path: Path) -> None:
    run_page(path, "docs_" + re.sub(r"\W", "_", page_id(path).removesuffix(".md")))


def test_reference_covers_every_public_name() -> None:
    documented = set()
    for page in (DOCS / "reference").glob("*.md"):
        for m in re.finditer(r"^:::\s*([\w.]+)", page.read_text(encoding="utf-8"), re.M):
            documented.add(m[1].rsplit(".", 1)[-1])
    missing = sorted(set(pf.__all__) - documented)
    assert not missing, f"no `::: ...` reference entry for {missing}"


def test_the_harness_reads_fences_and_markers(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        "Text\n\n```python\nprint(1)\n```\n\n<!-- output -->\n```text\n1\n```\n\n"
        "!!! note\n\n    ```python\n    x = 2\n    ```\n\n```bash\nls\n```\n",
        encoding="utf-8",
    )
    blocks = parse_blocks(page)
    assert [(b.lang, b.text, b.is_output) for b in blocks] == [
        ("python", "print(1)\n", False),
        ("text", "1\n", True),
        ("python", "x = 2\n", False),
        ("bash", "ls\n", False),
    ]
    assert blocks[0].lineno == 4


BAD_PAGES = {
    "wrong output": "```python\nprint(1)\n```\n\n<!-- output -->\n```text\n2\n```\n",
    "unshown output": "```python\nprint(1)\n```\n",
    "wrong doctest": "```python\n>>> 1 + 1\n3\n```\n",
    "a py tag": "```py\nx = 1\n```\n",
    "an error": "```python\nraise KeyError('x')\n```\n",
    "a marker without a block": "<!-- output -->\nText\n",
    "an output block after a doctest": (
        "```python\n>>> print(1)\n1\n```\n\n<!-- output -->\n```text\n1\n```\n"
    ),
    "a late print": "```python\ndef g():\n    try:\n        yield 1\n    finally:\n"
    "        print('late')\n\n\nit = g()\nnext(it)\n```\n",
    "a thread left running": "```python\nimport sys\nimport threading\n\n"
    f"release = sys.modules[{__name__!r}].RELEASE\n"
    "threading.Thread(target=release.wait, daemon=True).start()\n```\n",
}
RELEASE = threading.Event()  # lets the thread of the "thread left running" page finish


@pytest.mark.parametrize("text", BAD_PAGES.values(), ids=BAD_PAGES.keys())
def test_the_harness_fails_pages_with(text: str, tmp_path: Path, monkeypatch) -> None:
    page = tmp_path / "bad.md"
    page.write_text(text, encoding="utf-8")
    monkeypatch.setattr(sys.modules[__name__], "CLEANUP_GRACE", 0.1)
    RELEASE.clear()
    try:
        with pytest.raises((pytest.fail.Exception, KeyError)):
            run_page(page, "docs_bad_page")
    finally:
        RELEASE.set()


def test_the_harness_passes_a_good_page(tmp_path: Path) -> None:
    page = tmp_path / "good.md"
    page.write_text(
        "```python\nx = 2\nprint(x)\n```\n\n<!-- output -->\n```text\n2\n```\n\n"
        "```python\n>>> x + 1\n3\n```\n\n```bash\nexit 1\n```\n",
        encoding="utf-8",
    )
    run_page(page, "docs_good_page")
