"""A loader's repr, one stage a line: a stage too long for the width is opened up."""

from __future__ import annotations

__all__ = ["layout"]


def layout(parts: list[str], width: int = 88, indent: str = "") -> str:
    """*parts* (a source's and its stages' reprs) one a line, ``| `` before each stage; a
    part too long for *width* is opened up, one argument a line.

    Examples:
        >>> print(layout(["indices(4)", "batch(size=2, drop_last=False)"]))
        indices(4)
        | batch(size=2, drop_last=False)
        >>> print(layout(["indices(4)", "batch(size=2, drop_last=False)", "map(fn=abs)"], 20))
        indices(4)
        | batch(
            size=2,
            drop_last=False)
        | map(fn=abs)
    """
    return "\n".join(_layout(" | ".join(parts), width, indent))


def _layout(text: str, width: int, indent: str) -> list[str]:
    lines = []
    for k, part in enumerate(_split(text, " | ")):
        prefix = indent + ("| " if k else "")
        if len(prefix) + len(part) <= width or not part.endswith(")") or "(" not in part:
            lines.append(prefix + part)
            continue
        head, args = part.split("(", 1)
        lines.append(f"{prefix}{head}(")
        inner = indent + ("  " if k else "") + "  "
        pieces = _split(args[:-1], ", ")
        for j, piece in enumerate(pieces):
            tail = "," if j < len(pieces) - 1 else ")"
            sub = _layout(piece, width, inner)
            sub[-1] += tail
            lines.extend(sub)
    return lines


def _split(text: str, sep: str) -> list[str]:
    """*text* cut at each *sep* that is outside brackets and quotes."""
    parts, depth, quote, start, i = [], 0, "", 0, 0
    while i < len(text):
        c = text[i]
        if quote:
            quote = "" if c == quote else quote
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            depth -= 1
        elif depth == 0 and text.startswith(sep, i):
            parts.append(text[start:i])
            i += len(sep)
            start = i
            continue
        i += 1
    parts.append(text[start:])
    return parts
