"""The logit lens and direct logit attribution.

**Logit lens** (nostalgebraist 2020): read the stream at every point as if it were final:
apply the final norm the way the model applies it (its own per-token scale, recomputed for
that point's stream), any head transform, the unembedding, and Gemma's soft-cap. Reported
per point: KL(final ‖ lens) in nats, top-1 agreement with the final prediction, and the
rank of the final top token under the lens. At the last point the lens *is* the model.
Log-probabilities are ``logits − logsumexp(logits)`` (``log_probs``), not ``log_softmax``.

**Direct logit attribution.** The final-normed stream is an exact sum of contributions
(``trace.decompose("final")``), and the unembedding is linear, so the logit of a target token
is an exact sum of per-contribution terms ``c_i · W_U[:, t]`` plus ``b_U[t]``. With a
``baseline`` token, the terms are for the logit difference ``t − baseline`` (which, unlike
single logits, does not depend on a per-position constant added to every logit). Needs a
linear unembedding: BERT's MLM head applies a nonlinear transform first. A model that
soft-caps its logits (Gemma 2: ``c · tanh(logit / c)``) is attributed before the cap, where
the map is linear, as TransformerLens's ``logit_attrs`` does: the terms sum to the capped
logit's preimage ``c · atanh(logit / c)`` (``DirectLogitAttribution.softcap`` is ``c``). The
cap is monotone: the top token, and the sign of a logit difference, are the same either side.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Float, Int
from torch import Tensor

from ..errors import InputError, NotAvailableError, as_index, check_choice, need_trace, top_count
from .results import CompactRepr
from .tokens import masked_mean


@dataclass(frozen=True, eq=False, repr=False)
class LogitLens(CompactRepr):
    """Per point (0..n_layers) and token: KL to the final distribution, agreement, rank, top-k."""

    kl: Float[Tensor, "point batch pos"]
    top1_agree: Float[Tensor, "point batch pos"]
    final_token_rank: Int[Tensor, "point batch pos"]
    top_ids: Int[Tensor, "point batch pos k"]
    top_probs: Float[Tensor, "point batch pos k"]
    top_tokens: tuple[tuple[tuple[str, ...], ...], ...]
    attention_mask: Int[Tensor, "batch pos"]

    def summary(self) -> pd.DataFrame:
        """Per point, over real tokens: mean KL (nats), top-1 agreement, median rank.

        The median is torch's lower median (an even count gives the lower of the middle two:
        a rank that occurs), as the corpus scan's histogram median gives.
        """
        m = self.attention_mask.bool()
        return pd.DataFrame({
            "point": range(self.kl.shape[0]),
            "kl": masked_mean(self.kl, self.attention_mask, lead=1).numpy(),
            "top1_agreement": masked_mean(self.top1_agree, self.attention_mask, lead=1).numpy(),
            "median_rank": [float(r[m].float().median()) for r in self.final_token_rank],
        })

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``point, batch, pos, kl, top1_agree, final_token_rank, top_token, top_prob``."""
        n = self.kl.shape[0]
        b, t = self.attention_mask.cpu().bool().nonzero(as_tuple=True)  # real tokens, row-major
        point = torch.arange(n).repeat_interleave(len(b))
        b, t = b.repeat(n), t.repeat(n)

        def gathered(x: Tensor) -> Tensor:
            return x.cpu()[point, b, t]

        pb = list(zip(point.tolist(), b.tolist(), t.tolist(), strict=True))
        return pd.DataFrame({
            "point": point.numpy(), "batch": b.numpy(), "pos": t.numpy(),
            "kl": gathered(self.kl).double().numpy(),
            "top1_agree": gathered(self.top1_agree).bool().numpy(),
            "final_token_rank": gathered(self.final_token_rank).long().numpy(),
            "top_token": [self.top_tokens[i][j][k] for i, j, k in pb],
            "top_prob": gathered(self.top_probs[..., 0]).double().numpy(),
        })


def _final_norm(trace, x: Tensor) -> Tensor:
    spec = trace.anatomy.norms.get("ln_final")
    return x if spec is None else spec.apply(x)


def log_probs(logits: Tensor) -> Tensor:
    """``logits − logsumexp(logits)``: log-probabilities whose probabilities sum to 1 ± 2e-6.

    PyTorch's CPU ``log_softmax`` over SmolLM2's 49,152 logits leaves the probabilities'
    mass off by up to 1.5e-5, which a KL of 100 nats turns into 1e-3 nats of error.
    """
    return logits - torch.logsumexp(logits, -1, keepdim=True)


def kl_rows(logp: Tensor, logq: Tensor, p: Tensor | None = None) -> Tensor:
    """``KL(p ‖ q) = Σ p (log p − log q)`` over the last dimension, from log-probabilities.

    A token to which ``p`` gives no probability adds nothing (``0 · log 0 = 0``, the limit), so
    logits of ``-inf`` there give 0, not NaN; a token to which ``p`` gives probability and ``q``
    none makes the KL infinite, as it is; a NaN stays NaN. ``p``: ``logp.exp()``, if at hand.
    """
    p = logp.exp() if p is None else p
    return torch.where(p == 0, 0, p * (logp - logq)).sum(-1)  # NaN stays NaN


def logit_lens(trace, *, k: int = 5) -> LogitLens:
    """The logit lens over every point of ``trace`` (see the module docstring).

    ``k``: how many of each position's most likely tokens to keep per point.
    """
    need_trace(trace, "logit_lens")
    unembed = trace.model.unembed()
    vocab, top = unembed.W_U.shape[-1], as_index(k)
    if top is None or not 1 <= top <= vocab:
        raise InputError(f"k is a number of top tokens in 1..{vocab} (the vocabulary), not {k!r}")
    k = top
    final = log_probs(trace.logits)
    final_top = trace.logits.argmax(-1)
    kls, agree, ranks, ids, probs = [], [], [], [], []
    tok = trace.model.tokenizer
    for L in range(trace.anatomy.n_layers + 1):
        logits = unembed.logits(_final_norm(trace, trace.stream(L)))
        logp = log_probs(logits)
        kls.append(kl_rows(final, logp).clamp_min(0))  # rounding gave -3e-7
        # ranks compare logits, not log-probabilities: subtracting logsumexp in float32 can
        # round two distinct logits into a tie
        agree.append((logits.argmax(-1) == final_top).float())
        ranks.append((logits > logits.gather(-1, final_top[..., None])).sum(-1))
        p, i = logp.exp().topk(k, dim=-1)
        ids.append(i)
        probs.append(p)
    top_ids = torch.stack(ids).cpu()
    top_tokens = tuple(tuple(tuple(tok.convert_ids_to_tokens(row[:, 0].tolist()))
                             for row in point) for point in top_ids)
    return LogitLens(torch.stack(kls).cpu(), torch.stack(agree).cpu(), torch.stack(ranks).cpu(),
                     top_ids, torch.stack(probs).cpu(), top_tokens, trace.attention_mask.cpu())


@dataclass(frozen=True, eq=False, repr=False)
class DirectLogitAttribution(CompactRepr):
    """Per contribution and token: its term in the target logit (or logit difference).

    ``values.sum(0) + bias`` equals the model's logit (difference) for the target tokens;
    for a model that soft-caps its logits (``softcap``: its ``c``), the logits before the cap.
    """

    labels: tuple[str, ...]
    kinds: tuple[str, ...]
    layers: tuple[int, ...]
    values: Float[Tensor, "component batch pos"]
    bias: Float[Tensor, "batch pos"]
    targets: Int[Tensor, "batch pos"]
    baselines: Int[Tensor, "batch pos"] | None
    attention_mask: Int[Tensor, "batch pos"]
    str_tokens: tuple[tuple[str, ...], ...]
    softcap: float | None = None

    def total(self) -> Float[Tensor, "batch pos"]:
        """The reconstructed logit (difference): every term plus ``b_U`` (before any soft-cap)."""
        return self.values.sum(0) + self.bias

    def top(self, n: int = 10, position: Position = "mean") -> pd.DataFrame:
        """The ``n`` rows of ``to_frame(position)`` largest in magnitude, largest first.

        With ``position="each"``, the ``n`` largest (contribution, token) terms.
        """
        n = top_count(n, "rows")
        frame = self.to_frame(position)
        order = frame.logit.abs().sort_values(ascending=False, kind="stable").index[:n]
        return frame.loc[order].reset_index(drop=True)

    def to_frame(self, position: Position = "mean") -> pd.DataFrame:
        """Per contribution: its term in logit units, with its kind and layer.

        ``position``: ``"mean"`` over real tokens; ``"last"``, at each row's last real token,
        averaged over rows (where a prompt's answer is predicted); ``"each"``, one row per
        contribution and real token (``batch, pos, token``: the input token there, ``target``:
        the id whose logit it is, and ``baseline`` when the terms are of a logit difference).
        A model whose head has a bias gets a last row ``b_U`` (kind ``unembed_bias``, one layer
        past the last), so that every view's rows sum to the logit (difference), as ``total``.
        """
        check_choice("position", position, get_args(Position))
        labels, kinds, layers, values = self.labels, self.kinds, self.layers, self.values
        if bool(self.bias.ne(0).any()):
            labels, kinds, layers = (*labels, "b_U"), (*kinds, "unembed_bias"), (*layers, max(layers) + 1)
            values = torch.cat([values, self.bias[None]])
        base = {"label": labels, "kind": kinds, "layer": layers}
        mask = self.attention_mask.bool()
        if position == "mean":
            return pd.DataFrame({**base, "logit": masked_mean(values, mask, lead=1).numpy()})
        if position == "last":
            last = mask.sum(1) - 1
            return pd.DataFrame({**base, "logit": values[:, torch.arange(len(last)), last].mean(1).numpy()})
        rows, pos = mask.nonzero(as_tuple=True)
        n, c = len(rows), len(labels)
        tokens = [self.str_tokens[r][p] for r, p in zip(rows.tolist(), pos.tolist(), strict=True)]
        ids = {"target": self.targets} | ({} if self.baselines is None else {"baseline": self.baselines})
        return pd.DataFrame({key: np.repeat(value, n) for key, value in base.items()} | {
            "batch": np.tile(rows.numpy(), c), "pos": np.tile(pos.numpy(), c), "token": tokens * c,
            **{key: np.tile(v[rows, pos].numpy(), c) for key, v in ids.items()},
            "logit": values[:, rows, pos].flatten().numpy()})


Target = Literal["top", "next"]
Position = Literal["mean", "last", "each"]


def _ids(trace, ids, what: str, vocab: int) -> Tensor:
    """Token ids ``[batch, pos]`` from ``ids``: one id, one per row, or one per position.

    An int is used at every position; a ``[batch]`` sequence (or ``[batch, 1]``) gives each
    row its own id at every position; ``[batch, pos]`` is used as it is. ``InputError`` for
    anything else, or an id outside the vocabulary.
    """
    shape = tuple(trace.tokens.shape)
    text = next((i for i in ids if isinstance(i, str)), None) if isinstance(ids, (list, tuple)) else None
    if text is not None:
        raise InputError(f"{what} ids are token ids, not text like {text!r}: "
                         "model.tokenizer(' Mary', add_special_tokens=False)['input_ids'][0] is one")
    index = as_index(ids)
    try:
        ids = torch.as_tensor(index if index is not None else ids)
    except (TypeError, ValueError, RuntimeError):
        ids = torch.zeros(0)  # refused below, by its dtype
    if ids.is_floating_point() or ids.is_complex() or ids.dtype == torch.bool \
            or ids.shape not in ((), (shape[0],), (shape[0], 1), shape):
        raise InputError(f"{what} ids are one token id, one per row [{shape[0]}], or one per "
                         f"position [batch, pos] = {list(shape)}; got {ids.dtype} {tuple(ids.shape)}"
                         " (an id: model.tokenizer(' Mary', add_special_tokens=False)['input_ids'][0])")
    ids = (ids[:, None] if ids.ndim == 1 else ids).expand(shape).long()  # uint8 would index as a mask
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < vocab):
        raise InputError(f"{what} ids must be token ids in 0..{vocab - 1}, got {int(ids.min())}"
                         f"..{int(ids.max())}")
    return ids.to(trace.logits.device)


def _targets(trace, target) -> Tensor:
    if not isinstance(target, str):
        return _ids(trace, target, "target", trace.logits.shape[-1])
    if target == "top":
        return trace.logits.argmax(-1)
    if target == "next":  # the next input token; a row's last real position keeps the model's top
        top = trace.logits.argmax(-1)
        nxt, real = (t[:, 1:].to(top.device) for t in (trace.tokens, trace.attention_mask.bool()))
        return torch.cat([torch.where(real, nxt, top[:, :-1]), top[:, -1:]], 1)  # never a pad
    raise InputError(f"target must be 'top', 'next' or token ids (one, one per row, or [batch, pos]), "
                     f"got {target!r}")


def direct_logit_attribution(
    trace, *, target: Target | int | Sequence[int] | Tensor = "top",
    baseline: int | Sequence[int] | Tensor | None = None,
) -> DirectLogitAttribution:
    """Exact per-contribution terms of each position's target logit (see the module docstring).

    Args:
        trace: A trace of a model with a linear unembedding.
        target: ``"top"`` (the model's prediction), ``"next"`` (the next input token) or token
            ids: one id (every position), one per row (``[batch]``, e.g. each prompt's answer
            for ``to_frame("last")``) or ``[batch, pos]``.
        baseline: Optional ids, in the same forms: attribute the logit difference instead.
    """
    need_trace(trace, "direct_logit_attribution")
    unembed = trace.model.unembed()
    if unembed.transform is not None:
        raise NotAvailableError(
            "direct logit attribution needs a linear unembedding; this model applies a "
            "nonlinear head transform after the stream. Use the logit lens instead.")
    tgt = _targets(trace, target)
    direction = unembed.W_U.T[tgt]                                   # (batch, pos, d_model)
    bias = unembed.b_U[tgt] if unembed.b_U is not None else torch.zeros(tgt.shape)
    base = None
    if baseline is not None:
        base = _ids(trace, baseline, "baseline", trace.logits.shape[-1]).to(tgt.device)
        direction = direction - unembed.W_U.T[base]
        bias = bias - (unembed.b_U[base] if unembed.b_U is not None else 0)
    if unembed.scale:  # Cohere multiplies its logits
        direction, bias = direction * unembed.scale, bias * unembed.scale
    parts = trace.decompose("final")
    values = torch.einsum("cbpd,bpd->cbp", parts.values, direction.to(parts.values.device))
    return DirectLogitAttribution(parts.labels, parts.kinds, parts.layers, values.cpu(),
                                  bias.float().cpu(), tgt.cpu().contiguous(),
                                  None if base is None else base.cpu().contiguous(),
                                  trace.attention_mask.cpu(),
                                  tuple(tuple(t) for t in trace.str_tokens), unembed.softcap or None)
