"""Training data for the twins, reproducible offline: bytes of Python's own documentation.

Text: ``pydoc_data.topics`` (the language reference topics that ``help()`` shows) and every
docstring (module, class, function) of the top-level standard-library ``.py`` files, read
with ``ast`` (nothing is imported), in sorted file order, joined by blank lines and encoded
as UTF-8 bytes (ids 0..255; 256 is BOS). The last ``VAL_FRACTION`` of the bytes is held out.

Synthetic training rows are back-to-back pairs of random printable segments
(``s₁ s₁ s₂ s₂ …``), so that induction heads have a reason to form; the in-context check
uses rows ``[prefix][seg][seg][filler]`` and compares the loss on the second occurrence of
the segment with the loss on the first. The corpus depends on the Python
version's standard library (the cards record it).
"""

from __future__ import annotations

import ast
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

from ..errors import InputError

VAL_FRACTION = 0.05
BOS = 256


@lru_cache(maxsize=1)
def corpus_bytes() -> bytes:
    """The whole text corpus as bytes (about 1.5 MB on Python 3.11)."""
    import pydoc_data.topics as topics

    parts = [topics.topics[k] for k in sorted(topics.topics)]
    root = Path(sysconfig.get_paths()["stdlib"])
    for path in sorted(root.glob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) > 40:
                    parts.append(doc)
    return "\n\n".join(parts).encode("utf-8")


def describe_corpus() -> str:
    """One line for model cards: sources, size, split, Python version."""
    data = corpus_bytes()
    n_val = int(len(data) * VAL_FRACTION)
    return (f"pydoc_data.topics + stdlib docstrings (Python {sys.version.split()[0]}): "
            f"{len(data):,} bytes; train {len(data) - n_val:,}, validation (last 5 %) {n_val:,}")


@dataclass(frozen=True)
class Mix:
    """How a batch is made: ``synthetic_fraction`` of rows are repeated random segments."""

    seq_len: int = 128
    synthetic_fraction: float = 0.25
    min_segment: int = 8
    max_segment: int = 32
    alphabet: tuple[int, int] = (32, 127)  # byte range of the synthetic segments

    def __post_init__(self) -> None:
        """Refuse a fraction of rows outside 0..1 and segments that cannot fit (``InputError``)."""
        if not 0 <= self.synthetic_fraction <= 1:
            raise InputError(f"synthetic_fraction is a fraction of the rows, 0 to 1; got "
                             f"{self.synthetic_fraction}")
        if not 1 <= self.min_segment <= self.max_segment:
            raise InputError(f"segments need 1 <= min_segment <= max_segment, got "
                             f"{self.min_segment} and {self.max_segment}")


def _split(split: str) -> torch.Tensor:
    data = torch.frombuffer(bytearray(corpus_bytes()), dtype=torch.uint8).long()
    n_val = int(len(data) * VAL_FRACTION)
    return data[:-n_val] if split == "train" else data[-n_val:]


def text_batch(split: str, n: int, seq_len: int, g: torch.Generator) -> torch.Tensor:
    """``n`` windows of ``seq_len`` tokens (BOS + bytes) from the ``split``."""
    data = _split(split)
    if n == 0:
        return torch.zeros(0, seq_len, dtype=torch.long)
    starts = torch.randint(0, len(data) - seq_len, (n,), generator=g)
    rows = torch.stack([data[s:s + seq_len - 1] for s in starts.tolist()])
    return torch.cat([torch.full((n, 1), BOS), rows], 1)


def repeat_batch(n: int, seq_len: int, g: torch.Generator, mix: Mix = Mix()
                 ) -> tuple[torch.Tensor, int, int]:
    """Rows ``BOS [prefix] [seg] [seg] [filler]`` of printable bytes; returns (rows, start, len).

    ``start`` is where the second occurrence begins; all rows share it.
    """
    longest = min(mix.max_segment, (seq_len - 2) // 2)      # both copies must fit after BOS
    seg = int(torch.randint(min(mix.min_segment, longest), longest + 1, (1,), generator=g))
    pre = int(torch.randint(0, seq_len - 1 - 2 * seg + 1, (1,), generator=g))
    body = torch.randint(32, 127, (n, seq_len - 1), generator=g)
    body[:, pre + seg:pre + 2 * seg] = body[:, pre:pre + seg]
    return torch.cat([torch.full((n, 1), BOS), body], 1), 1 + pre + seg, seg


def pairs_batch(n: int, seq_len: int, g: torch.Generator, mix: Mix = Mix()
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows ``BOS s₁ s₁ s₂ s₂ …`` of random printable segments, and which targets are learnable.

    Each row holds several repeats (segment lengths ``min_segment//2`` to ``max_segment//2``),
    so every synthetic row carries many chances to learn induction. The mask marks the
    second copies (after their first byte): the first copies are noise, nothing to learn.
    """
    parts, learnable, length = [], [], 1
    while length < seq_len:
        seg = int(torch.randint(max(2, mix.min_segment // 2), mix.max_segment // 2 + 1, (1,),
                                generator=g))
        s = torch.randint(*mix.alphabet, (n, seg), generator=g)
        parts += [s, s]
        learnable += [0] * (seg + 1) + [1] * (seg - 1)
        length += 2 * seg
    rows = torch.cat([torch.full((n, 1), BOS), *parts], 1)[:, :seq_len]
    mask = torch.tensor([0, *learnable])[:seq_len].expand(n, -1)
    return rows, mask


def train_batch(n: int, g: torch.Generator, mix: Mix = Mix()) -> tuple[torch.Tensor, torch.Tensor]:
    """Text windows, and ``synthetic_fraction`` of rows of repeated segments; with a target mask.

    The mask (``[batch, pos]``, 1 = the token is a training target) is all ones for text.
    """
    n_syn = round(n * mix.synthetic_fraction)
    text = text_batch("train", n - n_syn, mix.seq_len, g)
    if not n_syn:
        return text, torch.ones_like(text)
    rows, mask = pairs_batch(n_syn, mix.seq_len, g, mix)
    return torch.cat([text, rows]), torch.cat([torch.ones_like(text), mask])
