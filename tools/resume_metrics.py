"""How big pipeflow's exact-resumption machinery is: the numbers of the "one resume protocol" issue.

Usage::

    python tools/resume_metrics.py                  # this checkout: a table
    python tools/resume_metrics.py --list           # and what each metric counted
    python tools/resume_metrics.py --root /tmp/before --json
    python tools/resume_metrics.py --no-trace       # metrics 1-7 only (no subprocess)

Everything but metric 8 reads the source with :mod:`ast` (docstrings and comments never
count as a use); metric 8 runs pipelines in a subprocess with ``--root`` first on
``sys.path``. The table shows each metric's value, the issue's hand count of "today"
(``issue``), the goal, and whether the value meets it.

Definitions (paths are relative to ``ROOT/pipeflow``; a *unit* is a module-level function, a
method of a class at any depth, or a class; a nested function belongs to its unit):

Vocabulary:
    *Resume names* (:data:`RESUME_NAMES`) are the method and attribute names through which the
    resume machinery talks to stages, sources, records, loaders and worker jobs: the issue's 18
    (:data:`ISSUE_NAMES`) plus six more that exist for resumption only and that the issue did
    not list (:data:`FOUND_NAMES`: ``identity``, the fingerprint a state is compared on;
    ``restore`` / ``snapshot``, a worker job's state for a resumed pass; ``reads_ahead`` and
    ``history``, whether stateful objects keep per-item snapshots; ``pass_epoch``, read only
    by ``DataLoader.state_dict``), and the declared protocol's own (:data:`PROTOCOL_NAMES`:
    ``resume``, a stage's rule; ``begin``, how a record class starts a pass's record). A
    redesign that names its protocol otherwise adds its names here; ``--list`` shows the
    candidates (defined names containing record/resum/restor/snapshot/state) the vocabulary
    lacks. *Core modules* (:data:`CORE`) are the resume-only
    modules: ``state``, ``_state_check``, ``_restarts``, ``_objects``, ``_seeds``,
    ``_facade_state``, ``parallel/_records``, ``parallel/_states``, ``readers/_versions`` (and
    any ``resume*.py`` / ``_resume*.py`` a redesign adds); since the ``resume/`` package holds
    the protocol, every module in it (``_seal`` and ``_rngs`` too, which moved in) and the
    public face ``state.py``.

1. Modules that touch resume: a core module, or one whose code defines a function or method
   with a resume name, reads or writes an attribute with one (``x.name``), passes or takes
   it as a keyword or parameter, probes it (``getattr``/``hasattr`` with that string), or
   imports from a core module.
2. Resume method names: the resume names that some module still defines (``def``, a class
   attribute, a ``self.`` attribute, a ``__slots__`` entry) or uses.
3. Members on ``Stage``: the distinct public names (no leading ``_``) that class ``Stage`` in
   ``engine/_stage.py`` defines in its body: methods, properties, class attributes.
4. ``apply`` overrides for resume: methods ``apply`` of ``Stage`` subclasses (found by base
   name, transitively) that reach the resume fields of ``Hooks`` (``record``, ``saved``,
   ``history``, ``resume``), themselves or through a package function they hand ``hooks`` to
   (followed by name, three calls deep). Overrides that only use ``hooks.stats`` or never
   look at hooks are listed apart.
5. ``getattr`` probes: calls ``getattr(x, "<name>"[, default])`` or ``hasattr(x, "<name>")``
   where ``<name>`` is a resume name or ``x`` is a record (an expression ending in
   ``.record``, or a name bound in the same unit to ``….record`` or ``….new_record(…)``).
   Probes of the user's ``state_dict``/``load_state_dict`` (torchdata's ``Stateful``
   protocol, which stays) are not counted.
6. State checkers: units of modules that touch resume that validate a loaded state: named
   ``check``, ``check_*``, ``verify*`` (leading ``_`` ignored) in a core module or with a
   resume name (``check_record``, ``check_pass``, ``verify_record``, ``check_state``), or
   whose code holds a string starting ``load_state_dict:`` (every load-time refusal's
   prefix: ``integer``, ``record_keys``, ``_fail``...), or whose docstring starts with
   "Refuse". Lines: their physical lines (``def`` to end, decorators included), and the
   number of modules they are in.
7. Resume lines: the physical lines of the core modules, plus, in the other modules, the
   units that are resume code: a function or method with a resume name, a checker (6), a
   resume ``apply`` override (4), a record class (one that defines ``after``: whole), a class
   all of whose methods are resume code (whole), and a private module-level function called
   only from resume code of its module; and the few units that are resume-only by reading
   though no name says so (:data:`READ_UNITS`: a worker's ``Snapshotter``, ``Tracker`` and
   ``restore_worker``; ``_wrappers.cut``). Resume work interleaved in other functions (the
   consumer's ``Pass`` counting ``progress.delivered``, ``_run``'s delivery order and
   workers' states) is not counted. The share is of all physical lines of the package.
8. Resume modules on a batch of a pipeline that never resumes: a subprocess builds
   ``indices(10_000) | batch(32) | parallel_map(f, workers=2, backend="thread") | map(len)``
   and ``indices(ds) | shuffle(seed=0) | batch(32) | fetch(ds) | collate()`` over a small
   map-style dataset, never takes or loads a state, takes ``--warm`` batches of each, then
   records with :func:`sys.setprofile` and :func:`threading.setprofile` (installed before the
   pass, switched on after warm-up) which pipeflow modules have Python functions called
   (generators resumed included) while ``--batches`` more batches flow, in the main thread
   and the workers' threads. Counted: those of them that touch resume (1). ``--list`` also
   shows every function that ran, marking the resume code (7) among them.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ISSUE_NAMES = (
    "resumption",
    "new_record",
    "check_record",
    "check_pass",
    "requires_record",
    "idle_record",
    "ended_record",
    "watch",
    "rotation",
    "restores",
    "seed_slots",
    "with_seeds",
    "after",
    "verify_record",
    "pass_record",
    "resume_from",
    "check_state",
    "apply_state",
)
FOUND_NAMES = ("identity", "restore", "snapshot", "reads_ahead", "history", "pass_epoch")
#: The names the declared protocol (``state.Rule``, ``Record.begin``) added: a stage's rule,
#: how a record class begins a pass's record, and a recording source's rule's ``must_hold``
#: (a state must hold its record) and ``idle`` (its record between passes).
PROTOCOL_NAMES = ("resume", "begin", "must_hold", "idle")
RESUME_NAMES = frozenset(ISSUE_NAMES + FOUND_NAMES + PROTOCOL_NAMES)

CORE = (
    "state.py",
    "_state_check.py",
    "_restarts.py",
    "_objects.py",
    "_seeds.py",
    "facade/_facade_state.py",
    "parallel/_records.py",
    "parallel/_states.py",
    "sources/readers/_versions.py",
)
#: Units that are resume code by reading, though no name says so (metric 7; module: names).
READ_UNITS = {
    "parallel/pools/_worker.py": ("Snapshotter", "Tracker", "restore_worker"),
    "engine/_wrappers.py": ("cut",),
}
#: The fields of ``Hooks`` that carry resumption (``stats`` and ``resources`` do not).
HOOK_FIELDS = frozenset({"record", "saved", "history", "resume"})
#: The user's Stateful protocol: probing for it is not the resume protocol's doing.
USER_PROTOCOL = frozenset({"state_dict", "load_state_dict"})
CANDIDATE_STEMS = ("record", "resum", "restor", "snapshot", "state")

#: The issue's hand counts of "today", and the goals.
ISSUE = {
    "modules": 27,
    "names": 18,
    "stage_members": 20,
    "apply_overrides": 7,
    "probes": 11,
    "checkers": "35 / 648 lines / 15 modules",
    "lines": "2,949 (15%)",
    "trace": 4,
}
GOALS: dict[str, tuple[str, Callable[[Any], bool]]] = {
    "modules": ("<= 12", lambda v: v <= 12),
    "names": ("<= 5", lambda v: v <= 5),
    "stage_members": ("<= 10", lambda v: v <= 10),
    "apply_overrides": ("0", lambda v: v == 0),
    "probes": ("0", lambda v: v == 0),
    "checkers": ("1, <= 250 lines", lambda v: v[0] <= 1 and v[1] <= 250),
    "lines": ("< 2,000", lambda v: v < 2000),
    "trace": ("0", lambda v: v == 0),
}

FuncDef = ast.FunctionDef | ast.AsyncFunctionDef


@dataclass
class Unit:
    """A module-level function, a method, or a class, with its physical line span."""

    module: str
    qualname: str
    node: ast.AST
    start: int
    end: int
    cls: str | None = None  # the class a method is defined in

    @property
    def name(self) -> str:
        return self.qualname.rsplit(".", 1)[-1]

    @property
    def lines(self) -> int:
        return self.end - self.start + 1

    def where(self) -> str:
        return f"{self.module}:{self.start} {self.qualname}"


@dataclass
class Module:
    path: str  # relative to the package, with "/"
    tree: ast.Module
    lines: int
    units: list[Unit] = field(default_factory=list)  # functions and methods
    classes: list[Unit] = field(default_factory=list)
    core: bool = False


# -- reading the package ----------------------------------------------------------------------
def _span(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) -> tuple[int, int]:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    end = node.end_lineno
    assert end is not None
    return first, end


def _collect(mod: Module) -> None:
    def visit(body: Iterable[ast.stmt], prefix: str, cls: str | None) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                mod.units.append(Unit(mod.path, prefix + node.name, node, *_span(node), cls))
            elif isinstance(node, ast.ClassDef):
                mod.classes.append(Unit(mod.path, prefix + node.name, node, *_span(node)))
                visit(node.body, f"{prefix}{node.name}.", node.name)
            elif isinstance(node, ast.If | ast.Try):  # `if TYPE_CHECKING:` and the like
                for part in (
                    node.body,
                    node.orelse,
                    *(h.body for h in getattr(node, "handlers", [])),
                ):
                    visit(part, prefix, cls)

    visit(mod.tree.body, "", None)


def load(root: Path) -> dict[str, Module]:
    pkg = root / "pipeflow"
    if not pkg.is_dir():
        sys.exit(f"resume_metrics: no pipeflow package under {root}")
    out: dict[str, Module] = {}
    for path in sorted(pkg.rglob("*.py")):
        rel = path.relative_to(pkg).as_posix()
        text = path.read_text(encoding="utf-8")
        mod = Module(rel, ast.parse(text, str(path)), len(text.splitlines()))
        stem = Path(rel).name
        mod.core = (
            rel in CORE or rel.startswith("resume/") or stem.startswith(("resume", "_resume"))
        )
        _collect(mod)
        out[rel] = mod
    return out


def _docstring_nodes(tree: ast.AST) -> set[int]:
    """The ids of the string constants that are docstrings."""
    out: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                out.add(id(body[0].value))
    return out


def _strings(node: ast.AST, docs: set[int]) -> Iterator[str]:
    for n in ast.walk(node):
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs:
            yield n.value


def _imported_core(mod: Module, modules: dict[str, Module]) -> list[str]:
    """The core modules *mod* imports from."""
    core_names = {_dotted(p) for p, m in modules.items() if m.core}
    found: list[str] = []
    typing_only = {
        id(n)
        for block in ast.walk(mod.tree)
        if isinstance(block, ast.If) and "TYPE_CHECKING" in ast.unparse(block.test)
        for stmt in block.body
        for n in ast.walk(stmt)
    }
    for node in ast.walk(mod.tree):
        if id(node) in typing_only:  # a type-only import runs nothing of resume
            continue
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found += [n for n in names if n in core_names and n != _dotted(mod.path)]
    return sorted(set(found))


def _dotted(rel: str) -> str:
    parts = ["pipeflow", *rel.removesuffix(".py").split("/")]
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _probe(node: ast.AST) -> tuple[str, ast.expr, str] | None:
    """``(function, object, name)`` of a ``getattr``/``hasattr`` call with a literal name."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and len(node.args) >= 2
        and isinstance(node.args[1], ast.Constant)
        and isinstance(node.args[1].value, str)
    ):
        return node.func.id, node.args[0], node.args[1].value
    return None


# -- metric 1 and 2: modules, names ----------------------------------------------------------
def name_uses(mod: Module) -> dict[str, list[str]]:
    """Each resume name *mod* uses, with how (``def``, ``attr``, ``kw``, ``param``,
    ``probe``, ``slot``)."""
    out: dict[str, list[str]] = {}

    def note(name: str, how: str, line: int) -> None:
        if name in RESUME_NAMES:
            out.setdefault(name, []).append(f"{how}@{line}")

    for node in ast.walk(mod.tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            note(node.name, "def", node.lineno)
            a = node.args
            for arg in (*a.posonlyargs, *a.args, *a.kwonlyargs):
                note(arg.arg, "param", node.lineno)
        elif isinstance(node, ast.Attribute):
            note(node.attr, "attr", node.lineno)
        elif isinstance(node, ast.keyword) and node.arg:
            note(node.arg, "kw", node.value.lineno)
        elif isinstance(node, ast.ClassDef):
            for stmt in node.body:
                targets = (
                    stmt.targets
                    if isinstance(stmt, ast.Assign)
                    else [stmt.target]
                    if isinstance(stmt, ast.AnnAssign)
                    else []
                )
                for t in targets:
                    if isinstance(t, ast.Name):
                        note(t.id, "def", stmt.lineno)
                        if t.id == "__slots__":
                            for s in _strings(stmt, set()):
                                note(s, "slot", stmt.lineno)
        probe = _probe(node)
        if probe is not None:
            note(probe[2], "probe", probe[1].lineno)
    return out


def touching(modules: dict[str, Module]) -> dict[str, list[str]]:
    """The modules that touch resume (metric 1), each with why."""
    out: dict[str, list[str]] = {}
    for rel, mod in modules.items():
        why: list[str] = []
        if mod.core:
            why.append("core")
        uses = name_uses(mod)
        if uses:
            why.append("names: " + ", ".join(sorted(uses)))
        imported = _imported_core(mod, modules)
        if imported:
            why.append("imports: " + ", ".join(imported))
        if why:
            out[rel] = why
    return out


def names(modules: dict[str, Module]) -> dict[str, list[str]]:
    """The resume names in use (metric 2), each with the modules that define them."""
    found: dict[str, set[str]] = {}
    for rel, mod in modules.items():
        for name, hows in name_uses(mod).items():
            entry = found.setdefault(name, set())
            if any(h.startswith(("def", "slot")) for h in hows):
                entry.add(rel)
    return {n: sorted(found[n]) for n in sorted(found)}


def candidates(modules: dict[str, Module]) -> list[str]:
    """Defined names that look like resume protocol names and are not in the vocabulary."""
    out: set[str] = set()
    for mod in modules.values():
        if mod.core:
            continue
        for unit in mod.units:
            n = unit.name
            if n.startswith("__") or n in RESUME_NAMES or n in USER_PROTOCOL:
                continue
            if unit.cls is not None and any(s in n for s in CANDIDATE_STEMS):
                out.add(f"{n} ({unit.where()})")
    return sorted(out)


# -- metric 3: Stage ---------------------------------------------------------------------------
def stage_members(modules: dict[str, Module]) -> list[str]:
    mod = modules.get("engine/_stage.py")
    cls = next((c for c in (mod.classes if mod else []) if c.qualname == "Stage"), None)
    if cls is None:
        return []
    assert isinstance(cls.node, ast.ClassDef)
    out: list[str] = []
    for stmt in cls.node.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            out.append(stmt.name)
        elif isinstance(stmt, ast.Assign):
            out += [t.id for t in stmt.targets if isinstance(t, ast.Name)]
        elif isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            out.append(stmt.target.id)
    return sorted({n for n in out if not n.startswith("_")})


# -- metric 4: apply overrides --------------------------------------------------------------
def _functions(modules: dict[str, Module]) -> dict[str, list[Unit]]:
    out: dict[str, list[Unit]] = {}
    for mod in modules.values():
        for unit in mod.units:
            if unit.cls is None:
                out.setdefault(unit.name, []).append(unit)
    return out


def _reaches_hooks(
    func: ast.AST, param: str, funcs: dict[str, list[Unit]], depth: int, why: list[str]
) -> bool:
    """Whether *func* reads a resume field of the hooks bound to *param*, itself or through
    a package function it hands them to."""
    for node in ast.walk(func):
        if (
            isinstance(node, ast.Attribute)
            and isinstance(node.value, ast.Name)
            and node.value.id == param
            and node.attr in HOOK_FIELDS
        ):
            why.append(f"{param}.{node.attr}@{node.lineno}")
            return True
    if depth == 0:
        return False
    for node in ast.walk(func):
        if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
            continue
        for callee in funcs.get(node.func.id, []):
            assert isinstance(callee.node, ast.FunctionDef | ast.AsyncFunctionDef)
            params = [a.arg for a in (*callee.node.args.posonlyargs, *callee.node.args.args)]
            bound = [
                params[i]
                for i, a in enumerate(node.args)
                if i < len(params) and isinstance(a, ast.Name) and a.id == param
            ]
            bound += [
                k.arg
                for k in node.keywords
                if isinstance(k.value, ast.Name) and k.value.id == param and k.arg
            ]
            for p in bound:
                sub: list[str] = []
                if _reaches_hooks(callee.node, p, funcs, depth - 1, sub):
                    why.append(f"{callee.name}({p}) -> {' '.join(sub)} [{callee.module}]")
                    return True
    return False


def apply_overrides(modules: dict[str, Module]) -> tuple[list[str], list[str]]:
    """The resume ``apply`` overrides (metric 4), and the other overrides."""
    bases: dict[str, set[str]] = {}
    for mod in modules.values():
        for c in mod.classes:
            assert isinstance(c.node, ast.ClassDef)
            names_ = {ast.unparse(b).split("[")[0].rsplit(".", 1)[-1] for b in c.node.bases}
            bases.setdefault(c.name, set()).update(names_)
    stages = {"Stage"}
    while True:
        more = {c for c, bs in bases.items() if bs & stages} - stages
        if not more:
            break
        stages |= more
    funcs = _functions(modules)
    resume: list[str] = []
    other: list[str] = []
    for mod in modules.values():
        for unit in mod.units:
            if unit.name != "apply" or unit.cls not in stages or unit.cls == "Stage":
                continue
            assert isinstance(unit.node, ast.FunctionDef | ast.AsyncFunctionDef)
            why: list[str] = []
            if _reaches_hooks(unit.node, "hooks", funcs, 3, why):
                resume.append(f"{unit.where()}: {'; '.join(why)}")
            else:
                uses = sorted(
                    {
                        n.attr
                        for n in ast.walk(unit.node)
                        if isinstance(n, ast.Attribute)
                        and isinstance(n.value, ast.Name)
                        and n.value.id == "hooks"
                    }
                )
                other.append(f"{unit.where()}: hooks.{', hooks.'.join(uses) or '(unused)'}")
    return resume, other


# -- metric 5: probes -------------------------------------------------------------------------
def _is_record(expr: ast.expr, bound: set[str]) -> bool:
    if isinstance(expr, ast.Attribute):
        return expr.attr == "record"
    return isinstance(expr, ast.Name) and expr.id in bound


def probes(modules: dict[str, Module]) -> list[str]:
    out: list[str] = []
    for mod in modules.values():
        scopes: list[ast.AST] = [u.node for u in mod.units]
        seen: set[int] = set()
        for scope in scopes:
            bound: set[str] = set()
            for node in ast.walk(scope):
                if isinstance(node, ast.Assign) and len(node.targets) == 1:
                    t, v = node.targets[0], node.value
                    rec = (isinstance(v, ast.Attribute) and v.attr == "record") or (
                        isinstance(v, ast.Call)
                        and isinstance(v.func, ast.Attribute)
                        and v.func.attr == "new_record"
                    )
                    if rec and isinstance(t, ast.Name):
                        bound.add(t.id)
            for node in ast.walk(scope):
                probe = _probe(node)
                if probe is None or id(node) in seen:
                    continue
                fn, obj, name = probe
                if name in USER_PROTOCOL:
                    continue
                if name in RESUME_NAMES or _is_record(obj, bound):
                    seen.add(id(node))
                    out.append(f"{mod.path}:{obj.lineno} {fn}({ast.unparse(obj)}, {name!r})")
    return sorted(out, key=_natural)


def _natural(text: str) -> tuple[str, int]:
    path, _, rest = text.partition(":")
    return path, int(rest.split(" ")[0]) if rest.split(" ")[0].isdigit() else 0


# -- metric 6 and 7: checkers, resume lines ------------------------------------------------
def checkers(modules: dict[str, Module], touched: set[str]) -> list[Unit]:
    out: list[Unit] = []
    for rel, mod in modules.items():
        if rel not in touched:
            continue
        docs = _docstring_nodes(mod.tree)
        for unit in mod.units:
            bare = unit.name.lstrip("_")
            named = bare == "check" or bare.startswith(("check_", "verify"))
            if named and (mod.core or unit.name in RESUME_NAMES):
                out.append(unit)
                continue
            if any(s.startswith("load_state_dict:") for s in _strings(unit.node, docs)):
                out.append(unit)
                continue
            doc = ast.get_docstring(unit.node)  # type: ignore[arg-type]
            about_state = doc is not None and ("record" in doc or "state" in doc)
            if about_state and doc is not None and doc.split(maxsplit=1)[0] == "Refuse":
                out.append(unit)
    return out


def resume_units(
    modules: dict[str, Module], checks: list[Unit], applies: list[str]
) -> dict[str, list[tuple[Unit, str]]]:
    """Per mixed module, its resume units (metric 7), each with why (no overlaps)."""
    checker_ids = {id(u.node) for u in checks}
    apply_at = {a.split(" ")[0] for a in applies}  # "module:line"
    out: dict[str, list[tuple[Unit, str]]] = {}
    for rel, mod in modules.items():
        if mod.core:
            continue
        chosen: dict[int, tuple[Unit, str]] = {}
        record_classes = []
        for c in mod.classes:
            assert isinstance(c.node, ast.ClassDef)
            methods = [
                u for u in mod.units if u.cls == c.name and u.start >= c.start and u.end <= c.end
            ]
            if any(m.name == "after" for m in methods):
                record_classes.append((c, "record class (defines after)"))
        read = READ_UNITS.get(rel, ())
        record_classes += [(c, "resume-only by reading") for c in mod.classes if c.qualname in read]
        for u in mod.units:
            if u.qualname in read:
                chosen[id(u.node)] = (u, "resume-only by reading")
            elif u.name in RESUME_NAMES:
                chosen[id(u.node)] = (u, "resume name")
            elif id(u.node) in checker_ids:
                chosen[id(u.node)] = (u, "checker")
            elif f"{u.module}:{u.start}" in apply_at:
                chosen[id(u.node)] = (u, "resume apply")
        for c in mod.classes:
            methods = [u for u in mod.units if c.start <= u.start and u.end <= c.end]
            if methods and all(id(m.node) in chosen for m in methods):
                record_classes.append((c, "all its methods are resume code"))
        # private module-level helpers called only from resume code (to a fixed point)
        calls: dict[str, set[int]] = {}
        for u in mod.units:
            for node in ast.walk(u.node):
                if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                    calls.setdefault(node.func.id, set()).add(id(u.node))
        inside = {
            id(m.node)
            for c, _ in record_classes
            for m in mod.units
            if c.start <= m.start and m.end <= c.end
        }
        # what a helper may be called from: resume names, checkers, record classes' methods
        # (not an apply override: what it hands its items to is the stage's own work)
        seeds = {k for k, (_, why) in chosen.items() if why != "resume apply"}
        seeds |= {
            id(m.node)
            for c, why in record_classes
            if why.startswith("record")
            for m in mod.units
            if c.start <= m.start and m.end <= c.end
        }
        changed = True
        while changed:
            changed = False
            resume_ids = seeds | {k for k, (_, why) in chosen.items() if why.startswith("helper")}
            for u in mod.units:
                if u.cls is not None or not u.name.startswith("_") or id(u.node) in chosen:
                    continue
                callers = calls.get(u.name, set()) - {id(u.node)}
                if callers and callers <= resume_ids:
                    chosen[id(u.node)] = (u, "helper of resume code only")
                    changed = True
        units = [(c, why) for c, why in record_classes]
        units += [(u, why) for k, (u, why) in chosen.items() if k not in inside]
        # a unit inside a counted class is not counted twice
        spans = [(c.start, c.end) for c, _ in record_classes]
        units = [
            (u, why)
            for u, why in units
            if u in [c for c, _ in record_classes]
            or not any(s <= u.start and u.end <= e for s, e in spans)
        ]
        if units:
            out[rel] = sorted(units, key=lambda x: x[0].start)
    return out


# -- metric 8: what runs per batch ---------------------------------------------------------
TRACE = r"""
import json, sys, threading
root, warm, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
sys.path.insert(0, root)
import pipeflow as pf
pkg = __import__("os").path.join(root, "pipeflow", "")
seen, on = set(), [False]
def prof(frame, event, arg):
    if on[0] and event == "call":
        f = frame.f_code.co_filename
        if f.startswith(pkg):
            code = frame.f_code
            seen.add((f[len(pkg):].replace("\\", "/"), code.co_firstlineno, code.co_name))
threading.setprofile(prof)
sys.setprofile(prof)
class DS:
    def __len__(self): return 4096
    def __getitem__(self, i): return [i, i + 1.0]
def f(b): return [x * 2 for x in b]
ds = DS()
loaders = {
    "thread parallel_map": pf.indices(10_000) | pf.batch(32)
        | pf.parallel_map(f, workers=2, backend="thread") | pf.map(len),
    "map-style fetch/collate": pf.indices(ds) | pf.shuffle(seed=0) | pf.batch(32)
        | pf.fetch(ds) | pf.collate(),
}
out = {}
for name, loader in loaders.items():
    it = iter(loader)
    for _ in range(warm): next(it)
    seen.clear(); on[0] = True
    for _ in range(batches): next(it)
    on[0] = False
    out[name] = sorted(seen)  # (module, first line, function)
    it.close(); loader.close()
sys.setprofile(None); threading.setprofile(None)
print("RESULT" + json.dumps(out))
"""


def trace(root: Path, warm: int, batches: int) -> dict[str, list[tuple[str, int, str]]]:
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "trace.py"
        script.write_text(TRACE)
        done = subprocess.run(
            [sys.executable, str(script), str(root.resolve()), str(warm), str(batches)],
            capture_output=True,
            text=True,
            timeout=300,
            cwd=tmp,
            check=False,
        )
    line = next((x for x in done.stdout.splitlines() if x.startswith("RESULT")), None)
    if done.returncode or line is None:
        sys.exit(f"resume_metrics: the trace failed:\n{done.stdout}\n{done.stderr}")
    result = json.loads(line[len("RESULT") :])
    return {name: [(m, int(n), f) for m, n, f in calls] for name, calls in result.items()}


# -- the report -------------------------------------------------------------------------------
def measure(root: Path, run_trace: bool, warm: int, batches: int) -> dict[str, Any]:
    modules = load(root)
    touched = touching(modules)
    used = names(modules)
    members = stage_members(modules)
    applies, other_applies = apply_overrides(modules)
    found = probes(modules)
    checks = checkers(modules, set(touched))
    units = resume_units(modules, checks, applies)
    core_lines = {rel: m.lines for rel, m in modules.items() if m.core}
    mixed_lines = {rel: sum(u.lines for u, _ in us) for rel, us in units.items()}
    total = sum(m.lines for m in modules.values())
    lines = sum(core_lines.values()) + sum(mixed_lines.values())
    check_modules = sorted({u.module for u in checks})
    values: dict[str, Any] = {
        "modules": len(touched),
        "names": len(used),
        "stage_members": len(members),
        "apply_overrides": len(applies),
        "probes": len(found),
        "checkers": [len(checks), sum(u.lines for u in checks), len(check_modules)],
        "lines": lines,
    }
    details: dict[str, Any] = {
        "modules": touched,
        "names": used,
        "names_not_in_issue": sorted(set(used) - set(ISSUE_NAMES)),
        "issue_names_gone": sorted(set(ISSUE_NAMES) - set(used)),
        "name_candidates": candidates(modules),
        "stage_members": members,
        "apply_overrides": applies,
        "apply_overrides_other": other_applies,
        "probes": found,
        "checkers": [f"{u.where()} ({u.lines} lines)" for u in checks],
        "checker_modules": check_modules,
        "lines_core": core_lines,
        "lines_mixed": mixed_lines,
        "lines_units": {
            rel: [f"{u.start}-{u.end} {u.qualname}: {why}" for u, why in us]
            for rel, us in units.items()
        },
        "package_lines": total,
        "lines_share": round(100 * lines / total, 1) if total else 0.0,
    }
    # Modules that touch resume only by declaring a rule or naming a record class that lives
    # elsewhere: no core module, no resume code of their own (no unit of metric 7).
    details["modules_declaring_only"] = sorted(
        rel
        for rel, why in touched.items()
        if not modules[rel].core
        and not units.get(rel)
        and set(name_uses(modules[rel])) <= {"resume"}
    )
    if run_trace:
        per = trace(root, warm, batches)
        hit = sorted({m for calls in per.values() for m, _, _ in calls if m in touched})
        values["trace"] = len(hit)
        details["trace"] = {
            name: sorted({m for m, _, _ in calls if m in touched}) for name, calls in per.items()
        }
        spans = {rel: [(u.start, u.end) for u, _ in us] for rel, us in units.items()}

        def is_resume(m: str, line: int) -> bool:
            if m in core_lines:
                return True
            return any(a <= line <= b for a, b in spans.get(m, []))

        details["trace_resume_code"] = sorted(
            {f"{m}:{n} {f}" for calls in per.values() for m, n, f in calls if is_resume(m, n)}
        )
        details["trace_functions"] = {
            name: [
                f"{m}:{n} {f}" + (" [resume code]" if is_resume(m, n) else "")
                for m, n, f in sorted(calls)
            ]
            for name, calls in per.items()
        }
    return {"root": str(root), "values": values, "details": details}


LABELS = {
    "modules": "1. modules that touch resume",
    "names": "2. resume method names",
    "stage_members": "3. public members on Stage",
    "apply_overrides": "4. apply overrides for resume",
    "probes": "5. getattr/hasattr probes",
    "checkers": "6. state checkers (count/lines/modules)",
    "lines": "7. resume lines",
    "trace": "8. resume modules on a never-resumed batch",
}


def table(report: dict[str, Any]) -> str:
    values, details = report["values"], report["details"]
    rows = [("metric", "value", "issue", "goal", "met?")]
    for key, label in LABELS.items():
        if key not in values:
            continue
        v = values[key]
        shown = str(v)
        if key == "checkers":
            shown = f"{v[0]} / {v[1]} / {v[2]}"
        elif key == "lines":
            shown = f"{v:,} ({details['lines_share']}% of {details['package_lines']:,})"
        goal, ok = GOALS[key]
        rows.append((label, shown, str(ISSUE[key]), goal, "yes" if ok(v) else "no"))
    declaring = details["modules_declaring_only"]
    rows.insert(
        2,
        ("   of which only declare a rule", str(len(declaring)), "", "", ""),
    )
    if "trace_resume_code" in details:
        ran = details["trace_resume_code"]
        rows.append(("   resume code run on such a batch", f"{len(ran)} functions", "", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(5)]
    text = ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows]
    text.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(text)


def listing(report: dict[str, Any]) -> str:
    d = report["details"]
    out: list[str] = []

    def section(title: str, items: Iterable[str]) -> None:
        out.append(f"\n{title}")
        out.extend(f"  {x}" for x in items)

    section("1. modules", (f"{m}: {'; '.join(w)}" for m, w in d["modules"].items()))
    section(
        "   of which only declare a rule (no resume code of their own)", d["modules_declaring_only"]
    )
    section(
        "2. names (defined in)",
        (f"{n}: {', '.join(ms) or '(used only)'}" for n, ms in d["names"].items()),
    )
    section("   names not in the issue's list", d["names_not_in_issue"])
    section("   candidates outside the vocabulary", d["name_candidates"])
    section("3. Stage members", d["stage_members"])
    section("4. apply overrides for resume", d["apply_overrides"])
    section("   other apply overrides (not counted)", d["apply_overrides_other"])
    section("5. probes", d["probes"])
    section("6. checkers", d["checkers"])
    section("7. resume lines: core modules", (f"{m}: {n}" for m, n in d["lines_core"].items()))
    for rel, units in d["lines_units"].items():
        section(f"7. resume lines in {rel}: {d['lines_mixed'][rel]}", units)
    if "trace" in d:
        for name, ms in d["trace"].items():
            section(f"8. resume modules on a batch of {name}", ms)
        for name, fs in d["trace_functions"].items():
            section(f"   every pipeflow function run on a batch of {name}", fs)
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument(
        "--root",
        type=Path,
        default=Path(__file__).resolve().parents[1],
        help="the checkout to measure (holding pipeflow/)",
    )
    parser.add_argument("--json", action="store_true", help="everything, as JSON")
    parser.add_argument("--list", action="store_true", help="what each metric counted")
    parser.add_argument("--no-trace", action="store_true", help="skip metric 8")
    parser.add_argument("--warm", type=int, default=20, help="batches before tracing")
    parser.add_argument("--batches", type=int, default=30, help="batches traced")
    args = parser.parse_args(argv)
    report = measure(args.root, not args.no_trace, args.warm, args.batches)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"resume metrics of {report['root']}\n")
    print(table(report))
    if args.list:
        print(listing(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
