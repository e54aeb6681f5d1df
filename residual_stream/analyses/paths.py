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
``mlp_gate``): each gets ``f(N(x + Δ)) − f(N(x))`` added on the receiver's columns.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd
import torch
from jaxtyping import Bool, Float
from torch import Tensor

from ..capture import first_output
from ..errors import InputError, UnknownNameError
from ..program import Add, Embed, Mark, Norm, Read, Scale
from ..walk import component_of, walk_stream
from .ablation_args import checked_patching, metric_values, position_mask
from .patching import ALL, Shares, copy_rows, in_rows, stack_size, stacked_logits
from .results import CompactRepr

LOGITS = "logits"  # the receiver that is the unembedding's read
CHANNELS = ("q", "k", "v")


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


@dataclass(frozen=True)
class _Sender:
    name: str
    start: int                    # index of its Add (or Embed) in the program
    delta: Callable[[], Tensor]   # reference write − clean write (before any write norm), when asked


@dataclass(frozen=True)
class _Receiver:
    name: str
    stop: int                     # index of its Read (or of Mark(n_layers) for the logits)
    component: str | None         # None: the logits
    columns: tuple[tuple[str, Tensor | None], ...]  # (module path, its output columns; None: all)


def _group(item: object, what: str) -> tuple[str, ...]:
    names = (item,) if isinstance(item, str) else tuple(item) if isinstance(item, (list, tuple)) else None
    if not names or not all(isinstance(n, str) for n in names):
        raise InputError(f"each of {what} is a name or a tuple of names patched together, not {item!r}")
    return names


def _groups(items: object, default: list[str], what: str, example: str) -> list[tuple[str, ...]]:
    if items is None:
        return [(n,) for n in default]
    if isinstance(items, str):
        return [(items,)]
    if not isinstance(items, (list, tuple)) or not items:
        raise InputError(f"{what} is a name or a list of them (a tuple in it: patched together), e.g. "
                         f"{example}; not {items!r}")
    return [_group(i, what) for i in items]


def _sender(trace, reference, name: str, mask: Tensor | None, heads: dict) -> _Sender:
    """``name`` checked; its write's difference is made when asked, at ``mask``'s tokens.

    ``heads`` keeps one layer's head-write differences while senders of that layer follow
    each other (every head, by default).
    """
    a, program = trace.anatomy, trace.anatomy.program
    head = a.head(name)
    component = f"L{head[0]}.attn" if head else name
    if name in a.embeds:
        start = next(i for i, op in enumerate(program) if isinstance(op, Embed) and op.label == name)
    elif head or component in {c.name for c in a.components}:
        start = next(i for i, op in enumerate(program) if isinstance(op, Add) and op.component == component)
    else:
        raise UnknownNameError(f"no sender {name!r}: senders are heads (L0H0…L{a.n_layers - 1}"
                               f"H{a.n_heads - 1}), components ('L0.attn', 'L0.mlp') or embeddings "
                               f"{list(a.embeds)}")

    def difference() -> Tensor:
        if name in a.embeds:
            return reference.captured.embeds[name] - trace.captured.embeds[name]
        layer, kind = component_of(component)
        if head:
            if heads.get("layer") != layer:
                heads.update(layer=layer, writes=reference.head_writes(layer) - trace.head_writes(layer))
            return heads["writes"][head[1]]
        write = "attn_write" if kind == "attn" else "mlp_write"
        return getattr(reference, write)(layer) - getattr(trace, write)(layer)

    def delta() -> Tensor:
        return difference() if mask is None else difference() * mask.to(trace.tokens.device)[..., None]

    return _Sender(name, start, delta)


def _receiver(trace, name: str) -> _Receiver:
    a, program = trace.anatomy, trace.anatomy.program
    if name == LOGITS:
        stop = next(i for i, op in enumerate(program) if isinstance(op, Mark) and op.point == a.n_layers)
        return _Receiver(name, stop, None, ())
    head = a.head(name, channel=True)
    component = f"L{head[0]}.attn" if head else name
    reads = {op.component: i for i, op in enumerate(program) if isinstance(op, Read)}
    if component not in reads:
        raise UnknownNameError(
            f"no receiver {name!r}: receivers are 'L5.attn', 'L5.mlp', a head 'L5H3' (its query, key "
            f"and value) or one of them 'L5H3.q', and {LOGITS!r} (layers 0..{a.n_layers - 1})")
    layer, kind = component_of(component)
    block = a.modules.layers[layer]
    if kind == "mlp":
        paths = [p for p in (a.modules.mlp_in, a.modules.mlp_gate) if p]
        return _Receiver(name, reads[component], component, tuple((f"{block}.{p}", None) for p in paths))
    if head is None:
        return _Receiver(name, reads[component], component,
                         tuple((f"{block}.{p}", None) for p in a.modules.qkv))
    channels = (head[2],) if head[2] else CHANNELS
    return _Receiver(name, reads[component], component,
                     tuple(_head_columns(a, block, head[1], c) for c in channels))


def _head_columns(a, block: str, head: int, channel: str) -> tuple[str, Tensor]:
    """The module computing ``channel`` of ``head`` and its output columns, for each qkv layout.

    ``separate``: q, k, v modules; ``blocks``: one module, ``[q | k | v]``; ``per_head``: one
    module, ``[head, (q k v), d_head]``. A key or value head is shared by ``n_heads / n_kv_heads``
    query heads.
    """
    c, d = CHANNELS.index(channel), a.d_head
    group = head if c == 0 else head // (a.n_heads // a.n_kv_heads)
    layout = a.modules.qkv_layout
    if layout == "per_head":
        start = (head * 3 + c) * d
    else:
        start = group * d + (0 if layout == "separate" or c == 0 else
                             a.n_heads * d + (c - 1) * a.n_kv_heads * d)
    path = a.modules.qkv[c if layout == "separate" else 0]
    return f"{block}.{path}", torch.arange(start, start + d)


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


def _read_points(trace) -> dict[str, tuple[Tensor, str | None]]:
    """Every component's clean stream at its read point and the norm it reads through.

    And ``"outputs"``: an empty cache of the reading projections' clean outputs (``_edits``).
    """
    reads: dict = {s.op.component: (s.x, s.op.norm) for s in walk_stream(trace) if isinstance(s.op, Read)}
    return {**reads, "outputs": {}}


def _edits(trace, receiver: _Receiver, delta: Tensor, reads: dict, rows: slice) -> list[tuple]:
    """Hooks giving ``receiver`` the stream plus ``delta`` at its read, in ``rows`` of the pass.

    ``reads``: ``_read_points``'s, whose ``"outputs"`` entry caches each projection's clean output.
    """
    model = trace.model
    if receiver.component is None:  # the logits: the stream after the last block
        return [(trace.anatomy.modules.layers[-1], _adding(delta.to(model.device, model.dtype), rows, None))]
    x, norm = reads[receiver.component]
    live = (lambda s: s) if norm is None else trace.anatomy.norms[norm].apply
    after = live(x + delta).to(model.device, model.dtype)
    edits = []
    with torch.inference_mode():
        for path, columns in receiver.columns:
            forward = model.module.get_submodule(path).forward  # not __call__: no hooks of its own
            if path not in reads["outputs"]:
                reads["outputs"][path] = forward(live(x).to(model.device, model.dtype))
            edits.append((path, _adding(forward(after) - reads["outputs"][path], rows, columns)))
    return edits


def _adding(diff: Tensor, rows: slice, columns: Tensor | None) -> Callable:
    """A forward hook adding ``diff`` (only its ``columns``) to ``rows`` of a module's output."""
    if columns is not None:
        kept = torch.zeros_like(diff)
        kept[..., columns] = diff[..., columns]
        diff = kept

    def hook(module, args, output):
        y = first_output(output)
        return in_rows(output, rows, (y[rows] if rows != ALL else y) + diff.to(y.dtype))

    return hook


def path_patch(trace, reference, metric: Callable[[Tensor], Tensor | float], *,
               senders: str | Sequence[str | Sequence[str]] | None = None,
               receivers: str | Sequence[str | Sequence[str]] = LOGITS,
               positions: int | Sequence[int] | Tensor | None = None,
               batch_size: int | None = None) -> PathPatching:
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
    See the module docstring for what travels where.
    """
    checked_patching(trace, reference, metric, "path_patch", "each sender's write")
    stack = stack_size(trace, batch_size, "patched runs")
    a = trace.anatomy
    send = _groups(senders, list(a.heads), "senders", "['L3H1', ('L4H2', 'L4H7'), 'L2.mlp']")
    receive = _groups(receivers, [LOGITS], "receivers", "['L9H6.q', 'L9.attn', 'logits']")
    mask = position_mask(trace, positions)
    heads: dict = {}
    senders_of = [[_sender(trace, reference, n, mask, heads) for n in g] for g in send]
    receivers_of = [[_receiver(trace, n) for n in g] for g in receive]
    reads = _read_points(trace)
    rows = trace.tokens.shape[0]
    clean = metric_values(metric, trace.logits.float().clone(), rows)
    out = clean.expand(len(send), len(receive), len(clean)).clone()
    run = torch.zeros(len(send), len(receive), dtype=torch.bool)
    connected = torch.zeros_like(run)

    def measure(chunk: list) -> None:
        edits = [e for c, (_, _, deltas) in enumerate(chunk) for r, d in deltas
                 for e in _edits(trace, r, d, reads, copy_rows(trace, c) if len(chunk) > 1 else ALL)]
        logits = stacked_logits(trace, edits, len(chunk))
        for c, (i, j, _) in enumerate(chunk):
            mine = logits[c * rows:(c + 1) * rows].to(trace.tokens.device, torch.float32, copy=True)
            out[i, j] = metric_values(metric, mine, rows, len(clean))

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
    reference_values = metric_values(metric, reference.logits.float().clone(), rows, len(clean))
    per_text = len(clean) > 1
    return PathPatching(tuple("+".join(g) for g in send), tuple("+".join(g) for g in receive),
                        out.mean(-1), float(clean.mean()), float(reference_values.mean()), run, connected,
                        out if per_text else None, clean if per_text else None,
                        reference_values if per_text else None)
