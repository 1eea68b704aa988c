"""Run PyTorch's own ``test/test_dataloader.py`` against ``pipeflow.DataLoader``.

Usage::

    python tools/torch_suite.py PATH/test_dataloader.py            # pipeflow's class
    python tools/torch_suite.py PATH/test_dataloader.py --torch    # torch's own class (baseline)
    python tools/torch_suite.py PATH --junit pf.xml --baseline torch.xml -k "TestDataLoader"

The test file is PyTorch's code: keep it outside this repository (we used the one at
pytorch/pytorch 74436f9025609987bbc69c617564f98635b67807). It needs ``torch.testing._internal``
(shipped with torch), ``expecttest``, ``numpy``, ``psutil``, ``pytest`` and ``pytest-timeout``;
a ``deps`` folder next to the test file, if there is one, goes on ``PYTHONPATH`` (e.g.
``pip install --target PATH/deps expecttest``, to keep the shared environment untouched).

How the loader is swapped
    The tests reach torch's class two ways: the name ``DataLoader`` bound by
    ``from torch.utils.data import DataLoader`` and the attribute ``torch.utils.data.DataLoader``
    (``_test_large_sampler_indices``, the nested-tensor test, ``TestSetAffinity``). Many run the
    loader in a child process (``ErrorTrackingProcess`` starts with *spawn*, which re-imports the
    test module) or in a fresh interpreter (``subprocess.check_output([sys.executable, ...])``).
    So the swap is made where every one of those processes looks: a generated ``sitecustomize.py``,
    put first on ``PYTHONPATH``, sets ``torch.utils.data.DataLoader = pipeflow.DataLoader`` at
    interpreter start. The module's own ``DataLoader`` name is then pipeflow's too (checked before
    the run). ``torch.utils.data.dataloader.DataLoader``, the class torch's internals use, is left
    alone: ``pipeflow.DataLoader`` subclasses it.

What is counted
    pytest's outcomes (passed, failed, errors, skipped, xfailed/xpassed), then each test is put in
    one of three groups by reading the file (the test method plus, transitively, the module-level
    functions and same-class methods it names):

    * **behaviour** — it builds a DataLoader (names ``DataLoader`` or ``_get_data_loader``) and
      reads nothing private of the loader or its iterator;
    * **internals** — it builds a DataLoader and reads ``_workers``, ``_auto_collation``,
      ``_iterator``, ``_pin_memory_thread`` or ``_shutdown_workers``;
    * **other** — it never builds a DataLoader (datasets, samplers, collate functions): the swap
      cannot change its outcome.

    With ``--baseline`` (a ``--junit`` file from a ``--torch`` run) it also prints, per group, how
    many of the tests torch's own class passes here also pass with pipeflow's: that is the
    issue's "behaviour tests" figure, and the list of those that differ.

Run it politely on a shared machine: ``nice -n 19``, a per-test ``--timeout``, ``-k`` chunks.
Tests marked ``@slowTest`` (``test_proper_exit``: it reads ``_workers`` and kills one) are
skipped unless the environment has ``PYTORCH_TEST_WITH_SLOW=1``; on a busy machine torch's own
spawn-heavy tests (``test_multiprocessing_contexts``, ``test_shuffler_iterdatapipe``) can
pass the default 120 s: re-run those with ``-k`` and a longer ``--timeout``.
"""

from __future__ import annotations

import argparse
import ast
import os
import shutil
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

_SITECUSTOMIZE = """\
import os
if os.environ.get("PF_TORCH_SUITE_SWAP") == "1":
    import torch.utils.data
    import pipeflow
    torch.utils.data.DataLoader = pipeflow.DataLoader
"""

_INI = """\
[pytest]
addopts = -p no:cacheprovider
"""

_PRIVATE = ("._workers", "._auto_collation", "._iterator", "._pin_memory_thread",
            "._shutdown_workers")  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("path", type=Path, help="PyTorch's test/test_dataloader.py")
    parser.add_argument("--torch", action="store_true", help="run against torch's own class")
    parser.add_argument("-k", dest="keyword", help="pytest -k expression (run in chunks)")
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test (default 120)")
    parser.add_argument("--junit", type=Path, help="keep pytest's JUnit XML here")
    parser.add_argument("--baseline", type=Path, help="JUnit XML of a --torch run to compare with")
    parser.add_argument(
        "--pipeflow-root",
        type=Path,
        default=REPO,
        help="import pipeflow from this folder (default: this checkout)",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="print every test's outcome")
    args = parser.parse_args(argv)

    path = args.path.resolve()
    groups = classify(path)
    with tempfile.TemporaryDirectory(prefix="torch_suite_") as tmp:
        tmpdir = Path(tmp)
        (tmpdir / "sitecustomize.py").write_text(_SITECUSTOMIZE)
        (tmpdir / "pytest.ini").write_text(_INI)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(tmpdir), str(args.pipeflow_root.resolve()), str(path.parent)]
            + ([str(path.parent / "deps")] if (path.parent / "deps").is_dir() else [])
            + ([env["PYTHONPATH"]] if env.get("PYTHONPATH") else [])
        )
        env["PF_TORCH_SUITE_SWAP"] = "0" if args.torch else "1"
        _check_swap(path, env, expect_pipeflow=not args.torch)
        junit = tmpdir / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", str(path), "-c", str(tmpdir / "pytest.ini"),
               "--rootdir", str(path.parent), f"--timeout={args.timeout}", "-q",
               "-o", "junit_family=xunit1", f"--junitxml={junit}"]  # fmt: skip
        if args.keyword:
            cmd += ["-k", args.keyword]
        subprocess.run(cmd, env=env, cwd=path.parent, check=False)
        if args.junit:
            shutil.copyfile(junit, args.junit)
        results = read_junit(junit)

    which = "torch.utils.data.DataLoader" if args.torch else "pipeflow.DataLoader"
    print(f"\n== {path.name} against {which} ==")
    total = Counter(results.values())
    print("all tests: " + ", ".join(f"{k} {total[k]}" for k in _OUTCOMES))
    for group in ("behaviour", "internals", "other"):
        mine = Counter(o for t, o in results.items() if groups.get(_method(t)) == group)
        print(f"{group:>9}: " + ", ".join(f"{k} {mine[k]}" for k in _OUTCOMES))
    if args.verbose:
        for test, outcome in sorted(results.items()):
            print(f"  {outcome:8} {groups.get(_method(test), '?'):9} {test}")
    if args.baseline:
        base = read_junit(args.baseline)
        print(f"\ncompared with {args.baseline} (tests torch's own class passes there):")
        for group in ("behaviour", "internals", "other"):
            passing = [t for t, o in base.items() if o == "passed" and t in results]
            passing = [t for t in passing if groups.get(_method(t)) == group]
            same = [t for t in passing if results[t] == "passed"]
            print(f"{group:>9}: {len(same)} of {len(passing)} pass")
            for t in sorted(set(passing) - set(same)):
                print(f"             {results[t]:8} {t}")
    return 0 if total["failed"] == total["error"] == 0 else 1


_OUTCOMES = ("passed", "failed", "error", "skipped", "xfailed", "xpassed")


def read_junit(path: Path) -> dict[str, str]:
    """``{"Class::test": outcome}`` from a pytest JUnit XML file."""
    out: dict[str, str] = {}
    for case in ET.parse(path).getroot().iter("testcase"):
        name = f"{case.get('classname', '').rsplit('.', 1)[-1]}::{case.get('name')}"
        kinds = {child.tag for child in case}
        skipped = case.find("skipped")
        if "failure" in kinds:
            out[name] = "failed"
        elif "error" in kinds:
            out[name] = "error"
        elif skipped is not None:
            xfail = skipped.get("type") == "pytest.xfail"
            out[name] = "xfailed" if xfail else "skipped"
        else:
            out[name] = "passed"
    return out


_CLASSES: dict[str, tuple[list[str], dict[str, str]]] = {}


def _method(test: str) -> tuple[str, str] | None:
    """Map ``Class::test`` (with device/parametrize suffixes) to its (class, method) source."""
    cls, _, name = test.partition("::")
    owner = max((c for c in _CLASSES if cls.startswith(c)), key=len, default=None)
    if owner is None:
        return None
    for klass in _mro(owner):
        methods = _CLASSES[klass][1]
        match = max((m for m in methods if name.startswith(m)), key=len, default=None)
        if match is not None:
            return (klass, match)
    return None


def _mro(name: str) -> list[str]:
    out = [name]
    for base in _CLASSES.get(name, ([], {}))[0]:
        if base in _CLASSES:
            out += _mro(base)
    return out


def classify(path: Path) -> dict[tuple[str, str] | None, str]:
    """``{(class, method): "behaviour" | "internals" | "other"}`` by reading *path*."""
    source = path.read_text()
    tree = ast.parse(source)
    functions: dict[str, str] = {}
    _CLASSES.clear()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            functions[node.name] = ast.get_source_segment(source, node) or ""
        elif isinstance(node, ast.ClassDef):
            bases = [b.id for b in node.bases if isinstance(b, ast.Name)]
            methods = {
                m.name: ast.get_source_segment(source, m) or ""
                for m in node.body
                if isinstance(m, ast.FunctionDef)
            }
            _CLASSES[node.name] = (bases, methods)

    def reach(klass: str, text: str, seen: set[str]) -> str:
        parts = [text]
        for node in ast.walk(ast.parse(_dedent(text))):
            if isinstance(node, ast.Name) and node.id in functions and node.id not in seen:
                seen.add(node.id)
                parts.append(reach(klass, functions[node.id], seen))
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.value, ast.Name)
                and node.value.id == "self"
                and f"self.{node.attr}" not in seen
            ):
                seen.add(f"self.{node.attr}")
                for k in _mro(klass):
                    if node.attr in _CLASSES[k][1]:
                        parts.append(reach(klass, _CLASSES[k][1][node.attr], seen))
                        break
        return "\n".join(parts)

    groups: dict[tuple[str, str] | None, str] = {}
    for klass, (_, methods) in _CLASSES.items():
        for name in methods:
            if not name.startswith("test"):
                continue
            text = reach(klass, methods[name], set())
            if "DataLoader" not in text and "_get_data_loader" not in text:
                groups[(klass, name)] = "other"
            elif any(p in text for p in _PRIVATE):
                groups[(klass, name)] = "internals"
            else:
                groups[(klass, name)] = "behaviour"
    # subclasses inherit their bases' tests
    for klass in _CLASSES:
        for base in _mro(klass)[1:]:
            for name in _CLASSES[base][1]:
                if (base, name) in groups:
                    groups.setdefault((klass, name), groups[(base, name)])
    return groups


def _dedent(text: str) -> str:
    lines = text.splitlines()
    indent = min((len(s) - len(s.lstrip()) for s in lines if s.strip()), default=0)
    return "\n".join(s[indent:] for s in lines)


def _check_swap(path: Path, env: dict[str, str], *, expect_pipeflow: bool) -> None:
    probe = (
        f"import {path.stem} as m, torch.utils.data as tud, pipeflow;"
        "print(m.DataLoader is pipeflow.DataLoader, tud.DataLoader is pipeflow.DataLoader)"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], env=env, cwd=path.parent, capture_output=True, text=True
    )
    want = f"{expect_pipeflow} {expect_pipeflow}"
    if out.stdout.strip().splitlines()[-1:] != [want]:
        sys.exit(f"torch_suite: the swap did not take (wanted {want!r}):\n{out.stdout}{out.stderr}")


if __name__ == "__main__":
    sys.exit(main())
