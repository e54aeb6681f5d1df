"""Path patching: how much of a behaviour goes from a sender's write straight to a receiver's read.

A sender (a head ``L3H1``, a whole ``L3.attn``, an ``L3.mlp`` or an embedding) writes
differently in the clean run and in a ``reference`` run (a corrupted prompt). Path patching
gives one receiver, and only it, the reference's write: the receiver reads the clean stream
plus the difference of the two writes, carried to its read point along the stream itself,
while every other component reads the clean stream. Whatever the receiver then writes
flows on as in the model, so the metric's change is what passes through the path
*sender → stream → receiver → rest of the model*. Wang et al. (2022) found the IOI circuit
this way.

The difference travels as the decomposition carries contributions: through each norm on
the way with the clean run's per-token scale frozen (``NormSpec.apply_linear``), and through
DeepNorm's α. In a pre-norm model nothing stands between a write and a later read, so it
arrives unchanged; in a post-norm model every block's LayerNorm between the two scales and
centres it. The receiver's own read norm is computed afresh on the patched stream, as the
model computes it.

Receivers: ``"L5.attn"`` (every query, key and value of the block), ``"L5H3"`` (head 3's
query, key and value), ``"L5H3.q"`` (one of them; a key or value under grouped-query
attention is the one its group of heads shares), ``"L5.mlp"``, and ``"logits"`` (the
unembedding's read: the stream after the last block). A receiver is patched through the
output of the projections that read the stream (``ModulePaths.qkv``, ``mlp_in``,
``mlp_gate``): each gets ``f(N(x + Δ)) − f(N(x))`` added on the receiver's columns, ``x``
the stream where it reads, as this pass has it (so the later of two receivers patched
together reads what the earlier one then wrote). Where the model normalizes the queries or
keys of all heads together (OLMo 2), a head's query or key is patched after that norm, so
that no other head's changes. Receivers of a group reading at one point are merged (each
column changed once); senders of a group must not share a write (``L3.attn`` and ``L3H1``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..fusion import wide
from ..hookio import first_input, first_output
from ..program import Add, Norm, Scale
from ..walk import component_of
from . import path_args
from .ablation_args import checked_patching, metric_values, position_mask, reference_metric
from .patching import (
    ALL,
    Shares,
    copy_rows,
    in_rows,
    logit_columns,
    spread_logits,
    stack_size,
    stacked_logits,
)
from .path_args import LOGITS, Receiver
from .results import CompactRepr


@dataclass(frozen=True, eq=False, repr=False)
class PathPatching(Shares, CompactRepr):
    """The metric with each sender's write patched into each receiver's read only.

    ``metric [sender, receiver]``; ``metric_clean`` and ``metric_reference``: of the two runs
    themselves. ``senders`` and ``receivers``: their labels (a group patched together is
    joined by ``+``). ``connected [sender, receiver]``: whether the receiver reads the stream
    after any of the senders writes to it (False: no path, the metric is the clean run's).
    ``run``: whether that patch needed a forward pass (False also where the reference's
    writes equal the clean ones). Per-text fields as ``StreamPatching``'s.
    """

    senders: tuple[str, ...]
    receivers: tuple[str, ...]
    metric: Float[Tensor, "sender receiver"]
    metric_clean: float
    metric_reference: float
    run: Bool[Tensor, "sender receiver"]
    connected: Bool[Tensor, "sender receiver"]
    per_text: Float[Tensor, "sender receiver batch"] | None = None
    per_text_clean: Float[Tensor, " batch"] | None = None
    per_text_reference: Float[Tensor, " batch"] | None = None

    def to_frame(self, per_text: bool = False) -> pd.DataFrame:
        """Long frame: ``sender, receiver, metric, metric_change, metric_share, run, connected``.

        ``per_text=True``: a row per text too (``text``; the shares each text's own).
        """
        n, m = self.metric.shape
        frame = self.long_frame({"sender": np.repeat(self.senders, m), "receiver": list(self.receivers) * n},
                                per_text)
        times = len(frame) // self.run.numel()
        frame["run"] = np.repeat(self.run.flatten().numpy(), times)
        frame["connected"] = np.repeat(self.connected.flatten().numpy(), times)
        return frame


def _carried(trace, delta: Tensor, start: int, stop: int) -> Tensor:
    """``delta``, added by the op at ``start``, as the stream holds it at op ``stop``.

    Through a write norm (``Add.via``) and every whole-stream norm between, with the clean
    run's scales frozen (their linear part: the bias cancels in a difference), and α.
    """
    a = trace.anatomy
    first = a.program[start]
    if isinstance(first, Add) and first.via is not None:
        delta = a.norms[first.via].apply_linear(delta, trace.norm_scale(first.via))
    for op in a.program[start + 1:stop]:
        if isinstance(op, Norm):
            delta = a.norms[op.norm].apply_linear(delta, trace.norm_scale(op.norm))
        elif isinstance(op, Scale):
            delta = delta * op.alpha
    return delta


def _edits(trace, receiver: Receiver, delta: Tensor, rows: slice) -> list[tuple]:
    """Hooks giving ``receiver`` the stream plus ``delta`` at its read, in ``rows`` of the pass.

    A pre-hook keeps the stream where the receiver reads it in this pass (its read norm's
    input, or a projection's for a raw read); each reading's hook adds ``f(N(x + Δ)) − f(N(x))``
    of that stream, so a receiver after another of its group reads the stream as that one
    left it.
    """
    model, a = trace.model, trace.anatomy
    if receiver.component is None:  # the logits: the stream after the last block
        d = delta.to(model.device, model.dtype)
        return [(a.modules.layers[-1], lambda module, args, output: in_rows(
            output, rows, (first_output(output)[rows] if rows != ALL else first_output(output)) + d))]
    norm = (lambda s: s) if receiver.norm is None else a.norms[receiver.norm].apply
    module = model.module  # get_submodule, not named_modules: a bridge reaches its layers' parts by name
    stream: dict[str, Tensor] = {}
    edits: list[tuple] = []
    for g in receiver.readings:
        source = g.chain[0] if receiver.norm is None else a.modules.norms[receiver.norm]
        if source not in {e[0] for e in edits if len(e) == 3}:  # one pre-hook per source
            edits.append((source, _keeping(stream, source), True))
        chain = [module.get_submodule(p).forward for p in g.chain]
        edits.append((g.hook, _reading(chain, stream, source, norm, delta.to(model.device), rows, g.columns)))
    return edits


def _keeping(stream: dict, source: str) -> Callable:
    """A forward pre-hook keeping the module's main input in ``stream[source]`` (changing nothing)."""
    def hook(module, args, kwargs):
        stream[source] = first_input(args, kwargs)
    return hook


def _reading(chain: list[Callable], stream: dict, source: str, norm: Callable, delta: Tensor, rows: slice,
             columns: Tensor | None) -> Callable:
    """A forward hook adding ``f(N(x + Δ)) − f(N(x))`` to ``rows`` of the output, on ``columns`` only.

    ``f``: ``chain`` in turn, each module's ``forward`` (not ``__call__``: no hooks of its own);
    ``x``: ``stream[source]``, kept by ``_keeping`` earlier in the pass.
    """
    def hook(module, args, output):
        x = stream[source]
        x = x[rows] if rows != ALL else x
        wide_x = wide(x)
        before, after = norm(wide_x).to(x.dtype), norm(wide_x + delta.to(wide_x.dtype)).to(x.dtype)
        for f in chain:
            before, after = f(before), f(after)
        diff = first_output(after) - first_output(before)  # a module may return more (gpt-oss's MLP)
        if columns is not None:
            diff = torch.zeros_like(diff).index_copy_(-1, columns.to(diff.device),
                                                      diff.index_select(-1, columns.to(diff.device)))
        y = first_output(output)
        return in_rows(output, rows, (y[rows] if rows != ALL else y) + diff.to(y.dtype))
    return hook


def path_patch(trace, reference, metric: Callable[[Tensor], Tensor | float], *,
               senders: str | Sequence[str | Sequence[str]] | None = None,
               receivers: str | Sequence[str | Sequence[str]] = LOGITS,
               positions: int | Sequence[int] | Tensor | None = None,
               batch_size: int | None = None, logits_at=None) -> PathPatching:
    """Patch each sender's write into each receiver's read only, from ``reference``; measure ``metric``.

    ``reference``: a trace of the same model and shape (a corrupted prompt). ``metric``: a
    function of the logits returning one number or one per text, as ``patch_stream``'s.
    ``senders``: heads (``"L3H1"``), components (``"L3.attn"``, ``"L3.mlp"``) or embeddings
    (``"embed"``); a tuple in the list is patched together (default every head, one by one).
    ``receivers``: ``"L5.attn"``, ``"L5H3"``, ``"L5H3.q"`` (``.k``, ``.v``), ``"L5.mlp"`` or
    ``"logits"``, one or a list, a tuple receiving together (default ``"logits"``: each
    sender's direct effect). ``positions``: where the writes' difference is sent (token
    indices, -1 each row's last; or a bool mask ``[batch, pos]``; default every real token).
    ``batch_size``: patched runs stacked per forward pass (default as ``patch_stream``'s).
    ``logits_at``: the positions the metric reads, unembedded alone (as ``patch_stream``'s).
    See the module docstring for what travels where.
    """
    checked_patching(trace, reference, metric, "path_patch", "each sender's write")
    a = trace.anatomy
    send = path_args.groups(senders, list(a.heads), "senders", "['L3H1', ('L4H2', 'L4H7'), 'L2.mlp']")
    receive = path_args.groups(receivers, [LOGITS], "receivers", "['L9H6.q', 'L9.attn', 'logits']")
    mask = position_mask(trace, positions)
    heads: dict = {}
    for g in send:
        path_args.checked_senders(trace, g)
    senders_of = [[path_args.sender(trace, reference, n, mask, heads) for n in g] for g in send]
    receivers_of = [path_args.merged([path_args.receiver(trace, n) for n in g]) for g in receive]
    rows = trace.tokens.shape[0]
    clean = metric_values(metric, trace.logits.float().clone(), rows)
    columns = logit_columns(trace, metric, logits_at, clean)
    stack = stack_size(trace, batch_size, "patched runs", columns)
    out = clean.expand(len(send), len(receive), len(clean)).clone()
    run = torch.zeros(len(send), len(receive), dtype=torch.bool)
    connected = torch.zeros_like(run)

    def measure(chunk: list) -> None:
        edits = [e for c, (_, _, deltas) in enumerate(chunk) for r, d in deltas
                 for e in _edits(trace, r, d, copy_rows(trace, c) if len(chunk) > 1 else ALL)]
        first = min(a.n_layers if r.component is None else component_of(r.component)[0]
                    for _, _, deltas in chunk for r, _ in deltas)
        logits = stacked_logits(trace, edits, len(chunk), skip=first, columns=columns)
        for c, (i, j, _) in enumerate(chunk):
            out[i, j] = metric_values(metric, spread_logits(logits[c * rows:(c + 1) * rows], columns, trace),
                                      rows, len(clean))

    chunk: list = []  # runs planned and not yet measured: at most ``stack`` differences held
    for i, group in enumerate(senders_of):
        deltas = [s.delta() for s in group]
        for j, receiving in enumerate(receivers_of):
            carried = [(r, sum(_carried(trace, d, s.start, r.stop) for s, d in zip(group, deltas, strict=True)
                               if s.start < r.stop)) for r in receiving]
            connected[i, j] = any(isinstance(d, Tensor) for _, d in carried)
            carried = [(r, d) for r, d in carried if isinstance(d, Tensor) and bool(d.any())]
            if carried:
                chunk.append((i, j, carried))
                run[i, j] = True
            if len(chunk) == stack:
                measure(chunk)
                chunk = []
    if chunk:
        measure(chunk)
    reference_values = reference_metric(metric, reference.logits.float().clone(), rows, clean)
    per_text = len(clean) > 1
    return PathPatching(tuple("+".join(g) for g in send), tuple("+".join(g) for g in receive),
                        out.mean(-1), float(clean.mean()), float(reference_values.mean()), run, connected,
                        out if per_text else None, clean if per_text else None,
                        reference_values if per_text else None)
