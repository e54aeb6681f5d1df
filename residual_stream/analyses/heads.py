"""What each head attends to on repeated random tokens: previous-token, duplicate, induction.

The standard probe for the induction circuit (Elhage et al. 2021, Olsson et al. 2022): ``rows``
sequences of ``length`` random tokens, each repeated once, after the tokenizer's leading
special token when it adds one (BOS, CLS; special tokens are never drawn). Per head, the mean
attention

* **previous-token**: from every random token but the first to the token just before it;
* **duplicate-token**: from each token of the repeat to its earlier copy;
* **induction**: from each token of the repeat to the token *after* its earlier copy, which
  is what the model should predict next (TransformerLens's tutorials compute the same).

A head that attends uniformly over ``t`` keys scores about ``1/t``. With an LM head, the
next-token loss over the first copy (random: about ``log d_vocab``) and over the repeat shows
whether the model uses the repeat; an induction circuit makes it small. The patterns are the
model's own (``rs.trace(..., patterns=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import InputError, check_choice
from .lens import log_probs

KINDS = ("previous_token", "duplicate_token", "induction")


@dataclass(frozen=True, eq=False)
class HeadScores:
    """Scores ``[layer, head]`` of each kind, the losses, and the tokens they were measured on.

    ``loss_first`` and ``loss_repeat``: mean next-token cross-entropy (nats) predicting each
    copy's tokens after its first (a copy's first token cannot be predicted from the tokens
    before it); NaN without an LM head.
    ``start`` is the first random token's position in ``tokens``.
    """

    previous_token: Float[Tensor, "layer head"]
    duplicate_token: Float[Tensor, "layer head"]
    induction: Float[Tensor, "layer head"]
    loss_first: float
    loss_repeat: float
    tokens: Int[Tensor, "row pos"]
    start: int

    def to_frame(self) -> pd.DataFrame:
        """One row per head: ``head`` (``L3H5``), ``layer``, and a column per kind of score."""
        n_layers, n_heads = self.induction.shape
        return pd.DataFrame({
            "head": [f"L{L}H{h}" for L in range(n_layers) for h in range(n_heads)],
            "layer": [L for L in range(n_layers) for _ in range(n_heads)],
            **{kind: getattr(self, kind).flatten().numpy() for kind in KINDS}})

    def top(self, kind: str = "induction", n: int = 5) -> pd.DataFrame:
        """The ``n`` heads scoring highest by ``kind`` (``to_frame``'s rows, best first)."""
        check_choice("kind", kind, KINDS)
        return self.to_frame().sort_values(kind, ascending=False, kind="stable").head(n) \
            .reset_index(drop=True)


def _prefix_and_pool(model) -> tuple[list[int], Tensor]:
    """``(prefix, pool)``: the leading special token the tokenizer adds, and ids to draw.

    The prefix is kept only if it is in the model's vocabulary; the pool is the vocabulary
    without the tokenizer's special ids.
    """
    tok, vocab = model.tokenizer, model.anatomy.d_vocab
    try:
        added = list(tok("")["input_ids"])
    except Exception:  # noqa: BLE001 - a tokenizer that cannot encode "" adds nothing we can see
        added = []
    prefix = added[:1] if added and 0 <= added[0] < vocab else []
    special = {i for i in [*added, *(getattr(tok, "all_special_ids", None) or [])] if 0 <= i < vocab}
    keep = torch.ones(vocab, dtype=torch.bool)
    keep[list(special)] = False
    return prefix, keep.nonzero()[:, 0]


def repeated_tokens(model, length: int, rows: int, seed: int) -> tuple[Tensor, int]:
    """``(ids [rows, start + 2·length], start)``: random tokens repeated once, after any prefix."""
    prefix, pool = _prefix_and_pool(model)
    g = torch.Generator().manual_seed(seed)
    random = pool[torch.randint(len(pool), (rows, length), generator=g)]
    head = torch.tensor(prefix, dtype=torch.long).expand(rows, len(prefix))
    return torch.cat([head, random, random], 1), len(prefix)


def _diagonal_mean(A: Tensor, offset: int, first_query: int) -> Tensor:
    """Mean over rows and queries ``q ≥ first_query`` of ``A[:, :, q, q − offset]`` → ``[head]``."""
    d = A.diagonal(-offset, -2, -1)                 # (batch, head, query q = offset, offset+1, …)
    return d[..., first_query - offset:].float().mean((0, 2))


def head_scores(model, *, length: int = 50, rows: int = 4, seed: int = 0) -> HeadScores:
    """Previous-token, duplicate-token and induction scores of every head (module docstring).

    ``length`` random tokens per copy (the two copies and any prefix must fit the context),
    ``rows`` sequences, drawn with ``seed``.
    """
    from ..trace import trace

    a = model.anatomy
    if not (isinstance(length, int) and isinstance(rows, int)) or length < 2 or rows < 1:
        raise InputError(f"head_scores needs length ≥ 2 random tokens and rows ≥ 1, "
                         f"not length={length!r}, rows={rows!r}")
    tokens, start = repeated_tokens(model, length, rows, seed)
    if tokens.shape[1] > a.n_ctx:
        raise InputError(f"two copies of {length} tokens{' and a prefix' if start else ''} make "
                         f"{tokens.shape[1]} positions, over {model.name}'s context of {a.n_ctx}: "
                         f"use length ≤ {(a.n_ctx - start) // 2}")
    tr = trace(model, tokens, patterns=True)
    repeat = start + length  # the repeat's first position
    scores = [torch.stack([_diagonal_mean(A, off, first) for A in tr.patterns]).cpu()
              for off, first in ((1, start + 1), (length, repeat), (length - 1, repeat))]
    first = second = float("nan")
    if a.has_lm_head:
        lp = log_probs(tr.logits.float())
        nll = -lp[:, :-1].gather(-1, tr.tokens[:, 1:, None].to(lp.device))[..., 0]  # predicts q+1
        first = float(nll[:, start:repeat - 1].mean())   # the first copy's 2nd… last tokens
        second = float(nll[:, repeat:].mean())           # the repeat's 2nd … last tokens
    return HeadScores(*scores, first, second, tokens, start)
