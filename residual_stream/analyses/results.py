"""One-line reprs for analysis results: each field by its shape or size, not its values.

A result printed in a notebook (SmolLM2's logit lens holds 31 × batch × pos values per field)
reads as ``LogitLens(kl=[31, 2, 12], …)``; the values are one attribute or ``to_frame()`` away.
"""

from __future__ import annotations

import dataclasses

import pandas as pd
from torch import Tensor

SHOWN = 3  # names listed before "…"


def summarize_field(value: object) -> str:
    """A short text for one field: a tensor's shape (a 0-d one's value), a tuple's size and first names."""
    if isinstance(value, Tensor):
        return f"{value.item():.4g}" if value.ndim == 0 else f"[{', '.join(map(str, value.shape))}]"
    if isinstance(value, pd.DataFrame):
        return f"<frame {value.shape[0]} × {value.shape[1]}>"
    if isinstance(value, tuple):
        if value and all(isinstance(v, str) for v in value):
            more = ", …" if len(value) > SHOWN else ""
            return f"({len(value)}: {', '.join(map(repr, value[:SHOWN]))}{more})"
        return f"({len(value)} items)"
    if isinstance(value, dict):
        return f"{{{len(value)} items}}"
    if isinstance(value, float):
        return f"{value:.4g}"
    text = repr(value)
    return text if len(text) <= 40 else f"<{type(value).__name__}>"


class CompactRepr:
    """Mixin for result dataclasses declared with ``repr=False``: ``Name(field=[shape], …)``."""

    def __repr__(self) -> str:
        """Every field by its shape or size (``summarize_field``), on one line."""
        parts = (f"{f.name}={summarize_field(getattr(self, f.name))}" for f in dataclasses.fields(self))
        return f"{type(self).__name__}({', '.join(parts)})"
