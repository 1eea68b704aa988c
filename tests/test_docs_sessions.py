"""Every ``>>>`` session in the documentation can be typed at Python's interactive prompt.

The documentation is the pages (``docs/**/*.md``) and the docstrings of ``pipeflow/**/*.py``,
which the reference pages show (mkdocstrings) and pytest runs as doctests
(``--doctest-modules``).

doctest (which ``tests/test_docs.py`` runs the sessions with) reads an example as a whole, so
it accepts a session the real prompt refuses. At the prompt a compound statement (``for``,
``def``, ``with``, ``if``, ``class``, ``try``...) stays open until an empty ``...`` line ends
it: a session that goes from an indented ``...`` line straight to the next ``>>>`` is a
``SyntaxError`` for a reader who types it, and so is an empty ``...`` line in the middle of a
class body (the prompt ends the class there). A real session looks like this::

    >>> for word in ["to", "be"]:
    ...     print(word)
    ...
    to
    be
    >>> word
    'be'

Here each session is fed line by line to :class:`code.InteractiveConsole`, as a person typing
it would: the ``>>> `` and ``... `` prompts stripped, an empty ``...`` line as an empty line,
the output lines not typed. The console only compiles: nothing runs here (``test_docs.py``
runs the examples). A session fails when a line is a syntax error, when output is shown while
the prompt still waits for the rest of a block (no output comes before the empty ``...``),
or when it ends inside an unfinished block.

The sessions of a page are the blocks that ``test_docs.py`` takes for doctests, read with its
helpers. Those of a module are read from its source with :mod:`ast` (nothing is imported): in
each docstring (of the module, a class or a function), a session starts at a ``>>>`` line and
runs to the next blank line, as doctest reads one (examples with no blank line between them
show as one session), the ``>>>`` line's indentation taken off every line. A problem in a
module is reported as ``pipeflow/<module>.py:<line>``.
"""

from __future__ import annotations

import ast
import code
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from test_docs import PAGES, ROOT, is_doctest, page_id, parse_blocks

SESSION_TAGS = {"python", "pycon"}  # test_docs.py refuses pycon; a session is one all the same
MODULES = sorted((ROOT / "pipeflow").rglob("*.py"))

# Pages whose sessions a reader can't type at the prompt today, kept here so that the suite
# passes while they wait for their owners, with the lines (as of this list) that the prompt
# refuses: most need an empty "..." line before them, to end the block above. strict: a page
# fixed must leave this list (its test then passes, and an XPASS fails the run).
EXPECTED_FAILURES: dict[str, str] = {}


@dataclass
class Session:
    path: Path
    lineno: int  # line of the session's first line in the Markdown file (1-based)
    lines: list[str]


def sessions_of(path: Path) -> list[Session]:
    return [
        Session(path, block.lineno, block.text.splitlines())
        for block in parse_blocks(path)
        if block.lang in SESSION_TAGS and is_doctest(block)
    ]


def module_id(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def docstrings_of(path: Path) -> list[tuple[int, str]]:
    """The docstrings of the module at *path*, its classes' and its functions', each with the
    line of its opening quotes (1-based), in the order of the file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found = []
    for node in ast.walk(tree):
        kinds = (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)
        if isinstance(node, kinds) and ast.get_docstring(node, clean=False) is not None:
            literal = node.body[0]
            assert isinstance(literal, ast.Expr) and isinstance(literal.value, ast.Constant)
            found.append((literal.value.lineno, literal.value.value))
    return sorted(found)


def docstring_sessions(text: str, lineno: int = 1) -> list[tuple[int, list[str]]]:
    """The sessions in a docstring *text* whose first line is line *lineno* of its file, each
    with the line of its first line. The docstring's k-th line is taken for line lineno + k
    of the file: true unless the docstring holds a backslash-newline or a ``\\n`` escape."""
    lines = text.splitlines()
    sessions = []
    k = 0
    while k < len(lines):
        line = lines[k]
        if not _prompted(line.lstrip(), ">>>"):
            k += 1
            continue
        indent = len(line) - len(line.lstrip())
        end = k
        while end < len(lines) and lines[end].strip():
            end += 1
        sessions.append((lineno + k, [each[indent:] for each in lines[k:end]]))
        k = end
    return sessions


def module_sessions(path: Path) -> list[Session]:
    return [
        Session(path, first, lines)
        for lineno, text in docstrings_of(path)
        for first, lines in docstring_sessions(text, lineno)
    ]


class _Typist(code.InteractiveConsole):
    """A console that compiles what is typed but runs nothing, and records syntax errors
    instead of printing them."""

    def __init__(self) -> None:
        super().__init__(filename="<stdin>")
        self.syntax_errors: list[BaseException] = []

    def runcode(self, code: object) -> None:
        pass  # test_docs.py runs the examples; here only what the prompt accepts matters

    def showsyntaxerror(self, filename: str | None = None, **kwargs: object) -> None:
        error = sys.exc_info()[1]
        assert error is not None
        self.syntax_errors.append(error)


def _prompted(line: str, prompt: str) -> bool:
    return line == prompt or line.startswith(prompt + " ")


def problems(lines: list[str], first: int = 1) -> list[str]:
    """What goes wrong when *lines* (a session) are typed at the prompt, one message per
    problem, naming the line (*first* is the number of the session's first line)."""
    console = _Typist()
    found: list[str] = []
    waiting = False  # the prompt shows "... ": the statement typed so far is not complete
    in_code = False  # the line before was typed (a "..." line continues it; else it's output)
    broken = False  # the statement being typed was refused: its other lines would be too
    for k, line in enumerate(lines):
        where = f"line {first + k}"
        typed = _prompted(line, ">>>") or (in_code and _prompted(line, "..."))
        if broken and typed and not _prompted(line, ">>>"):
            continue  # one message per refused statement
        broken = False
        if not typed:
            in_code = False
            if waiting:
                found.append(
                    f"{where}: output shown while the prompt still waits for the end of a block "
                    f"(an empty '...' line must end it first): {line!r}"
                )
                console.resetbuffer()
                waiting = False
            continue
        # A ">>>" line while a block is open is taken as part of the block, as at the prompt:
        # the console reports the syntax error.
        errors = len(console.syntax_errors)
        waiting = console.push(line[4:])
        in_code = True
        if len(console.syntax_errors) > errors:
            error = console.syntax_errors[-1]
            found.append(f"{where}: {type(error).__name__}: {error} ({line!r})")
            waiting = False  # the console dropped what it held, as the prompt does
            broken = True
    if waiting:
        found.append(
            f"line {first + len(lines) - 1}: the session ends inside an unfinished block "
            "(end it with an empty '...' line)"
        )
    return found


def page_problems(path: Path) -> list[str]:
    where = page_id(path)
    return [
        f"{where}:{problem.removeprefix('line ')}"
        for session in sessions_of(path)
        for problem in problems(session.lines, session.lineno)
    ]


def module_problems(path: Path) -> list[str]:
    where = module_id(path)
    return [
        f"{where}:{problem.removeprefix('line ')}"
        for session in module_sessions(path)
        for problem in problems(session.lines, session.lineno)
    ]


def _cases() -> list[pytest.ParameterSet]:
    cases = []
    for path in PAGES:
        if not sessions_of(path):
            continue
        marks = []
        if page_id(path) in EXPECTED_FAILURES:
            reason = f"not typeable yet, lines {EXPECTED_FAILURES[page_id(path)]}"
            marks.append(pytest.mark.xfail(reason=reason, strict=True))
        cases.append(pytest.param(path, id=page_id(path), marks=marks))
    return cases


def test_there_are_sessions() -> None:
    assert sum(len(sessions_of(path)) for path in PAGES) > 50


def test_the_expected_failures_name_pages_with_sessions() -> None:
    with_sessions = {page_id(path) for path in PAGES if sessions_of(path)}
    assert set(EXPECTED_FAILURES) <= with_sessions


@pytest.mark.parametrize("path", _cases())
def test_sessions_can_be_typed_at_the_prompt(path: Path) -> None:
    found = page_problems(path)
    if found:
        pytest.fail("typed at the >>> prompt:\n" + "\n".join(found), pytrace=False)


def _module_cases() -> list[pytest.ParameterSet]:
    return [pytest.param(path, id=module_id(path)) for path in MODULES if module_sessions(path)]


def test_there_are_docstring_sessions() -> None:
    assert sum(len(module_sessions(path)) for path in MODULES) > 50


@pytest.mark.parametrize("path", _module_cases())
def test_docstring_sessions_can_be_typed_at_the_prompt(path: Path) -> None:
    found = module_problems(path)
    if found:
        pytest.fail("typed at the >>> prompt:\n" + "\n".join(found), pytrace=False)


# -- the checker itself -----------------------------------------------------------------------

GOOD = {
    "simple statements": [">>> x = 1", ">>> x", "1"],
    "a loop ended by an empty ...": [
        ">>> for i in range(2):",
        "...     print(i)",
        "...",
        "0",
        "1",
        ">>> i",
        "1",
    ],
    "a function, then a call": [
        ">>> def f():",
        "...     return 1",
        "...",
        ">>> f()",
        "1",
    ],
    "an expression over several lines": [">>> (1 +", "...  2)", "3"],
    "a traceback with ... in it": [
        ">>> 1 / 0",
        "Traceback (most recent call last):",
        "  ...",
        "ZeroDivisionError: division by zero",
    ],
    "output with a line that starts with ...": [
        r">>> print('first\n... and so on')",
        "first",
        "... and so on",
    ],
    "an empty prompt": [">>>", ">>> 1", "1"],
}

BAD = {
    "a >>> right after a block": [">>> def f():", "...     return 1", ">>> f()", "1"],
    "a session that ends in a block": [">>> def f():", "...     return 1"],
    "output before the block ends": [">>> for i in range(1):", "...     print(i)", "0"],
    "an empty ... inside a class": [
        ">>> class A:",
        "...     def f(self):",
        "...         return 1",
        "...",
        "...     def g(self):",
        "...         return 2",
        "...",
    ],
    "a syntax error": [">>> x = = 1"],
}


@pytest.mark.parametrize("lines", GOOD.values(), ids=GOOD.keys())
def test_the_checker_passes(lines: list[str]) -> None:
    assert problems(lines) == []


@pytest.mark.parametrize("lines", BAD.values(), ids=BAD.keys())
def test_the_checker_fails(lines: list[str]) -> None:
    assert problems(lines)


def test_the_checker_names_the_line() -> None:
    lines = [">>> def f():", "...     return 1", ">>> f()", "1"]
    (problem,) = problems(lines, first=10)
    assert problem.startswith("line 12: SyntaxError")


def test_the_checker_runs_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    assert problems([">>> print('ran')", "ran"]) == []
    assert capsys.readouterr().out == ""


def test_docstring_sessions_are_read_as_doctest_reads_them(tmp_path: Path) -> None:
    path = tmp_path / "module.py"
    path.write_text(
        '''"""A module.

    >>> 1
    1
"""


class A:
    """A class.

    Examples:
        >>> def f():
        ...     return 1
        >>> f()
        1

        >>> for i in range(1):
        ...     print(i)
        ...
        0
    """

    def g(self) -> None:
        """No session here: ``>>> 1`` is not at the start of a line."""
''',
        encoding="utf-8",
    )
    sessions = module_sessions(path)
    assert [(session.lineno, session.lines) for session in sessions] == [
        (3, [">>> 1", "1"]),
        (12, [">>> def f():", "...     return 1", ">>> f()", "1"]),
        (17, [">>> for i in range(1):", "...     print(i)", "...", "0"]),
    ]
    (problem,) = [
        problem for session in sessions for problem in problems(session.lines, session.lineno)
    ]
    assert problem.startswith("line 14: SyntaxError")
