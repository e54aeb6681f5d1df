"""Token labels for axes: escaped, and unique (plotly merges categories with equal names).

Escaping means no user text reaches a page as HTML: ``<``, ``>`` and ``&`` become entities.
Quotes stay as they are: plotly's label markup decodes only a few named entities, so
``&quot;`` would show as such, and without ``<`` no tag (nor attribute) can be written.
"""

from __future__ import annotations

import html


def readable(token: str) -> str:
    """A token as shown: byte-level BPE's space and newline marks (and real ones) as ␣ and ↵."""
    return token.replace("Ġ", "␣").replace("Ċ", "↵").replace("\n", "↵").replace(" ", "␣")


def token_labels(tokens: list[str]) -> list[str]:
    """``["The", " cat", "The"]`` → ``["0 The", "1 ␣cat", "2 The"]``, HTML-escaped."""
    return [f"{i} {html.escape(readable(tok), quote=False)}" for i, tok in enumerate(tokens)]


def escape(text: object) -> str:
    """Escape any user-supplied text for a figure title or hover."""
    return html.escape(str(text), quote=False)
