"""Run every example in the documentation and check the output it shows.

The conventions for ``docs/**/*.md``:

* Every fenced block tagged ``python`` runs, twice:

  1. **Alone**, in a fresh namespace, as a reader who copies just that block would run it. So
     every block imports what it uses and defines the names it needs. A block that continues
     the one before it on purpose says so where the reader sees it: its fence has a title
     starting with "Continued" (```` ```python title="Continued from above" ````), and then it
     is only run in page order. Keep those rare.
  2. **In page order**, the blocks of one page in one namespace (a fresh module per page).

  A block that must not run takes another tag (``bash``, ``text``, ...). The tags ``py``,
  ``py3``, ``python3``, ``pycon`` and ``pytb`` are refused, so that no Python is skipped by a
  typo.
* Blocks run as the main module (``__name__ == "__main__"``), as a script would, so code under
  ``if __name__ == "__main__":`` runs too. Blocks with that guard that start worker processes
  also run as a script under the ``spawn`` start method (the default on macOS and Windows;
  Linux's from Python 3.14, ``forkserver``, imports the script again too).
* Shown output is checked in one of two ways:

  1. A block with ``>>>`` prompts is a doctest: what is shown under each prompt must match what
     it prints (with doctest's ``ELLIPSIS``, ``...`` matches anything, for object addresses).
  2. A plain block may be followed by its output: a block tagged ``text`` with the line
     ``<!-- output -->`` just before its fence (prose may come between the two blocks). The
     captured stdout of the plain block must equal that text exactly. A plain block without
     an output block must print nothing, so that no output goes unshown or unchecked.

* After each run, the threads and child processes its examples started must be gone, and
  freeing its objects must print nothing (an unclosed generator whose ``finally`` prints would
  otherwise print into another page's output).

* Blocks inside admonitions and content tabs (indented) count too.

Each page is one test, ``pytest tests/test_docs.py -k "page and tutorial/batch.md"``, and each
block another, ``-k "alone and tutorial/batch.md:40"``. Tracebacks point at the line of the
Markdown file. The pages are skipped on Python 3.10, which does not print the exception notes
the pages show. More checks: the README's tour runs under ``spawn``; every name in
``pipeflow.__all__`` has a ``::: ...`` entry in ``docs/reference/``; and the harness itself
fails pages that break the rules above.
"""

from __future__ import annotations

import contextlib
import difflib
import doctest
import gc
import io
import json
import multiprocessing
import os
import re
import shutil
import subprocess
import sys
import threading
import time
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import pipeflow as pf
from pipeflow.stages import device as pf_device

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = sorted(DOCS.rglob("*.md"))
OUTPUT_MARKER = "<!-- output -->"
REFUSED_TAGS = {"py", "py3", "python3", "pycon", "pytb", "ipython", "Python"}
CLEANUP_GRACE = 5.0  # seconds for the threads and processes of a page to finish
CONTINUED = re.compile(r'title="Continued\b')  # a block that needs the one before it
USES_GC = re.compile(r"\bgc\.")  # a page that calls the garbage collector's functions
FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<info>.*)$")


@dataclass
class Block:
    lang: str
    text: str
    lineno: int  # line of the first line of code (1-based)
    is_output: bool  # a `text` block marked as the output of the python block before it
    continued: bool = False  # titled "Continued ...": runs only after the blocks before it


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
        text = "\n".join(body) + "\n" if body else ""
        blocks.append(Block(lang, text, start + 1, marked, bool(CONTINUED.search(info))))
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


def fsspec_threads() -> set[threading.Thread]:
    """fsspec's event loop thread and its default executor's threads: one set per process,
    started by the first remote read (s3fs, HTTP) and kept, by fsspec's design, until the
    interpreter exits; not an example's to stop."""
    asyn = sys.modules.get("fsspec.asyn")
    if asyn is None:
        return set()
    out = {t for t in threading.enumerate() if t.name == "fsspecIO"}
    loop = asyn.loop[0]
    executor = getattr(loop, "_default_executor", None) if loop is not None else None
    return out | set(getattr(executor, "_threads", ()))


def wait_for_cleanup(
    threads_before: set[threading.Thread], path: Path, children_before: set[Any] = frozenset()
) -> None:
    deadline = time.monotonic() + CLEANUP_GRACE
    while True:
        kept = threads_before | fsspec_threads()
        threads = [t for t in threading.enumerate() if t not in kept and t.is_alive()]
        # also reaps the finished ones; a process an earlier test left is not this page's
        children = [p for p in multiprocessing.active_children() if p not in children_before]
        if not threads and not children:
            return
        if time.monotonic() > deadline:
            pytest.fail(f"{path}: examples left threads {threads} and processes {children} running")
        time.sleep(0.02)


def page_id(path: Path) -> str:
    return path.relative_to(DOCS).as_posix()


def test_there_are_pages() -> None:
    assert len(PAGES) > 10


def run_page(path: Path, module_name: str, only: int | None = None) -> None:
    """Run the python blocks of the page at *path*, checking what they print: all of them in
    order in one namespace, or with *only*, block number *only* alone in a fresh one."""
    blocks = parse_blocks(path)
    # A module per run: functions and classes defined in examples get a real module, so that
    # pickle finds them by name (as it would in a user's script). It runs as __main__, as a
    # script does; forked workers inherit sys.modules, so they find it there too.
    module = types.ModuleType("__main__")
    module.__file__ = str(path)
    namespace = module.__dict__
    sys.modules[module_name] = module
    main = sys.modules["__main__"]
    sys.modules["__main__"] = module
    threads_before = set(threading.enumerate())
    children_before = set(multiprocessing.active_children())
    # Each run stands for a fresh process: the warnings pipeflow gives once per process
    # (pin_memory without an accelerator) are given again.
    pf_device._WARNED.clear()
    # What was alive before the run (torch, pytest, ...) is left out of the collection below,
    # which then walks only what the run made: a full collection takes 0.3-0.6 s with torch
    # imported, and this runs some 300 times. A page that shows the collector itself sees
    # it as a fresh process has it (nothing frozen).
    freeze = not any(USES_GC.search(b.text) for b in blocks if b.lang == "python")
    if freeze:
        gc.freeze()
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
            if block.lang != "python" or (only is not None and k != only):
                continue
            nxt = blocks[k + 1] if k + 1 < len(blocks) else None
            shown = nxt if nxt is not None and nxt.is_output else None
            if is_doctest(block):
                run_doctest(block, path, namespace)
            else:
                check_output(path, block, run_plain(block, path, namespace), shown)
    finally:
        sys.modules["__main__"] = main
        del sys.modules[module_name]
        # Free what the page made (unfinished generators run their `finally` now), and make
        # sure that nothing prints late, into another page's output.
        late = io.StringIO()
        with contextlib.redirect_stdout(late):
            namespace.clear()
            gc.collect()
        if freeze:
            gc.unfreeze()
    if late.getvalue():
        pytest.fail(f"{path}: printed when its objects were freed:\n{late.getvalue()}")
    wait_for_cleanup(threads_before, path, children_before)


def module_name_for(path: Path) -> str:
    return "docs_" + re.sub(r"\W", "_", page_id(path).removesuffix(".md"))


def alone_cases() -> list[pytest.ParameterSet]:
    """One case per python block that a reader may copy and run on its own."""
    cases = []
    for path in PAGES:
        for k, block in enumerate(parse_blocks(path)):
            if block.lang == "python" and not block.continued:
                cases.append(pytest.param(path, k, id=f"{page_id(path)}:{block.lineno}"))
    return cases


needs_311 = pytest.mark.skipif(
    sys.version_info < (3, 11),
    reason="the pages show exception notes (PEP 678), which Python 3.10 does not print",
)


@pytest.mark.slow
@needs_311
@pytest.mark.timeout(300)  # a hang's bound: a page that starts Ray takes minutes at load 15
@pytest.mark.parametrize("path", PAGES, ids=page_id)
def test_page(path: Path) -> None:
    run_page(path, module_name_for(path))


@pytest.mark.slow
@needs_311
@pytest.mark.parametrize(("path", "k"), alone_cases())
def test_alone(path: Path, k: int) -> None:
    run_page(path, module_name_for(path), only=k)


def test_most_blocks_run_alone() -> None:
    blocks = [b for path in PAGES for b in parse_blocks(path) if b.lang == "python"]
    continued = [b for b in blocks if b.continued]
    # 1 in 15: rare, but a page may build one thing in steps rather than repeat it in every
    # block (issue 27 found read_shard defined three times on one page)
    assert len(continued) <= len(blocks) // 15, "keep blocks that need earlier ones rare"


SPAWN_PRELUDE = "import multiprocessing\nmultiprocessing.set_start_method('spawn', force=True)\n"


def spawn_cases() -> list[pytest.ParameterSet]:
    """The README's tour, and every docs block with an ``if __name__ == "__main__":`` guard
    (they are there because the block starts worker processes)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    tour = readme.split("## A short tour", 1)[1]
    first = re.search(r"```python\n(.*?)```", tour, flags=re.S)
    assert first is not None
    cases = [pytest.param(first[1], id="README.md:tour")]
    for path in PAGES:
        for block in parse_blocks(path):
            if block.lang == "python" and not block.continued and "__main__" in block.text:
                cases.append(pytest.param(block.text, id=f"{page_id(path)}:{block.lineno}"))
    return cases


class SpawnRuns:
    """The scripts of :func:`spawn_cases`, run one after another in a background thread.

    A run is mostly waiting: its workers start by importing torch and the script again. So
    the runs start with this module's first test, in their own processes, while this process
    runs the pages, and each ``test_runs_under_spawn`` then reads its run's result: the same
    scripts and the same checks, their time overlapping the pages' instead of adding to it.
    """

    def __init__(self, cases: dict[str, str], folder: Path) -> None:
        self.cases = cases
        self.folder = folder
        self.done: dict[str, threading.Event] = {name: threading.Event() for name in cases}
        self.results: dict[str, subprocess.CompletedProcess[str] | BaseException] = {}
        self.stopped = False
        self.proc: subprocess.Popen[str] | None = None
        self.thread = threading.Thread(target=self._run_all, name="docs-spawn-runs", daemon=True)

    def _run_all(self) -> None:
        for name, code in self.cases.items():
            try:
                if self.stopped:
                    raise RuntimeError("stopped before it ran")
                self.results[name] = self._run(name, code)
            except BaseException as e:  # handed to the test that reads it
                self.results[name] = e
            self.done[name].set()

    def _run(self, name: str, code: str) -> subprocess.CompletedProcess[str]:
        folder = self.folder / re.sub(r"\W", "_", name)
        folder.mkdir()
        script = folder / "example.py"
        script.write_text(SPAWN_PRELUDE + code, encoding="utf-8")
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), *sys.path])}
        self.proc = proc = subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            cwd=folder,
            # At a lower priority, so that they take the CPU the pages leave: some pages time
            # what they show ("the loop waited under 10% of the time"), and must not wait.
            preexec_fn=lambda: os.nice(SPAWN_NICENESS),
        )
        try:
            out, err = proc.communicate(timeout=SPAWN_TIMEOUT)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
        return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)

    def result(self, name: str) -> subprocess.CompletedProcess[str]:
        self.done[name].wait()
        got = self.results[name]
        if isinstance(got, BaseException):
            raise got
        return got

    def stop(self) -> None:
        self.stopped = True
        proc = self.proc
        if proc is not None and proc.poll() is None:
            proc.kill()
        if self.thread.is_alive():
            self.thread.join()


SPAWN_TIMEOUT = 240  # seconds for one script (at a lower priority, on a busy machine)
SPAWN_NICENESS = 5  # added to the scripts' niceness (and their workers'): a third of a page's share


@pytest.fixture(scope="module", autouse=True)
def spawn_runs(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """Start the spawn runs this session selected, in the background, at the module's first
    test (see :class:`SpawnRuns`)."""
    cases = {p.id: p.values[0] for p in spawn_cases()}
    chosen = [
        item.callspec.id
        for item in request.session.items
        if getattr(item, "originalname", "") == "test_runs_under_spawn"
        and item.module is sys.modules[__name__]
    ]
    runs = SpawnRuns({name: cases[name] for name in chosen}, tmp_path_factory.mktemp("spawn"))
    if chosen:
        runs.thread.start()
    yield runs
    runs.stop()


@pytest.mark.slow
@pytest.mark.timeout(SPAWN_TIMEOUT + 30)  # a script's own limit comes first
@pytest.mark.parametrize("code", spawn_cases())
def test_runs_under_spawn(code: str, request: pytest.FixtureRequest, spawn_runs: Any) -> None:
    """Workers started by spawn import the main script again: the example must guard the code
    that starts them with ``if __name__ == "__main__":``, or it fails (or, with a bare
    multiprocessing.Pool, hangs)."""
    done = spawn_runs.result(request.node.callspec.id)
    assert done.returncode == 0, done.stderr[-3000:]


COPY_JS = DOCS / "assets" / "copy-session.js"


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("node") is None, reason="needs node to run the site's JS")
def test_copy_button_copies_the_code_of_sessions() -> None:
    """docs/assets/copy-session.js gives each >>> session's copy button only the code lines;
    what it gives must be valid Python, with no prompt or output left in it."""
    sessions = [
        b.text for path in PAGES for b in parse_blocks(path) if b.lang == "python" and is_doctest(b)
    ]
    script = (
        f"const {{sessionCode}} = require({json.dumps(str(COPY_JS))});"
        "const input = JSON.parse(require('fs').readFileSync(0, 'utf8'));"
        "process.stdout.write(JSON.stringify(input.map(sessionCode)));"
    )
    done = subprocess.run(
        ["node", "-e", script],
        input=json.dumps(sessions),
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    )
    copied = json.loads(done.stdout)
    assert len(copied) == len(sessions) > 50
    for session, code in zip(sessions, copied):
        compile(code, "<copied>", "exec")  # pastes as Python
        assert ">>>" not in code
        assert "Traceback" not in code
        want = [ln[4:] for ln in session.splitlines() if ln.startswith((">>> ", "... "))]
        got = [ln for ln in code.splitlines() if ln]
        assert [w.split("  # doctest:")[0] for w in want if w] == got
    # A sample, in full: blank lines end indented blocks, doctest directives go.
    sample = ">>> def f():\n...     return 1\n>>> f()  # doctest: +ELLIPSIS\n1\nTraceback\n"
    done = subprocess.run(
        ["node", "-e", script],
        input=json.dumps([sample]),
        capture_output=True,
        text=True,
        check=True,
    )
    assert json.loads(done.stdout) == ["def f():\n    return 1\n\nf()"]


def test_every_tutorial_step_ends_with_an_exercise_and_a_tested_answer() -> None:
    steps = [p for p in PAGES if p.parent.name == "tutorial" and p.name != "index.md"]
    assert len(steps) == 10
    for path in steps:
        text = path.read_text(encoding="utf-8")
        assert "\n## Exercise\n" in text, f"{page_id(path)}: no exercise"
        exercise = text.split("\n## Exercise\n", 1)[1].split("\n## ", 1)[0]
        assert '??? example "Answer"' in exercise, f"{page_id(path)}: the answer is not folded"
        answers = [b for b in parse_blocks(path) if b.lang == "python"]
        assert any(b.text in exercise.replace("\n    ", "\n") for b in answers), page_id(path)


def test_the_site_requests_no_web_fonts() -> None:
    """Material loads Google's fonts unless told not to; offline, each page waits for them."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert re.search(r"^theme:\n(  .*\n)*  font: false\n", config, flags=re.M)


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
        "!!! note\n\n    ```python\n    x = 2\n    ```\n\n```bash\nls\n```\n\n"
        '```python title="Continued from above"\nprint(x)\n```\n',
        encoding="utf-8",
    )
    blocks = parse_blocks(page)
    assert [(b.lang, b.text, b.is_output, b.continued) for b in blocks] == [
        ("python", "print(1)\n", False, False),
        ("text", "1\n", True, False),
        ("python", "x = 2\n", False, False),
        ("bash", "ls\n", False, False),
        ("python", "print(x)\n", False, True),
    ]
    assert blocks[0].lineno == 4


def test_the_harness_runs_a_block_alone(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```python\nx = 2\n```\n\n```python\n>>> x\n2\n```\n", encoding="utf-8")
    run_page(page, "docs_page")  # in page order, x is defined
    run_page(page, "docs_page", only=0)
    with pytest.raises(pytest.fail.Exception, match="NameError"):
        run_page(page, "docs_page", only=1)


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
