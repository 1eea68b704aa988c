"""The package's shape: no import cycles (imports inside functions included), short functions.

No cap on a module's length: modules are split by concern, where a reader needs it. What a
reader needs at once is a function, so that is what is measured.
"""

from __future__ import annotations

import ast
import io
import tokenize
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "pipeflow"
#: Lines of code a function may have (see :func:`function_lengths` for what counts).
MAX_FUNCTION_LINES = 50
#: Scripts, not the engine: the command line and the demo read top to bottom.
EXEMPT = frozenset({"pipeflow.__main__", "pipeflow.demo"})


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}


def imports(path: Path, name: str, known: set[str]) -> set[str]:
    """The pipeflow modules *path* imports, anywhere in it (``TYPE_CHECKING`` blocks too)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package.split(".")[: len(package.split(".")) - node.level + 1])
                base = f"{base}.{node.module}" if node.module else base
            for alias in node.names:  # `from pipeflow import _alloc` imports a module
                sub = f"{base}.{alias.name}"
                out.add(sub if sub in known else base)
    return {m for m in out if m in known and m != name}


def graph() -> dict[str, set[str]]:
    mods = modules()
    return {name: imports(path, name, set(mods)) for name, path in mods.items()}


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        stack.pop()
        state[node] = 2
        return None

    for node in sorted(edges):
        if node not in state and (found := visit(node)):
            return found
    return None


def test_the_checker_finds_a_cycle() -> None:
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


def test_no_import_cycles() -> None:
    assert find_cycle(graph()) is None


_NOT_CODE = frozenset(
    {
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENCODING,
        tokenize.ENDMARKER,
    }
)
_DEFS = (ast.FunctionDef, ast.AsyncFunctionDef)


def _code_lines(source: str, tree: ast.Module) -> set[int]:
    """The line numbers that hold a code token, docstrings (of any def or class) left out."""
    lines: set[int] = set()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type not in _NOT_CODE:  # a token over several lines holds code on each
            lines.update(range(tok.start[0], tok.end[0] + 1))
    for node in ast.walk(tree):
        if isinstance(node, (*_DEFS, ast.ClassDef, ast.Module)) and ast.get_docstring(node):
            doc = node.body[0]
            lines.difference_update(range(doc.lineno, (doc.end_lineno or doc.lineno) + 1))
    return lines


def _defs(
    node: ast.AST, prefix: str
) -> Iterator[tuple[str, ast.FunctionDef | ast.AsyncFunctionDef]]:
    """Every function and method under *node*, named ``Class.method`` or ``outer.inner``."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, _DEFS):
            yield f"{prefix}{child.name}", child
            yield from _defs(child, f"{prefix}{child.name}.")
        elif isinstance(child, ast.ClassDef):
            yield from _defs(child, f"{prefix}{child.name}.")
        else:
            yield from _defs(child, prefix)


def function_lengths(source: str) -> dict[str, int]:
    """Lines of code of every function and method in *source*, by its qualified name.

    The rule: a function spans its ``def`` line to its last line (decorators left out); of
    those, the lines that hold a code token count. Blank lines, comment-only lines and
    docstrings do not; a statement or string over several lines counts each of its lines.
    A nested function counts inside its parent's span (the parent is that long to read),
    and is measured on its own too.
    """
    tree = ast.parse(source)
    code = _code_lines(source, tree)
    return {
        name: sum(1 for n in code if node.lineno <= n <= (node.end_lineno or node.lineno))
        for name, node in _defs(tree, "")
    }


def long_functions() -> dict[str, int]:
    """``{"module:function": lines}`` for the functions over the limit, outside the scripts."""
    return {
        f"{module}:{name}": n
        for module, path in modules().items()
        if module not in EXEMPT
        for name, n in function_lengths(path.read_text()).items()
        if n > MAX_FUNCTION_LINES
    }


def test_the_counter_counts_code_lines_only() -> None:
    source = '''
@decorator
def outer(a,
          b):
    """A docstring
    over two lines."""

    # a comment
    text = """a string
    over two lines"""

    def inner():
        """Its docstring."""
        return 1  # a comment after code
    return inner


class Box:
    """A class."""

    def method(self):
        pass
'''
    assert function_lengths(source) == {"outer": 7, "outer.inner": 2, "Box.method": 2}
    assert function_lengths("async def f():\n" + "    x = 1\n\n" * 50) == {"f": 51}


def test_no_function_is_over_50_lines_of_code() -> None:
    """No function or method of the package outside ``__main__`` and ``demo`` has more than 50
    lines of code.

    Lines of code: from the ``def`` line (decorators left out) to the last, the lines holding a
    code token, so not blank lines, comments or docstrings; a nested function's lines count in
    its parent too (see :func:`function_lengths`).
    """
    long = long_functions()
    assert long == {}


def test_collate_never_imports_the_parallel_package() -> None:
    edges = graph()
    seen: set[str] = set()
    todo = ["pipeflow.stages.collate"]
    while todo:
        m = todo.pop()
        if m not in seen:
            seen.add(m)
            todo.extend(edges[m])
    assert not {m for m in seen if m.startswith("pipeflow.parallel")}


# -- the rooms: packages by concern (tools/rooms.py) -------------------------------------------
def _rooms_tool():  # type: ignore[no-untyped-def]
    import importlib.util
    import sys

    path = PACKAGE.parent / "tools" / "rooms.py"
    spec = importlib.util.spec_from_file_location("pipeflow_rooms_tool", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # a dataclass looks its module up there
    spec.loader.exec_module(module)
    return module


def test_every_room_stands_above_the_rooms_it_imports() -> None:
    tool = _rooms_tool()
    rooms, edges, which = tool.read()
    assert {r.name for r in rooms if r.modules} == {name for name, _ in tool.ROOMS}
    assert tool.upward(edges) == [], {e: sorted(which[e]) for e in tool.upward(edges)}


def test_the_rooms_checker_finds_an_upward_import() -> None:
    from collections import Counter

    tool = _rooms_tool()
    assert tool.upward(Counter({("engine", "stages"): 1, ("stages", "engine"): 3})) == [
        ("engine", "stages")
    ]


def test_the_design_page_picture_is_the_one_this_code_draws() -> None:
    tool = _rooms_tool()
    rooms, edges, _ = tool.read()
    drawn = (PACKAGE.parent / "docs" / "concepts" / "rooms.svg").read_text(encoding="utf-8")
    assert drawn == tool.svg(rooms, edges), (
        "redraw it: python tools/rooms.py --svg docs/concepts/rooms.svg"
    )
