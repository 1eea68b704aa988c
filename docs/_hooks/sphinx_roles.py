"""mkdocs hook: render Sphinx cross-reference roles left in docstrings as plain code.

Some docstrings say :class:`Stage` or :func:`~pipeflow.batch`. mkdocstrings reads Google-style
docstrings as Markdown, where such a role would show as ":class:" followed by the code. This
hook keeps the code and drops the role (``~`` keeps the last dotted part, as in Sphinx).
"""

from __future__ import annotations

import re
from typing import Any

_ROLE = re.compile(
    r":(?:py:)?(?:class|func|meth|attr|mod|data|exc|obj|const):<code>(~?)([^<]+)</code>"
)


def _plain(match: re.Match[str]) -> str:
    tilde, target = match.groups()
    if tilde:
        target = target.rsplit(".", 1)[-1]
    return f"<code>{target}</code>"


def on_page_content(html: str, **kwargs: Any) -> str:
    """Replace every role with its code."""
    return _ROLE.sub(_plain, html)
