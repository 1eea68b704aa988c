"""pipeflow's rooms: the packages by concern, read from the code, checked, and drawn.

Usage::

    python tools/rooms.py                 # the rooms, what each imports, and the check
    python tools/rooms.py --svg FILE      # draw the picture (docs/concepts/rooms.svg)

A *room* is a package of ``pipeflow/`` (``parallel``'s three sub-packages are rooms of their
own), or, for the modules at the top level, ``pipeflow`` (the public names: ``__init__``,
``state``, the demo) and ``ground`` (what every room may use: ``errors``, ``stats``...).
:data:`ROOMS` lists them top to bottom; the check is that no room imports one listed above
it (imports inside functions and ``TYPE_CHECKING`` blocks count), so the picture, drawn in
that order, has every arrow pointing down. The design page embeds the picture, and
``tests/test_layout.py`` fails when it is not the one this code draws.
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from xml.sax.saxutils import escape

PACKAGE = Path(__file__).resolve().parents[1] / "pipeflow"

#: The rooms, top to bottom, each with what it holds in a few words.
ROOMS: list[tuple[str, str]] = [
    ("pipeflow", "the public names, imported on first use; state, resume's public face"),
    ("facade", "torch.utils.data's DataLoader and torchdata's StatefulDataLoader"),
    ("parallel", "parallel_map and parallel_source: a pass, its pool, the records"),
    ("parallel/ray", "Ray actors as a pool's workers"),
    ("parallel/pools", "who runs the work: threads, processes, event loops, lives"),
    ("parallel/transport", "a result's way back from a worker: records, /dev/shm"),
    ("sources", "where items come from: indices, iterables, shards and readers, mix"),
    ("stages", "the stages a user composes, one module per family"),
    ("engine", "Stage and Source, the plan, the runner and its wrappers, the Loader"),
    ("resume", "one protocol: rules, records' forms, one validator, taking a state"),
    ("ground", "what every room may use: errors, stats, argument checks, seeds"),
]
#: The top-level modules that are the public face rather than the ground floor.
_FACE = {"pipeflow", "pipeflow.__main__", "pipeflow.demo", "pipeflow.state"}


@dataclass
class Room:
    name: str
    says: str
    modules: list[str]
    lines: int


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def room_of(module: str) -> str:
    """The room *module* stands in."""
    if module in _FACE:
        return "pipeflow"
    parts = module.split(".")[1:]
    if parts[0] == "parallel" and len(parts) > 1 and parts[1] in ("ray", "pools", "transport"):
        return f"parallel/{parts[1]}"
    if (PACKAGE / parts[0]).is_dir():
        return parts[0]
    return "ground"


def imports(path: Path, known: set[str]) -> set[str]:
    """The pipeflow modules *path* imports, anywhere in it."""
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pipeflow"):
            named = [f"{node.module}.{a.name}" for a in node.names]
            out.update([m for m in named if m in known] or [node.module])
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {m for m in out if m in known}


def read() -> tuple[list[Room], Counter[tuple[str, str]], dict[tuple[str, str], set[str]]]:
    """The rooms, the number of imports from one room to another, and those imports."""
    paths = {module_name(p): p for p in sorted(PACKAGE.rglob("*.py"))}
    rooms = {name: Room(name, says, [], 0) for name, says in ROOMS}
    edges: Counter[tuple[str, str]] = Counter()
    which: dict[tuple[str, str], set[str]] = {}
    for module, path in paths.items():
        here = room_of(module)
        rooms[here].modules.append(module)
        rooms[here].lines += len(path.read_text(encoding="utf-8").splitlines())
        for target in imports(path, set(paths)):
            there = room_of(target)
            if there != here:
                edges[(here, there)] += 1
                which.setdefault((here, there), set()).add(f"{module} -> {target}")
    return [rooms[name] for name, _ in ROOMS], edges, which


def upward(edges: Counter[tuple[str, str]]) -> list[tuple[str, str]]:
    """The imports from a room to one listed above it (none, in a sound layout)."""
    rank = {name: i for i, (name, _) in enumerate(ROOMS)}
    return sorted((a, b) for a, b in edges if rank[b] < rank[a])


def _short(module: str, room: str) -> str:
    """A module's name inside its room's box (a package's own ``__init__`` as such)."""
    if room in ("pipeflow", "ground"):
        return "__init__" if module == "pipeflow" else module.removeprefix("pipeflow.")
    package = "pipeflow." + room.replace("/", ".")
    return "__init__" if module == package else module.removeprefix(package + ".")


def svg(rooms: list[Room], edges: Counter[tuple[str, str]]) -> str:
    """The picture (it changes with the modules and their imports, not with their lines):
    the rooms stacked top to bottom, each with its modules, and an arrow for
    every pair of rooms where one imports the other (the number of imports on it; those into
    ``ground``, which every room uses, are left out)."""
    width, left, box, line, pad = 1000, 20, 660, 15, 8
    y = 60
    out: list[str] = []
    mid: dict[str, float] = {}
    for room in rooms:
        names = sorted(_short(m, room.name) for m in room.modules)
        rows: list[str] = []
        row = ""
        for name in names:
            if len(row) + len(name) + 2 > 88:
                rows.append(row)
                row = ""
            row += ("  " if row else "") + name
        rows.append(row)
        height = pad * 2 + line * (2 + len(rows))
        mid[room.name] = y + height / 2
        out.append(
            f'<rect x="{left}" y="{y}" width="{box}" height="{height}" rx="4" '
            'fill="#e8eef6" stroke="#3b5b8c"/>'
        )
        title = f"{room.name}/" if room.name not in ("pipeflow", "ground") else room.name
        out.append(
            f'<text x="{left + pad}" y="{y + pad + 12}" font-weight="bold">{escape(title)}'
            f'<tspan font-weight="normal" fill="#555">  {escape(room.says)}</tspan></text>'
        )
        for i, text in enumerate(rows):
            out.append(
                f'<text x="{left + pad}" y="{y + pad + 12 + line * (i + 1.4)}" '
                f'font-family="monospace" font-size="11" fill="#223">{escape(text)}</text>'
            )
        y += height + 18
    order = [name for name, _ in ROOMS]
    drawn = {e: n for e, n in edges.items() if e[1] != "ground"}  # every room uses it
    for k, (a, b) in enumerate(sorted(drawn, key=lambda e: (order.index(e[0]), order.index(e[1])))):
        x = left + box + 14 + 24 * order.index(a)
        y0, y1 = mid[a] + 4 * (k % 3), mid[b] - 4 * (k % 3)
        colour = "#c0392b" if order.index(b) < order.index(a) else "#3b5b8c"
        out.append(
            f'<path d="M{left + box},{y0} H{x} V{y1} H{left + box + 4}" fill="none" '
            f'stroke="{colour}" stroke-width="1" marker-end="url(#head)"/>'
        )
        out.append(
            f'<text x="{x + 2}" y="{(y0 + y1) / 2}" font-size="9" fill="{colour}">'
            f"{edges[(a, b)]}</text>"
        )
    head = (
        '<defs><marker id="head" markerWidth="6" markerHeight="6" refX="5" refY="3" '
        'orient="auto"><path d="M0,0 L6,3 L0,6 z" fill="#3b5b8c"/></marker></defs>'
    )
    caption = (
        f'<text x="{left}" y="30" font-size="15" font-weight="bold">pipeflow: '
        f"{len(rooms)} rooms, {sum(len(r.modules) for r in rooms)} modules"
        '</text><text x="{left}" y="48" font-size="11" fill="#555">'
        "drawn from the code by tools/rooms.py: a room stands above the rooms it imports; "
        "each arrow is the imports from one room into another (into ground, left out: "
        "every room uses it)</text>"
    ).replace("{left}", str(left))
    return (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{y + 10}" '
        f'viewBox="0 0 {width} {y + 10}" font-family="sans-serif" font-size="12">\n'
        + head
        + "\n"
        + caption
        + "\n"
        + "\n".join(out)
        + "\n</svg>\n"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--svg", type=Path, help="write the picture here")
    args = parser.parse_args()
    rooms, edges, which = read()
    if args.svg:
        args.svg.write_text(svg(rooms, edges), encoding="utf-8")
        return
    for room in rooms:
        uses = [f"{b} ({n})" for (a, b), n in sorted(edges.items()) if a == room.name]
        print(f"{room.name:20} {len(room.modules):3} modules {room.lines:6,} lines  uses: ", end="")
        print(", ".join(uses) or "nothing")
    bad = upward(edges)
    for a, b in bad:
        print(f"UP: {a} imports {b}: {sorted(which[(a, b)])}")
    sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
