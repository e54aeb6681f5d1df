"""Anatomy: what a model is, as data: sizes, norms, components and its stream program.

Vocabulary (TransformerLens's, used across the package)::

    batch pos d_model layer head d_head d_mlp d_vocab component
    W_Q W_K W_V   [head, d_model, d_head]   read maps of attention
    W_O           [head, d_head, d_model]   write map of attention (b_O: [d_model])
    W_in W_gate   [d_model, d_mlp]          read maps of the MLP (W_gate: gated MLPs only)
    W_out         [d_mlp, d_model]          write map of the MLP

An ``Anatomy`` is derived from a model's config and modules (``architectures.describe``),
never hard-coded per checkpoint. Everything that differs between architectures lives here,
so shared code (capture, replay, checks) has no ``if arch == ...`` branches.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

import pandas as pd
import torch
from torch import Tensor

from .norms import NormSpec
from .program import PLACEMENTS, Add, Op, Read
from .program import describe as describe_program


@dataclass(frozen=True)
class Component:
    """One reader-writer of the stream: the attention or the MLP of a block.

    Attributes:
        name: ``"L{layer}.attn"`` or ``"L{layer}.mlp"``.
        layer: Block index.
        kind: ``"attn"`` or ``"mlp"``.
        reads_through: Name of the norm between the stream and the component's input, or None.
        writes_through: Name of the norm applied to the write before it is added, or None.
    """

    name: str
    layer: int
    kind: Literal["attn", "mlp"]
    reads_through: str | None
    writes_through: str | None


@dataclass(frozen=True)
class ModulePaths:
    """Where each hooked module sits in the framework model (dotted paths from its root).

    ``qkv``, ``mlp_in``, ``mlp_gate``, ``mlp_down`` and ``qk_norms`` are relative to a block
    (``layers[L]``); ``qkv_layout`` says how to split them (see ``weights.layer_weights``).
    ``qk_norms`` are the RMSNorms on queries and keys (Qwen3, OLMo 2, Gemma 3), whose gain is
    ``weight + qk_norm_offset``. ``mlp_layout`` is ``"gate_up"`` where ``mlp_in`` is one
    projection to ``[gate | up]`` (Phi-3). ``mlp_out_in_place``: the block adds to the MLP's
    output tensor in place after the module returns (Falcon), so a hook keeps a copy of it.
    ``unembed_in``: a linear map without a bias between the final stream and the unembedding
    (OPT-350m's ``project_out``), folded into ``W_U``. ``unembed_bias``: the unembedding's bias, a
    parameter beside its Linear (ESM's ``lm_head.bias``), from the root. ``lm_head`` is the
    nonlinear transform applied before the unembedding, if the model has one (an MLM head):
    module paths from the root, applied in turn, ``"act:NAME"`` an activation of transformers'
    ``ACT2FN``. ``values_from`` and ``v_norm`` (relative to a block): the projection whose output
    are the values where a block has no value projection, and a parameterless RMSNorm on each
    head's values (Gemma 4's; ``ArchSpec``). ``mlp_out_input``: each MLP's write is the input of
    its ``mlp_out`` module, not its output (Gemma 4's blocks of experts).
    """

    layers: tuple[str, ...]
    embeds: Mapping[str, str]
    attn_out: tuple[str, ...]
    mlp_out: tuple[str, ...]
    norms: Mapping[str, str]
    lm_head: tuple[str, ...] | None
    qkv: tuple[str, ...] = ()
    qkv_layout: str = "separate"
    mlp_in: str = ""
    mlp_gate: str | None = None
    mlp_down: str = ""
    mlp_layout: str = "separate"
    qk_norms: tuple[str, str] | None = None
    qk_norm_offset: float = 0.0
    mlp_out_in_place: bool = False
    values_from: str | None = None
    v_norm: str | None = None
    mlp_out_input: bool = False
    unembed_in: str | None = None
    unembed_bias: str | None = None


@dataclass(frozen=True, eq=False, repr=False)
class Anatomy:
    """Sizes, norms, components and stream program of one model.

    ``norm_kind`` is ``"none"`` for a model without norms. ``n_ctx`` is the longest
    sequence the model accepts. ``lm_head_note`` says why logits are unavailable when
    ``has_lm_head`` is False. ``causal``: each position attends only to earlier ones, and an
    LM head predicts the next token (False for BERT: bidirectional, a masked-LM head).
    ``logit_scale``: what the model multiplies its logits by (None: nothing). ``routing``:
    ``(experts a token uses, experts)`` of a mixture-of-experts MLP (None for a dense one).
    ``patterns_note``: why the framework cannot give this model's attention patterns (None: it can).
    ``sinks_after_softmax``: its attention sinks scale each head's output after the softmax
    (Granite SWA), a scale the framework's patterns leave out and ``rs.trace`` puts in.
    ``states_before_final_norm``: the framework's ``hidden_states`` end with the stream before the
    final norm, and its ``last_hidden_state`` is after it (CLIP's text model).
    ``family``: the family's description in the table of architectures. ``d_head`` and
    ``n_kv_heads`` are the widest block's head width and block 0's key/value heads where blocks
    differ (Gemma 4's full attentions: wider heads, fewer key/value heads; ``model.weights(L)``
    gives each block's own; ``heads_at``, from ``layer_heads``).
    """

    architecture: str
    placement: str
    norm_kind: str
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    d_head: int
    d_mlp: int
    d_vocab: int
    n_ctx: int
    embeds: tuple[str, ...]
    norms: Mapping[str, NormSpec]
    program: tuple[Op, ...]
    modules: ModulePaths
    has_lm_head: bool
    lm_head_note: str = ""
    alpha: float = 1.0
    has_attn_bias: bool = False
    causal: bool = True
    logit_scale: float | None = None
    routing: tuple[int, int] | None = None
    patterns_note: str | None = None
    sinks_after_softmax: bool = False
    family: str = ""
    states_before_final_norm: bool = False
    layer_heads: tuple[tuple[int, int], ...] = ()
    components: tuple[Component, ...] = field(init=False)

    def __post_init__(self) -> None:
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement {self.placement!r} not in {PLACEMENTS}")
        if self.n_heads * self.d_head <= 0 or self.n_layers <= 0:
            raise ValueError(f"bad sizes: n_layers={self.n_layers}, n_heads={self.n_heads}")
        missing = [
            n for op in self.program for n in (getattr(op, "norm", None), getattr(op, "via", None))
            if n is not None and n not in self.norms
        ]
        if missing:
            raise ValueError(f"program refers to norms {missing} that the anatomy lacks")
        reads = {op.component: op.norm for op in self.program if isinstance(op, Read)}
        vias = {op.component: op.via for op in self.program if isinstance(op, Add)}
        comps = tuple(
            Component(name, int(name[1:].split(".")[0]), name.split(".")[1], reads.get(name),
                      via)
            for name, via in vias.items()
        )
        object.__setattr__(self, "components", comps)

    def __repr__(self) -> str:
        """The sizes and the norm placement on one line (``program``, ``norms``: the fields)."""
        shapes = self.layer_heads or ((self.d_head, self.n_kv_heads),)  # blocks may differ (Gemma 4)
        widths, kv = ("/".join(map(str, sorted({s[i] for s in shapes}))) for i in (0, 1))
        heads = f"{self.n_heads} heads" + (f" ({kv} kv)" if kv != str(self.n_heads) else "")
        return (f"Anatomy({self.architecture}, {self.placement}-{self.norm_kind}, {self.n_layers} "
                f"layers, d_model {self.d_model}, {heads} of {widths}, d_mlp {self.d_mlp}, "
                f"d_vocab {self.d_vocab}, n_ctx {self.n_ctx}, {len(self.norms)} norms, "
                f"{len(self.program)} ops, {'an' if self.has_lm_head else 'no'} LM head)")

    def heads_at(self, layer: int) -> tuple[int, int]:
        """``(d_head, n_kv_heads)`` of block ``layer``'s attention (the model's where blocks agree)."""
        return self.layer_heads[layer] if self.layer_heads else (self.d_head, self.n_kv_heads)

    @property
    def heads(self) -> tuple[str, ...]:
        """Every head's label, ``L0H0`` … in layer order (as results, ablation and patching name them)."""
        return tuple(f"L{L}H{h}" for L in range(self.n_layers) for h in range(self.n_heads))

    def head(self, name: object, channel: bool = False) -> tuple[int, int, str | None] | None:
        """``(layer, head, None)`` for a head of this model labelled as results label it (``"L3H5"``).

        With ``channel``, also ``"L3H5.k"`` → ``(3, 5, "k")``. None for anything else (a head
        past the last layer or head, ``"L3H05"``, a component).
        """
        from .walk import head_of

        found = head_of(name, channel)
        return found if found and found[0] < self.n_layers and found[1] < self.n_heads else None

    def as_added(self, component: str, W: Tensor) -> Tensor:
        """A write map ``W [..., k, d_model]`` of ``component`` (rows are writes) as they are added.

        Through the write norm's frozen linear part, ``W C diag(γ)``, where the component has
        one (sandwich); its per-token ``1/s`` scales a write without turning it.
        """
        norm = next(c.writes_through for c in self.components if c.name == component)
        return W if norm is None else self.norms[norm].apply_linear(W, torch.ones((), dtype=W.dtype))

    def sees(self, writers: Sequence[str], readers: Sequence[str]) -> Tensor:
        """``[writer, reader]``: whether each reader reads the stream after each writer's add.

        Program order: a block sees every write of the blocks before it. Within a block the
        MLP sees its own attention's write in sequential blocks (pre, post, sandwich,
        DeepNorm) and not in parallel ones, where both read the block's input; no component
        sees its own write.
        """
        read = {op.component: i for i, op in enumerate(self.program) if isinstance(op, Read)}
        add = {op.component: i for i, op in enumerate(self.program) if isinstance(op, Add)}
        return torch.tensor([[read.get(r, -1) > add[w] for r in readers] for w in writers],
                            dtype=torch.bool).reshape(len(writers), len(readers))

    def describe_program(self) -> str:
        """The stream program as text, one operation per line."""
        return describe_program(self.program, {n: float(s.weight[0]) for n, s in self.norms.items()
                                                if s.constant})

    def summary(self) -> dict[str, object]:
        """The headline facts as a flat dict (one row of ``list_models`` / the app's table)."""
        return {
            "architecture": self.architecture,
            "family": self.family,
            "placement": self.placement,
            "norm": self.norm_kind,
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "n_kv_heads": self.n_kv_heads,
            "d_head": self.d_head,
            "d_mlp": self.d_mlp,
            "d_vocab": self.d_vocab,
            "n_ctx": self.n_ctx,
            "lm_head": self.has_lm_head,
            "causal": self.causal,
        }

    def norms_frame(self) -> pd.DataFrame:
        """One row per norm, in the order the stream program meets them: kind, ε, gain and bias.

        ``gain_*``: of the effective gain γ + ``offset`` (Gemma's ``1 + γ``; 1 where the norm has
        no γ; a multiplier's constant); ``bias_norm``: ‖β‖, 0 where there is none. NaN for
        weights not in memory (offloaded to disk, on ``meta``). ``module``: where it lives. In float64.
        """
        used = [getattr(op, "norm", None) or getattr(op, "via", None) for op in self.program]
        order = dict.fromkeys([n for n in used if n is not None] + list(self.norms))  # as met
        rows = []
        for name in order:
            spec = self.norms[name]
            gain = _values(spec.weight, 1.0) + spec.weight_offset
            bias = _values(spec.bias, 0.0)
            rows.append({"norm": name, "kind": spec.kind, "eps": spec.eps, "offset": spec.weight_offset,
                         "gain_mean": float(gain.mean()), "gain_min": float(gain.min()),
                         "gain_max": float(gain.max()), "bias_norm": float(bias.norm()),
                         "module": spec.module_path or "(a constant)"})
        return pd.DataFrame(rows)

    def to_frame(self) -> pd.DataFrame:
        """One row per component: what it reads through and what its write passes through."""
        return pd.DataFrame(
            [
                {"component": c.name, "layer": c.layer, "kind": c.kind,
                 "reads_through": c.reads_through or "(raw stream)",
                 "writes_through": c.writes_through or "(added directly)"}
                for c in self.components
            ]
        )


def _values(t: Tensor | None, absent: float) -> Tensor:
    """``t`` as float64 on the CPU; ``[absent]`` for None, NaN for a tensor not in memory (``meta``)."""
    if t is None:
        return torch.tensor([absent], dtype=torch.float64)
    if t.device.type == "meta":
        return torch.tensor([float("nan")], dtype=torch.float64)
    return t.detach().to("cpu", torch.float64)
