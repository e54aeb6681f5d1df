"""What each head attends to on repeated random tokens: previous-token, duplicate, induction.

The standard probe for the induction circuit (Elhage et al. 2021, Olsson et al. 2022): ``rows``
sequences of ``length`` random tokens, each repeated once, after the tokenizer's leading
special token when it adds one (BOS, CLS; special tokens are never drawn). Per head, the mean
attention

* **previous-token**: from every random token but the first to the token just before it;
* **duplicate-token**: from each token of the repeat to its earlier copy;
* **induction**: from each token of the repeat to the token *after* its earlier copy, which
  is what the model should predict next (a variant of TransformerLens's tutorials' score,
  which also counts two queries of the first copy).

A head that attends uniformly over ``t`` keys scores about ``1/t``. With a next-token LM head,
the loss over the first copy (random tokens: at or above ``log d_vocab``, as a trained model
is confidently wrong on them; SmolLM2: 14.2 nats against 10.8) and over the repeat shows
whether the model uses the repeat; an induction circuit makes it small. The patterns are the
model's own (``rs.trace(..., patterns=True)``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import InputError, as_index, check_choice, top_count
from .lens import log_probs

KINDS = ("previous_token", "duplicate_token", "induction")
DEFAULT_LENGTH = 50
MAX_TOKENS = 1 << 20  # rows × positions in one traced pass (its patterns: heads × pos² each row)


@dataclass(frozen=True, eq=False)
class HeadScores:
    """Scores ``[layer, head]`` of each kind, the losses, and the tokens they were measured on.

    ``loss_first`` and ``loss_repeat``: mean next-token cross-entropy (nats) predicting each
    copy's tokens after its first (a copy's first token cannot be predicted from the tokens
    before it); NaN without an LM head or with a masked-LM one.
    ``start`` is the first random token's position in ``tokens``.
    """

    previous_token: Float[Tensor, "layer head"]
    duplicate_token: Float[Tensor, "layer head"]
    induction: Float[Tensor, "layer head"]
    loss_first: float
    loss_repeat: float
    tokens: Int[Tensor, "row pos"]
    start: int

    @property
    def length(self) -> int:
        """Random tokens per copy."""
        return (self.tokens.shape[1] - self.start) // 2

    def __repr__(self) -> str:
        """One line: the sizes, the top head of each score and the losses."""
        tops = ", ".join(f"{k} {t['head']} {t[k]:.2f}" for k in KINDS for t in [self.top(k, 1).iloc[0]])
        return (f"HeadScores({self.tokens.shape[0]} rows of {self.length} random tokens ×2; top: {tops}; "
                f"loss {self.loss_first:.3g} → {self.loss_repeat:.3g})")

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
        n = top_count(n, "heads")
        return self.to_frame().sort_values(kind, ascending=False, kind="stable").head(n) \
            .reset_index(drop=True)


def _prefix_and_pool(model) -> tuple[list[int], Tensor]:
    """``(prefix, pool)``: the special tokens the tokenizer puts before a text, and ids to draw.

    The prefix is what encoding ``"a"`` adds before the text's own ids (BOS, CLS; not an EOS
    appended after), kept only if it is in the model's vocabulary; the pool is the ids the
    tokenizer knows (an embedding padded past them, as Qwen's, holds untrained rows) without
    its special ids; for a trained twin, only its ``probe_ids`` among them (the printable bytes
    its repeated segments were drawn from: most of the 256 bytes never reach a twin, and
    random bytes outside them measured a bundled twin's induction at 0.35, not 0.72).
    """
    tok = model.tokenizer
    vocab = min(model.anatomy.d_vocab, len(tok)) if hasattr(tok, "__len__") else model.anatomy.d_vocab
    try:
        full = list(tok("a")["input_ids"])
        plain = list(tok("a", add_special_tokens=False)["input_ids"])
    except Exception:  # noqa: BLE001 - a tokenizer that cannot say what it adds: add nothing
        full = plain = []
    lead = next((i for i in range(len(full) - len(plain) + 1) if full[i:i + len(plain)] == plain), 0)
    prefix = [i for i in full[:lead] if 0 <= i < vocab] if plain else []
    special = {*full, *(getattr(tok, "all_special_ids", None) or [])} - set(plain)
    keep = torch.ones(vocab, dtype=torch.bool)
    keep[[i for i in special if 0 <= i < vocab]] = False
    seen = getattr(model.module, "probe_ids", None)  # a trained twin's: the bytes it saw repeated
    if seen is not None:
        inside = torch.zeros(vocab, dtype=torch.bool)
        inside[[i for i in seen if 0 <= i < vocab]] = True
        both = keep & inside
        keep = both if bool(both.any()) else keep  # none of them in this vocabulary: any id
    return prefix, keep.nonzero()[:, 0]


def _repeated_tokens(prefix: list[int], pool: Tensor, length: int, rows: int, seed: int) -> Tensor:
    """``[rows, len(prefix) + 2·length]``: ``length`` ids from ``pool``, repeated once, after ``prefix``."""
    g = torch.Generator().manual_seed(seed)
    random = pool[torch.randint(len(pool), (rows, length), generator=g)]
    head = torch.tensor(prefix, dtype=torch.long).expand(rows, len(prefix))
    return torch.cat([head, random, random], 1)


def _diagonal_mean(A: Tensor, offset: int, first_query: int) -> Tensor:
    """Mean over rows and queries ``q ≥ first_query`` of ``A[:, :, q, q − offset]`` → ``[head]``."""
    d = A.diagonal(-offset, -2, -1)                 # (batch, head, query q = offset, offset+1, …)
    return d[..., first_query - offset:].float().mean((0, 2))


def head_scores(model, *, length: int | None = None, rows: int = 4, seed: int = 0) -> HeadScores:
    """Previous-token, duplicate-token and induction scores of every head (module docstring).

    ``model``: a loaded model, or a trace (its model: the trace's text is not used).
    ``length`` random tokens per copy (None: 50, or as many as the context holds twice with
    the prefix), ``rows`` sequences, drawn with ``seed``.
    """
    from ..trace import trace

    model = getattr(model, "model", model)  # a Trace holds its Model as ``model``
    a = model.anatomy
    prefix, pool = _prefix_and_pool(model)
    fits = (a.n_ctx - len(prefix)) // 2
    n, r, sd = (as_index(v) for v in (fits if length is None else length, rows, seed))
    if n is None or r is None or sd is None or n < 3 or r < 1 or not 0 <= sd < 2**63:
        raise InputError(f"head_scores needs whole numbers: length ≥ 3 random tokens (at 2 the "
                         f"induction offset is the previous token's), rows ≥ 1 and "
                         f"a seed in 0..2**63-1; got length={length!r}, rows={rows!r}, seed={seed!r}")
    if length is None:
        n = min(n, DEFAULT_LENGTH)
    if len(prefix) + 2 * n > a.n_ctx:
        raise InputError(f"two copies of {n} tokens{' and a prefix' if prefix else ''} make "
                         f"{len(prefix) + 2 * n} positions, over {model.name}'s context of "
                         f"{a.n_ctx}: use length ≤ {fits}")
    if r * (len(prefix) + 2 * n) > MAX_TOKENS:
        raise InputError(f"{r} rows of {len(prefix) + 2 * n} positions are over {MAX_TOKENS:,} tokens "
                         "in one pass: use fewer rows or a shorter length")
    tokens, start = _repeated_tokens(prefix, pool, n, r, sd), len(prefix)
    tr = trace(model, tokens, patterns=True)
    repeat = start + n  # the repeat's first position
    scores = [torch.stack([_diagonal_mean(A, off, first) for A in tr.patterns]).cpu()
              for off, first in ((1, start + 1), (n, repeat), (n - 1, repeat))]
    first = second = float("nan")
    if a.has_lm_head and a.causal:  # a masked LM does not predict the next token
        lp = log_probs(tr.logits.float())
        nll = -lp[:, :-1].gather(-1, tr.tokens[:, 1:, None].to(lp.device))[..., 0]  # predicts q+1
        first = float(nll[:, start:repeat - 1].mean())   # the first copy's 2nd… last tokens
        second = float(nll[:, repeat:].mean())           # the repeat's 2nd … last tokens
    return HeadScores(*scores, first, second, tokens, start)
