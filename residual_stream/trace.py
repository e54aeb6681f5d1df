"""Trace: one captured forward pass over a batch of texts, and the views analyses need.

``rs.trace(model, texts)`` tokenizes (right-padded, with an attention mask), captures the
stream with hooks (see ``capture``), refuses non-finite streams, and returns a ``Trace``:

* ``trace.stream(L)``: ``[batch, pos, d_model]`` entering block ``L``; ``stream(0)`` is the
  embedding output, ``stream(n_layers)`` the last block's output (before any final norm),
  ``stream("final")`` after it;
* ``trace.head_writes(L)``, ``attn_write(L)``, ``mlp_write(L)``: what each component adds;
* ``trace.decompose(L)``: the stream as a labelled, exact sum of contributions;
* ``trace.check()``: the conservation report against the framework's own hidden states.

All tensors are float32 whatever the model's dtype. Padding positions are present in the
tensors (so shapes stay rectangular) and marked by ``attention_mask == 0``; every
statistic in this package excludes them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from jaxtyping import Float, Int
from torch import Tensor

from .capture import Captured, capture
from .decomposition import Contributions, Sources, Write, replay, replay_to_read
from .errors import NonFiniteError, NotAvailableError, UnknownNameError, check_flag, layer_index, need_model
from .inputs import Batch, Overflow, encode
from .memory import check_trace_fits
from .program import Point, Read
from .walk import component_of, final_stream, read_inputs, walk_stream
from .weights import attn_W_O, bias_of, head_writes

if TYPE_CHECKING:
    from .conservation import ConservationReport
    from .loading import Model


@dataclass(frozen=True, eq=False, repr=False)
class Trace:
    """A captured forward pass. Build with ``rs.trace(model, texts)``."""

    model: Model
    batch: Batch
    captured: Captured

    @property
    def anatomy(self):
        """The traced model's ``Anatomy``."""
        return self.model.anatomy

    @property
    def tokens(self) -> Int[Tensor, "batch pos"]:
        """Token ids, right-padded."""
        return self.batch.tokens

    @property
    def attention_mask(self) -> Int[Tensor, "batch pos"]:
        """1 for real tokens, 0 for padding."""
        return self.batch.attention_mask

    @property
    def str_tokens(self) -> Sequence[list[str]]:
        """Token strings per text (without padding)."""
        return self.batch.str_tokens

    def __repr__(self) -> str:
        """The model, the batch's shape and its real tokens on one line."""
        b, p = self.tokens.shape
        texts = len(set(self.batch.text_index))  # rows of texts cut by overflow="chunk" are fewer texts
        shape = (f"{b} text{'s' if b != 1 else ''}" if texts == b else
                 f"{texts} text{'s' if texts != 1 else ''} in {b} rows")
        return f"Trace({self.model!r}, {shape} × {p} positions, {int(self.attention_mask.sum())} real tokens)"

    def stream(self, layer: Point) -> Float[Tensor, "batch pos d_model"]:
        """The stream entering block ``layer`` (``n_layers``: the last block's output).

        ``"final"``: after the final norm, what the unembedding reads (the last block's
        output itself in a post-norm model, which has no final norm); computed from the
        captured stream with the norm's scale frozen, so it equals ``decompose("final").total()``.
        """
        if isinstance(layer, str) and layer == "final":
            return final_stream(walk_stream(self))
        return self.captured.resid[self._layer(layer, self.anatomy.n_layers + 1, "a stream point",
                                               ' or "final"')]

    def _layer(self, layer: object, count: int, what: str = "a block", alternative: str = "") -> int:
        """``layer`` if it is an int in ``0..count-1``, else ``OutOfRangeError`` saying so."""
        return layer_index(layer, count, what, self.anatomy.n_layers, alternative)

    def head_writes(self, layer: int, out: Tensor | None = None) -> Float[Tensor, "head batch pos d_model"]:
        """Each head's write ``z_h @ W_O[h]`` at block ``layer`` (output bias excluded).

        ``out``: a contiguous ``[head, batch, pos, d_model]`` tensor to write them into.
        """
        layer = self._layer(layer, self.anatomy.n_layers)
        module = self.model.module.get_submodule(self.anatomy.modules.attn_out[layer])
        return head_writes(self.captured.z[layer], attn_W_O(module, self.anatomy.n_heads), out)

    def attn_bias(self, layer: int) -> Float[Tensor, " d_model"] | None:
        """The attention output bias ``b_O`` of block ``layer``, or None."""
        layer = self._layer(layer, self.anatomy.n_layers)
        b = bias_of(self.model.module.get_submodule(self.anatomy.modules.attn_out[layer]))
        return None if b is None else b.to(self.captured.z[layer].device)

    def attn_write(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The attention's output (all heads plus ``b_O``), before any sandwich norm."""
        out = self.head_writes(layer).sum(0)
        b = self.attn_bias(layer)
        return out if b is None else out + b

    def mlp_write(self, layer: int) -> Float[Tensor, "batch pos d_model"]:
        """The MLP's output, before any sandwich norm."""
        return self.captured.mlp_out[self._layer(layer, self.anatomy.n_layers)]

    def norm_scale(self, name: str) -> Float[Tensor, "batch pos"]:
        """The per-token scale norm ``name`` divided by (see ``Anatomy.norms``)."""
        try:
            return self.captured.norm_scale[name]
        except (KeyError, TypeError):  # TypeError: an unhashable name
            raise UnknownNameError(f"no norm {name!r}; norms are {list(self.anatomy.norms)[:6]}...") from None

    @property
    def patterns(self) -> tuple[Float[Tensor, "batch head query key"], ...]:
        """Attention patterns per layer; trace with ``patterns=True`` to record them."""
        if self.captured.patterns is None:
            raise NotAvailableError("attention patterns were not recorded: trace again with "
                                    "rs.trace(model, texts, patterns=True)")
        return self.captured.patterns

    @property
    def logits(self) -> Float[Tensor, "batch pos d_vocab"]:
        """Final logits; raises ``NotAvailableError`` for models without a trained LM head."""
        if self.captured.logits is None:
            raise NotAvailableError(self.anatomy.lm_head_note or "this model has no LM head")
        return self.captured.logits

    def _n_pieces(self, component: str, heads: bool) -> int:
        """How many contributions ``_writes(component, heads)`` makes."""
        layer, kind = component_of(component)
        if kind == "mlp" or not heads:
            return 1
        return self.anatomy.n_heads + (self.attn_bias(layer) is not None)

    def _writes(self, component: str, heads: bool = True, out: Tensor | None = None) -> list[Write]:
        """``component``'s labelled writes; into ``out [_n_pieces, batch, pos, d_model]`` if given."""
        layer, kind = component_of(component)

        def put(i: int, value: Tensor) -> Tensor:  # value [1, batch, pos, d], or out's row i
            return value if out is None else out[i: i + 1].copy_(value)

        if kind == "mlp":
            return [Write((component,), "mlp", layer, put(0, self.mlp_write(layer).unsqueeze(0)))]
        if not heads:  # the whole attention, b_O included: one piece instead of n_heads + 1
            return [Write((component,), "attn", layer, put(0, self.attn_write(layer).unsqueeze(0)))]
        H = self.anatomy.n_heads
        heads = self.head_writes(layer, None if out is None else out[:H])
        pieces = [Write(tuple(f"L{layer}H{h}" for h in range(H)), "head", layer, heads)]
        b = self.attn_bias(layer)
        if b is not None:
            pieces.append(Write((f"L{layer}.b_O",), "attn_bias", layer,
                                put(H, b.expand_as(heads[0]).unsqueeze(0))))
        return pieces

    def sources(self, *, heads: bool = True) -> Sources:
        """What the replay engine needs from this trace.

        ``heads=False`` gives each attention's write as one piece labelled ``L3.attn`` (for
        analyses at component granularity: n_heads times fewer pieces to carry).
        """
        return Sources(
            norms=dict(self.anatomy.norms), scales=self.norm_scale,
            embed=lambda lab: Write((lab,), "embed", -1, self.captured.embeds[lab].unsqueeze(0)),
            writes=lambda component, out=None: self._writes(component, heads, out),
            n_pieces=lambda component: self._n_pieces(component, heads),
            attention_mask=self.attention_mask,
        )

    def decompose(self, point: Point) -> Contributions:
        """The stream at ``point`` (block index or ``"final"``) as an exact labelled sum."""
        if not (isinstance(point, str) and point == "final"):
            point = self._layer(point, self.anatomy.n_layers + 1, "a point to decompose", ' or "final"')
        return replay(self.anatomy.program, self.sources(), upto=point)

    def decompose_read(self, component: str) -> Contributions:
        """The stream where ``component`` (``"L3.attn"``, ``"L3.mlp"``) reads it, before its norm."""
        self._reader(component)
        return replay_to_read(self.anatomy.program, self.sources(), component)

    def _reader(self, component: object) -> None:
        """``UnknownNameError`` unless ``component`` reads the stream; for a head, saying how it reads."""
        names = [c.name for c in self.anatomy.components]
        if component in names:
            return
        head = self.anatomy.head(component, channel=True)
        if head is not None:
            L, h, ch = head  # a head reads what its attention reads; its q/k/v maps that
            raise UnknownNameError(
                f"no component {component!r}: a head reads what its attention reads, "
                f"read_input('L{L}.attn'); read_attribution's reader L{L}H{h}.{ch or 'q'} is that "
                f"through head {h}'s map (model.weights({L}).attention_reads(): q, k, v)")
        raise UnknownNameError(f"no component {component!r}; components are {names[:4]}...")

    def read_input(self, component: str) -> Float[Tensor, "batch pos d_model"]:
        """What ``component`` actually reads: the stream at its read point, through its norm.

        Walks the program over the captured stream (one running tensor, reset at every block),
        not over contributions: ``decompose_read(component).total()`` is the same stream, summed.
        """
        self._reader(component)
        for step in walk_stream(self):
            if isinstance(step.op, Read) and step.op.component == component:
                norm = step.op.norm
                return step.x if norm is None else \
                    self.anatomy.norms[norm].apply_frozen(step.x, self.norm_scale(norm))
        raise AssertionError(f"{component} is a component but reads nowhere in the program")

    def check(self, *, tolerance: float | None = None) -> ConservationReport:
        """Conservation report: hooks, norms and decompositions against the model's own outputs."""
        from .conservation import check_conservation

        return check_conservation(self, tolerance=tolerance)


def trace(
    model: Model,
    texts: str | list[str] | Int[Tensor, "batch pos"],
    *,
    max_length: int | None = None,
    overflow: Overflow = "error",
    verify: bool = False,
    patterns: bool = False,
) -> Trace:
    """Tokenize ``texts`` and capture one forward pass of ``model`` over them.

    Args:
        model: A loaded model (``rs.load``).
        texts: One text or a list of texts; each becomes one row of the batch. A tensor of
            token ids ``[batch, pos]`` is used as it is (no padding).
        max_length: Longest sequence accepted; defaults to the model's context ``n_ctx``.
        overflow: What to do with a text longer than that: ``"error"`` (default) raises
            ``ContextLengthError`` naming the limit; ``"chunk"`` splits it into several rows.
        verify: Also keep full norm inputs and projection outputs (used by ``check``).
        patterns: Also record attention patterns (``trace.patterns``; needed by
            ``mixing_ratio``). Hugging Face models run with eager attention for this call.

    Raises:
        EmptyTextError: A text is empty.
        ContextLengthError: A text is too long and ``overflow="error"``.
        NonFiniteError: NaN or inf appears in the stream (names the first layer and component).
        TraceTooLargeError: What the trace keeps (``memory.trace_bytes``) exceeds the memory
            available where the model runs; nothing is run.
    """
    need_model(model, "trace")
    check_flag("verify", verify)
    check_flag("patterns", patterns)
    batch = encode(model, texts, max_length=max_length, overflow=overflow)
    return trace_batch(model, batch, verify=verify, patterns=patterns)


def trace_batch(model: Model, batch: Batch, *, verify: bool = False, patterns: bool = False) -> Trace:
    """Capture one forward pass over an already tokenized ``Batch`` (see ``trace``).

    Refused first (``TraceTooLargeError``) when what it keeps would not fit in memory.
    """
    check_trace_fits(model, tuple(batch.tokens.shape), verify=verify, patterns=patterns)
    captured = capture(model.module, model.anatomy, batch.tokens.to(model.device),
                       batch.attention_mask.to(model.device), verify=verify, patterns=patterns)
    result = Trace(model, batch, captured)
    _raise_if_non_finite(result)
    if patterns and model.anatomy.sinks_after_softmax:
        captured.patterns = _sink_scaled(result)
    return result


def _sink_scaled(t: Trace) -> tuple[Tensor, ...]:
    """The patterns of a model whose sinks scale each head's output after the softmax.

    Granite SWA computes ``z = s · A v`` with ``s = sigmoid(logsumexp(scores) − sink)`` per
    token and head (an extra logit in the softmax's denominator, in another form); the
    framework returns ``A``. ``s`` follows from the captured ``z`` and ``A v`` (``v`` from the
    weights and what the attention reads), and the patterns returned are ``s · A``: rows
    summing to ``s`` < 1, as gpt-oss's (whose sink is a logit of the softmax) do, and ``z``
    their product with ``v``.
    """
    out, reads = [], read_inputs(t)  # (one walk for every layer)
    for L, A in enumerate(t.captured.patterns):
        w, x = t.model.weights(L), reads[f"L{L}.attn"]
        v = torch.einsum("bpd,hdk->bhpk", x, w.W_V.to(x.device))
        v = v if w.b_V is None else v + w.b_V.to(x.device)[None, :, None]
        av = A @ v                                                      # (batch, head, query, d_head)
        z = t.captured.z[L].unflatten(-1, (av.shape[1], -1)).transpose(1, 2)
        s = (z * av).sum(-1) / av.pow(2).sum(-1).clamp_min(torch.finfo(av.dtype).tiny)
        out.append(A * s.clamp(0.0, 1.0)[..., None])
    return tuple(out)


def _raise_if_non_finite(t: Trace) -> None:
    """Find the first place NaN/inf appears, in program order, over real tokens only."""
    cap = t.captured
    everything = [*cap.embeds.values(), *cap.resid.values(), *cap.z.values(), *cap.mlp_out.values(),
                  *([] if cap.logits is None else [cap.logits])]
    # NaN/inf propagate into a norm: one fused norm of every tensor (foreach: a few launches,
    # not one per tensor), one sync, no masks; the masked search below only when needed
    if bool(torch.nn.utils.get_total_norm(everything).isfinite()):
        return
    mask = t.attention_mask.bool().to(t.captured.resid[0].device)

    def bad(x: Tensor) -> bool:
        return not bool(x[mask].isfinite().all())

    for label, e in t.captured.embeds.items():
        if bad(e):
            raise NonFiniteError(f"NaN/inf in the embedding {label!r}: the model's weights are "
                                 "corrupt; reload them from a good file")
    for L in range(t.anatomy.n_layers):
        mlp = t.captured.mlp_out.get(L, t.captured.z[L][..., :0])
        if bad(t.captured.resid[L + 1]) or bad(t.captured.z[L]) or bad(mlp):
            where = ("attention" if bad(t.captured.z[L]) else
                     "MLP" if bad(mlp) else "a norm or the residual add")
            raise NonFiniteError(
                f"NaN/inf first appears in layer {L}, in {where}. Check that layer's weights "
                "(rs.load refuses non-finite weights from files) or run in float32."
            )
    if cap.logits is not None and bad(cap.logits):
        raise NonFiniteError("NaN/inf first appears in the logits (the stream is finite): check the "
                             "final norm's and the LM head's weights, or run in float32")
