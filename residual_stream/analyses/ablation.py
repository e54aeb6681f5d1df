"""Causal check of the linear picture: ablate a write, see what really changes.

Read attribution is linear: it says how much of component ``j``'s read comes *directly* from
write ``i``, through norm scales frozen at the values of the clean run. Ablating ``i`` for real
also moves every later write that read it and every norm scale. Here each write ``i`` (an
attention or an MLP output, before any sandwich norm, or one head's part of an attention's
output, ``"L3H5"``) is replaced by its mean over the trace's real tokens (``mode="mean"``;
or over a ``reference`` trace's: mean-ablation over a reference distribution, such as prompts
of the same template with other names), by zero (``mode="zero"``), or by its value at the same
position in a ``reference`` run of the same shape (``mode="patch"``: activation patching, e.g.
from a corrupted prompt into the clean one) in a fresh forward pass, and we measure

* the relative change of every later component's read ``‖Δu_j‖ / ‖u_j‖`` (mean over tokens);
* when the model has an LM head, the final distribution's change: ``KL(clean ‖ ablated)`` in
  nats averaged over every real token (``logit_kl``) and at each row's last real token
  (``last_kl``), the change of the clean top token's logit, and the change of the
  next-token cross-entropy (``loss_change``, over the positions whose next token is real);
* a ``metric`` of your own on the logits, such as a logit difference at each prompt's last
  token (the clean and each ablated value);

then correlate the read changes with the linear attribution ``mean |share|`` of ``i`` in ``j``
(Pearson and Spearman over all pairs where ``j`` reads after ``i`` is added, ``Anatomy.sees``:
in a parallel block the MLP does not read its own attention's write). A high correlation says
the linear picture ranks influence the way interventions do; where they disagree, indirect
paths or norm-scale changes matter. A head's linear share is its own (read attribution at
head granularity), a whole attention's that of its summed write.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..capture import capture
from ..errors import InputError, NotAvailableError, check_choice, check_flag, need_trace
from ..memory import trace_bytes
from ..walk import component_of, head_of, read_inputs
from .ablation_args import (
    PER_TEXT,
    checked_metric,
    checked_writes,
    metric_values,
    position_mask,
    reference_metric,
    reference_trace,
    text_shares,
)
from .ablation_edits import Edit
from .flow import read_attribution
from .lens import kl_rows, log_probs
from .patching import copy_rows, spread_logits, stack_size, stacked_logits
from .results import CompactRepr
from .tokens import masked_mean

CAPTURE_BUDGET = 2**30  # bytes of stacked captures (every read kept) an ablation pass may hold

Mode = Literal["mean", "zero", "patch"]


@dataclass(frozen=True, eq=False, repr=False)
class AblationCheck(CompactRepr):
    """Causal effects of ablating each write, and their agreement with linear attribution.

    Per write (NaN without an LM head): ``logit_kl``, ``KL(clean ‖ ablated)`` of the output
    distributions in nats, averaged over real tokens, ``last_kl`` the same at each row's last
    real token (averaged over rows), ``top_logit_change`` of the clean top token's raw logit
    (over real tokens), ``loss_change`` of the next-token cross-entropy in nats
    (over tokens whose next token is real; NaN when none is, and for a masked LM, which does
    not predict the next token). ``metric``: ``metric(logits)`` of each ablated run, and
    ``metric_clean`` of the clean one (None without a ``metric``). ``reference``: the
    ``[batch, pos]`` shape of the reference trace whose means or writes replaced (None: the
    trace's own means, or zeros); ``metric_reference``: the metric on its run when patching.
    ``positions``: the ``[batch, pos]`` mask of where writes were replaced (None: everywhere).
    With a metric returning one value per text: ``metric_per_text [write, text]``,
    ``metric_clean_per_text`` and ``metric_reference_per_text`` ``[text]``, the fields above
    their means. ``outputs()`` frames them.
    """

    writes: tuple[str, ...]
    readers: tuple[str, ...]
    effect: Float[Tensor, "write reader"]
    linear: Float[Tensor, "write reader"]
    logit_kl: Float[Tensor, " write"]
    top_logit_change: Float[Tensor, " write"]
    pearson: float
    spearman: float
    mode: str
    last_kl: Float[Tensor, " write"]
    loss_change: Float[Tensor, " write"]
    metric: Float[Tensor, " write"] | None = None
    metric_clean: float | None = None
    reference: tuple[int, ...] | None = None
    metric_reference: float | None = None
    positions: Bool[Tensor, "batch pos"] | None = None
    metric_per_text: Float[Tensor, "write text"] | None = None
    metric_clean_per_text: Float[Tensor, " text"] | None = None
    metric_reference_per_text: Float[Tensor, " text"] | None = None

    def to_frame(self) -> pd.DataFrame:
        """Long frame: ``write, reader, effect, linear`` for pairs where the reader sees the write."""
        f = pd.DataFrame({
            "write": np.repeat(self.writes, len(self.readers)),
            "reader": list(self.readers) * len(self.writes),
            "effect": self.effect.flatten().numpy(), "linear": self.linear.flatten().numpy()})
        return f.dropna().reset_index(drop=True)

    def outputs(self, per_text: bool = False) -> pd.DataFrame:
        """Per write: ``logit_kl, last_kl, top_logit_change, loss_change``.

        With a ``metric``, also its ablated value (``metric``) and ``metric_change`` from the clean
        run; with a reference too, ``metric_share``: that change over the reference's.
        ``per_text=True``: per write and text, the metric's ``metric, metric_change,
        metric_share`` for a metric returning one value per text.
        """
        if per_text:
            return _per_text_frame(self)
        out = {"write": self.writes, "logit_kl": self.logit_kl.numpy(), "last_kl": self.last_kl.numpy(),
               "top_logit_change": self.top_logit_change.numpy(), "loss_change": self.loss_change.numpy()}
        if self.metric is not None:
            out |= {"metric": self.metric.numpy(), "metric_change": (self.metric - self.metric_clean).numpy()}
        if self.metric_reference is not None:  # NaN when the reference's metric equals the clean one
            gap = self.metric_reference - self.metric_clean
            out["metric_share"] = (self.metric - self.metric_clean).numpy() / gap if gap else np.nan
        return pd.DataFrame(out)


def _per_text_frame(check: AblationCheck) -> pd.DataFrame:
    """``AblationCheck.outputs(per_text=True)``."""
    if check.metric_per_text is None:
        raise InputError(PER_TEXT)
    m, clean = check.metric_per_text, check.metric_clean_per_text
    n, b = m.shape
    out = {"write": np.repeat(check.writes, b), "text": list(range(b)) * n, "metric": m.flatten().numpy(),
           "metric_change": (m - clean).flatten().numpy()}
    if check.metric_reference_per_text is not None:  # NaN where a text's two runs agree
        out["metric_share"] = text_shares(m, clean, check.metric_reference_per_text).flatten().numpy()
    return pd.DataFrame(out)


def _rank(x: np.ndarray) -> np.ndarray:
    return pd.Series(x).rank().to_numpy()


def _output_meter(trace) -> Callable[[Tensor], Tensor]:
    """``f(logits)``: ``[logit_kl, last_kl, top_logit_change, loss_change]`` against the clean run.

    The clean run's log-probabilities, top tokens and next-token terms are computed once.
    """
    mask, clean = trace.attention_mask, trace.logits
    p = log_probs(clean)
    prob = p.exp()
    last = (mask.sum(1) - 1).clamp_min(0).to(p.device)[:, None]
    top = clean.argmax(-1, keepdim=True)
    clean_top = clean.gather(-1, top)
    nxt = trace.tokens[:, 1:, None].to(p.device)
    clean_next = p[:, :-1].gather(-1, nxt)
    has_next = mask[:, 1:].bool()
    causal = trace.anatomy.causal and bool(has_next.any())  # a masked LM does not predict the next token

    def measure(logits: Tensor) -> Tensor:
        q = log_probs(logits)
        kl = kl_rows(p, q, prob).clamp_min(0)  # (batch, pos); ≥ 0 but for float32 rounding
        dtop = (logits.gather(-1, top) - clean_top)[..., 0]
        dloss = (clean_next - q[:, :-1].gather(-1, nxt))[..., 0]  # next-token loss change
        loss = float(masked_mean(dloss, has_next)) if causal else float("nan")
        return torch.tensor([float(masked_mean(kl, mask)), float(kl.gather(1, last).mean()),
                             float(masked_mean(dtop, mask)), loss])

    return measure


def _linear(trace, writes: tuple[str, ...], readers: tuple[str, ...], later: Tensor) -> Tensor:
    """``mean |share|`` of each write in each reader's read (NaN where the reader cannot see it).

    Readers are averaged over their channels and heads (``matrix``), as for whole components.
    """
    frames = {}
    if any(head_of(w) is None for w in writes):
        frames["component"] = read_attribution(trace).matrix("component", absolute=True)
    if any(head_of(w) for w in writes):
        frames["head"] = read_attribution(trace, granularity="head").matrix(
            "component", absolute=True, sources=False)
    out = torch.full(later.shape, float("nan"))
    for i, w in enumerate(writes):
        frame = frames["head" if head_of(w) else "component"]
        for j, r in enumerate(readers):
            if later[i, j] and r in frame.index and w in frame.columns:
                out[i, j] = float(frame.at[r, w])
    return out


def _with_reads(trace, writes, readers, later, edit: Edit, metric, k: int,
                batch_size: int) -> tuple[Tensor, Tensor, Tensor]:
    """``(effect, outputs, metric)`` of each write's ablation, every read captured.

    Ablated runs are stacked ``batch_size`` per pass, fewer where their captures would pass
    ``CAPTURE_BUDGET`` bytes (``memory.trace_bytes`` per copy); each copy's reads are walked
    from its rows of the capture.
    """
    a, mask = trace.anatomy, trace.attention_mask
    tokens, dev_mask = trace.tokens.to(trace.model.device), mask.to(trace.model.device)
    # every pass, the clean one too, with attention outputs whole: as the edit leaves them (per-
    # head z would be before it), and rounded as the model rounds them (a 16-bit model's own
    # output projection), so that an ablation changing nothing measures 0
    clean = read_inputs(trace, capture(trace.model.module, a, tokens, dev_mask, heads=False))
    effect = torch.full((len(writes), len(readers)), float("nan"))
    outputs = torch.full((len(writes), 4), float("nan"))  # logit_kl, last_kl, top, loss
    measured = torch.full((len(writes), k), float("nan"), dtype=torch.float64)
    meter = _output_meter(trace) if a.has_lm_head else None
    stack = max(1, min(batch_size, CAPTURE_BUDGET // trace_bytes(a, tuple(tokens.shape), heads=False)))
    for start in range(0, len(writes), stack):
        chunk = range(start, min(start + stack, len(writes)))
        n = len(chunk)
        cap = capture(trace.model.module, a, tokens.repeat(n, 1), dev_mask.repeat(n, 1), heads=False,
                      edits=[edit(writes[i], c, n) for c, i in enumerate(chunk)])
        for c, i in enumerate(chunk):
            mine = cap.rows(copy_rows(trace, c)) if n > 1 else cap
            inputs = read_inputs(trace, mine)
            for j, reader in enumerate(readers):
                if later[i, j]:
                    change = (inputs[reader] - clean[reader]).norm(dim=-1) / clean[reader].norm(dim=-1)
                    effect[i, j] = float(masked_mean(change, mask))
            if meter is not None:
                outputs[i] = meter(mine.logits)
            if metric is not None:
                measured[i] = metric_values(metric, mine.logits.float().clone(), len(tokens), k)
    return effect, outputs, measured


def _outputs_only(trace, writes, edit: Edit, metric, batch_size: int, k: int) -> tuple[Tensor, Tensor]:
    """``(outputs, metric [write, k])`` of each write's ablation, ``batch_size`` runs per pass (skipping)."""
    outputs = torch.full((len(writes), 4), float("nan"))
    measured = torch.full((len(writes), k), float("nan"), dtype=torch.float64)
    rows, meter = trace.tokens.shape[0], _output_meter(trace)
    for start in range(0, len(writes), batch_size):
        chunk = range(start, min(start + batch_size, len(writes)))
        first = min((head_of(writes[i]) or component_of(writes[i]))[0] for i in chunk)  # blocks before: clean
        logits = stacked_logits(trace, [edit(writes[i], c, len(chunk)) for c, i in enumerate(chunk)],
                                len(chunk), skip=first)
        for c, i in enumerate(chunk):
            mine = spread_logits(logits[c * rows:(c + 1) * rows], None, trace)
            outputs[i] = meter(mine)
            if metric is not None:
                measured[i] = metric_values(metric, mine.clone(), rows, k)
    return outputs, measured


def ablation_check(trace, *, writes: Sequence[str] | None = None, mode: Mode = "mean",
                   reads: bool = True, reference=None,
                   metric: Callable[[Tensor], Tensor | float] | None = None,
                   positions: int | Sequence[int] | Tensor | None = None,
                   batch_size: int | None = None) -> AblationCheck:
    """Ablate each write in a fresh forward pass and compare with linear read attribution.

    ``writes``: component names (``"L0.attn"``, ``"L2.mlp"``) or heads (``"L1H3"``); default
    every component; ``mode``: ``"mean"`` replaces a write by its mean over the trace's real
    tokens (every position, the first included), ``"zero"`` by zeros, ``"patch"`` by the
    ``reference`` run's write at the same position. ``reference``: another trace of the same
    model, whose real tokens give the means instead (``"mean"``), or whose writes are patched
    in (``"patch"``: the same ``[batch, pos]`` shape).
    ``reads=False`` measures only the output (``outputs()``): no later read's change, no
    linear attribution (``effect``, ``linear`` and the correlations NaN), several times faster.
    ``metric``: a function of the logits ``[batch, pos, vocab]`` (float32, pads included: mask
    with ``trace.attention_mask``) returning one number (or one per text, ``[batch]``: per-text
    results besides their means, ``outputs(per_text=True)``), measured on the clean run and on each
    ablated one (``AblationCheck.metric``, ``outputs()``'s ``metric_change``), and, patching, on
    the ``reference`` run (``metric_reference``; ``outputs()``'s ``metric_share``,
    the part of the way from the clean value to it that the ablation moves: patching from a
    corrupted run, the share of the effect a write carries). ``positions``: replace only
    there, token indices in each row (``-1``: each row's last real token; a list of them) or
    a ``[batch, pos]`` bool mask; a mean is still over every real token. ``batch_size``:
    ablated runs stacked per forward pass (default: as many as keep their logits and the pass's
    largest activations within 1 GiB, at most 16; memory grows with it: that many copies of
    the batch's activations and logits);
    with reads, also no more than keep their captures within 1 GiB.
    """
    need_trace(trace, "ablation_check")
    check_flag("reads", reads)
    batch_size = stack_size(trace, batch_size, "ablated runs")
    if metric is not None:
        checked_metric(metric)
    a = trace.anatomy
    check_choice("mode", mode, get_args(Mode))
    source = reference_trace(trace, reference, mode)
    where = position_mask(trace, positions)
    writes, owners = checked_writes(trace, writes)
    if (metric is not None or not reads) and not a.has_lm_head:
        what = "metric reads" if metric is not None else "reads=False measures only the output, the"
        raise NotAvailableError(f"{what} logits; {a.lm_head_note or 'this model has no LM head'}")
    rows = trace.tokens.shape[0]
    clean_metric = None if metric is None else metric_values(metric, trace.logits.float().clone(), rows)
    k = 0 if clean_metric is None else len(clean_metric)
    ref_metric = None if metric is None or mode != "patch" else \
        reference_metric(metric, reference.logits.float().clone(), rows, clean_metric)
    readers = tuple(c.name for c in a.components)
    later = a.sees(owners, readers) & reads  # the pairs that count: the reader reads after the write
    edit = Edit(trace, mode, source, where)
    if reads:
        effect, outputs, measured = _with_reads(trace, writes, readers, later, edit, metric, k, batch_size)
    else:
        effect = torch.full((len(writes), len(readers)), float("nan"))
        outputs, measured = _outputs_only(trace, writes, edit, metric, batch_size, k)
    linear = _linear(trace, writes, readers, later) if reads else torch.full_like(effect, float("nan"))
    both = ~(effect.isnan() | linear.isnan())
    e, lin = effect[both].numpy(), linear[both].numpy()
    pearson = float(np.corrcoef(e, lin)[0, 1]) if len(e) > 2 else float("nan")
    spearman = float(np.corrcoef(_rank(e), _rank(lin))[0, 1]) if len(e) > 2 else float("nan")
    kl, last_kl, dtop, dloss = outputs.T
    per_text = k > 1
    return AblationCheck(writes, readers, effect, linear, kl, dtop, pearson, spearman, mode,
                         last_kl, dloss, None if metric is None else measured.mean(-1),
                         None if metric is None else float(clean_metric.mean()),
                         None if reference is None else tuple(reference.tokens.shape),
                         None if ref_metric is None else float(ref_metric.mean()), where,
                         measured if per_text else None, clean_metric if per_text else None,
                         ref_metric if per_text else None)
