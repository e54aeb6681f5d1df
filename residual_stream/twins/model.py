"""The twin transformer: one compact decoder whose only free choice is normalization.

Read it top to bottom like nanoGPT's ``model.py``. ``norm`` ∈ {layernorm, rmsnorm, none} ×
``placement`` ∈ {pre, post, sandwich, deepnorm, parallel}; everything else (attention,
MLP, embeddings, init) is shared, so twins that differ in these two settings differ in
nothing else, but for DeepNorm's own initialization (below: the same seed's projections
scaled by constant factors). Module names follow the norm roles of ``residual_stream.program`` and the
hook names follow TransformerLens (``blocks.{L}.hook_resid_pre`` ...), through its
``HookPoint`` and ``HookedRootModule``.

DeepNorm (Wang et al. 2022, decoder-only): ``x ← LN(α·x + F(x))`` with ``α = (2N)^¼`` and the
value, output and FFN weights initialised with gain ``β = (8N)^-¼``, N the number of layers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Literal, get_args, get_origin, get_type_hints

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import InputError, as_index, check_choice
from ..tl_compat import hook_classes

HookPoint, HookedRootModule = hook_classes()


@dataclass
class TwinConfig:
    """Hyper-parameters of a twin. The ``hidden_size``-style aliases let ``describe`` read it."""

    norm: Literal["layernorm", "rmsnorm", "none"] = "rmsnorm"
    placement: Literal["pre", "post", "sandwich", "deepnorm", "parallel"] = "pre"
    n_layers: int = 4
    d_model: int = 64
    n_heads: int = 4
    d_mlp: int = 0  # 0: 4 × d_model
    d_vocab: int = 257
    n_ctx: int = 256
    mlp: Literal["gelu", "relu", "swiglu"] = "gelu"
    positions: Literal["learned", "rotary"] = "learned"
    attn_only: bool = False
    bias: bool = False
    init: Literal["gpt2", "xavier"] = "gpt2"
    eps: float = 1e-5
    model_type: str = "rs-twin"

    def __post_init__(self) -> None:
        """Refuse choices and sizes no twin can have (``InputError``); ``d_mlp`` 0 is 4 × d_model.

        A choice must be one of its ``Literal`` values: ``norm="LayerNorm"`` built a twin with
        no norm at all, ``positions="rope"`` one without positions.
        """
        for name, hint in get_type_hints(TwinConfig).items():
            value = getattr(self, name)
            if get_origin(hint) is Literal:
                check_choice(f"a twin's {name}", value, get_args(hint))
            elif hint is int and as_index(value) is None:
                raise InputError(f"a twin's {name} is a whole number, not {value!r}")
            elif hint is bool and not isinstance(value, bool):  # "no" would count as True
                raise InputError(f"a twin's {name} is True or False, not {value!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float)) or not 0 < self.eps < 1:
            raise InputError(f"a twin's eps is a small positive number (1e-5), not {self.eps!r}")
        small = {k: getattr(self, k) for k in ("n_layers", "d_model", "n_heads", "n_ctx", "d_vocab")
                 if getattr(self, k) < 1}
        if small or self.d_mlp < 0:
            raise InputError(f"a twin needs at least 1 of each of n_layers, d_model, n_heads, "
                             f"n_ctx and d_vocab (d_mlp 0 or more), got {small or {'d_mlp': self.d_mlp}}")
        if self.d_model % self.n_heads:
            raise InputError(f"d_model {self.d_model} is not divisible by n_heads {self.n_heads}: "
                             "choose heads that divide it")
        if self.positions == "rotary" and (self.d_model // self.n_heads) % 2:
            raise InputError(f"rotary positions turn pairs of a head's {self.d_model // self.n_heads} "
                             "dimensions: choose d_model and n_heads with an even head size")
        self.d_mlp = self.d_mlp or 4 * self.d_model

    # aliases read by architectures.describe (Hugging Face names)
    hidden_size = property(lambda self: self.d_model)
    num_attention_heads = property(lambda self: self.n_heads)
    vocab_size = property(lambda self: self.d_vocab)
    architectures = property(lambda self: ["TwinTransformer"])

    @property
    def deepnorm_alpha(self) -> float:
        """α = (2N)^¼ for DeepNorm, 1 otherwise."""
        return (2 * self.n_layers) ** 0.25 if self.placement == "deepnorm" else 1.0

    @property
    def deepnorm_beta(self) -> float:
        """β = (8N)^-¼ for DeepNorm, 1 otherwise."""
        return (8 * self.n_layers) ** -0.25 if self.placement == "deepnorm" else 1.0

    def to_dict(self) -> dict:
        """Plain dict for saving."""
        return asdict(self)


# Which norm roles each placement has (see program.BLOCK_TEMPLATES); the rest are absent.
ROLES = {
    "pre": ("ln_attn_in", "ln_mlp_in"), "parallel": ("ln_attn_in", "ln_mlp_in"),
    "post": ("ln_resid_attn", "ln_resid_mlp"), "deepnorm": ("ln_resid_attn", "ln_resid_mlp"),
    "sandwich": ("ln_attn_in", "ln_attn_out", "ln_mlp_in", "ln_mlp_out"),
}
HAS_FINAL_NORM = {"pre": True, "parallel": True, "sandwich": True, "post": False, "deepnorm": False}


def make_norm(cfg: TwinConfig) -> nn.Module:
    """A LayerNorm, an RMSNorm, or nothing."""
    if cfg.norm == "layernorm":
        return nn.LayerNorm(cfg.d_model, eps=cfg.eps)
    if cfg.norm == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.eps)
    return nn.Identity()


def rotary(x: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding on ``(batch, head, pos, d_head)`` (half-split convention)."""
    d, pos = x.shape[-1], x.shape[-2]
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2, device=x.device, dtype=torch.float32) / d))
    ang = torch.arange(pos, device=x.device, dtype=torch.float32)[:, None] * inv[None]
    cos, sin = torch.cat([ang.cos()] * 2, -1).to(x.dtype), torch.cat([ang.sin()] * 2, -1).to(x.dtype)
    x1, x2 = x.chunk(2, -1)
    return x * cos + torch.cat([-x2, x1], -1) * sin


class Attention(nn.Module):
    """Causal multi-head attention; ``o_proj``'s input is the per-head ``z``."""

    def __init__(self, cfg: TwinConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.q_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.k_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.v_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.o_proj = nn.Linear(cfg.d_model, cfg.d_model, bias=cfg.bias)
        self.hook_pattern = HookPoint()
        self.keep_pattern = False  # set by TwinTransformer.forward(output_attentions=True)
        self.pattern: torch.Tensor | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, pos, d_model)`` → the attention's write, same shape."""
        B, P, _ = x.shape
        H = self.cfg.n_heads
        q, k, v = (p(x).view(B, P, H, -1).transpose(1, 2) for p in (self.q_proj, self.k_proj,
                                                                    self.v_proj))
        if self.cfg.positions == "rotary":
            q, k = rotary(q), rotary(k)
        if self.keep_pattern:  # explicit softmax, so the pattern can be returned
            scores = q @ k.transpose(-1, -2) / q.shape[-1] ** 0.5
            causal = torch.ones(P, P, dtype=torch.bool, device=x.device).triu(1)
            self.pattern = self.hook_pattern(scores.masked_fill(causal, float("-inf")).softmax(-1))
            z = self.pattern @ v
        else:
            z = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # (B, H, P, d_head)
        return self.o_proj(z.transpose(1, 2).reshape(B, P, -1))


class MLP(nn.Module):
    """GELU or ReLU MLP (``fc_in → act → fc_out``), or SwiGLU (``silu(gate) * fc_in → fc_out``)."""

    def __init__(self, cfg: TwinConfig) -> None:
        super().__init__()
        self.swiglu = cfg.mlp == "swiglu"
        self.act = F.relu if cfg.mlp == "relu" else F.gelu
        self.fc_in = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.bias)
        self.gate = nn.Linear(cfg.d_model, cfg.d_mlp, bias=cfg.bias) if self.swiglu else None
        self.fc_out = nn.Linear(cfg.d_mlp, cfg.d_model, bias=cfg.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(batch, pos, d_model)`` → the MLP's write, same shape."""
        h = F.silu(self.gate(x)) * self.fc_in(x) if self.swiglu else self.act(self.fc_in(x))
        return self.fc_out(h)


def _projections(module: nn.Module) -> tuple[list[nn.Linear], list[nn.Linear]]:
    """(reads, writes) of an attention or MLP module: writes are the ones adding to the stream."""
    if isinstance(module, Attention):
        return [module.q_proj, module.k_proj, module.v_proj], [module.o_proj]
    return [p for p in (module.fc_in, module.gate) if p is not None], [module.fc_out]


def _gpt2_init(module: nn.Module, cfg: TwinConfig) -> None:
    reads, writes = _projections(module)
    for p in reads:
        nn.init.normal_(p.weight, std=0.02)
    for p in writes:
        nn.init.normal_(p.weight, std=0.02 / (2 * cfg.n_layers) ** 0.5)
    for p in reads + writes:
        if p.bias is not None:
            nn.init.zeros_(p.bias)


def _xavier_init(module: nn.Module, cfg: TwinConfig) -> None:
    """Xavier normal; gain β (DeepNorm, 1 otherwise) on every map except queries and keys."""
    reads, writes = _projections(module)
    for p in reads + writes:
        qk = isinstance(module, Attention) and p in (module.q_proj, module.k_proj)
        nn.init.xavier_normal_(p.weight, gain=1.0 if qk else cfg.deepnorm_beta)
        if p.bias is not None:
            nn.init.zeros_(p.bias)


class Block(nn.Module):
    """One transformer block; ``placement`` decides where its norms stand."""

    def __init__(self, cfg: TwinConfig) -> None:
        super().__init__()
        self.placement, self.alpha = cfg.placement, cfg.deepnorm_alpha
        for role in ROLES[cfg.placement]:
            if not (cfg.attn_only and "mlp" in role):
                setattr(self, role, make_norm(cfg))
        self.attn = Attention(cfg)
        self.mlp = None if cfg.attn_only else MLP(cfg)
        self.hook_resid_pre, self.hook_attn_out, self.hook_mlp_out = HookPoint(), HookPoint(), HookPoint()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The stream entering the block → the stream leaving it."""
        x = self.hook_resid_pre(x)
        attn = lambda h: self.hook_attn_out(self.attn(h))  # noqa: E731
        if self.mlp is None:  # attention-only: the placements without their MLP half
            return self._attn_only(x, attn)
        mlp = lambda h: self.hook_mlp_out(self.mlp(h))  # noqa: E731
        if self.placement == "pre":
            x = x + attn(self.ln_attn_in(x))
            return x + mlp(self.ln_mlp_in(x))
        if self.placement == "parallel":
            return x + attn(self.ln_attn_in(x)) + mlp(self.ln_mlp_in(x))
        if self.placement == "sandwich":
            x = x + self.ln_attn_out(attn(self.ln_attn_in(x)))
            return x + self.ln_mlp_out(mlp(self.ln_mlp_in(x)))
        # post (alpha = 1) and deepnorm
        x = self.ln_resid_attn(self.alpha * x + attn(x))
        return self.ln_resid_mlp(self.alpha * x + mlp(x))

    def _attn_only(self, x: torch.Tensor, attn) -> torch.Tensor:
        if self.placement in ("pre", "parallel"):
            return x + attn(self.ln_attn_in(x))
        if self.placement == "sandwich":
            return x + self.ln_attn_out(attn(self.ln_attn_in(x)))
        return self.ln_resid_attn(self.alpha * x + attn(x))


@dataclass
class TwinOutput:
    """Logits ``[batch, pos, d_vocab]`` and, when asked, hidden states (Hugging Face convention)."""

    logits: torch.Tensor
    hidden_states: tuple[torch.Tensor, ...] | None = None
    attentions: tuple[torch.Tensor, ...] | None = None


class TwinTransformer(HookedRootModule):
    """Tokens ``[batch, pos]`` → logits ``[batch, pos, d_vocab]``.

    ``probe_ids``: the ids a trained twin saw in every context, the bytes of its recipe's
    repeated random segments (``Mix.alphabet``), which ``rs.head_scores`` draws from; None
    (any id) for a twin not trained by ``twins.train``.
    """

    probe_ids: range | None = None

    def __init__(self, cfg: TwinConfig) -> None:
        super().__init__()
        self.config = cfg
        self.embed = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.pos_embed = nn.Embedding(cfg.n_ctx, cfg.d_model) if cfg.positions == "learned" else None
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_final = make_norm(cfg) if HAS_FINAL_NORM[cfg.placement] else nn.Identity()
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab, bias=False)
        self.apply(self._init_weights)
        self.setup()

    @property
    def base_model(self) -> nn.Module:
        """The module that holds embeddings, blocks and final norm (itself)."""
        return self

    def get_output_embeddings(self) -> nn.Module:
        """The unembedding (Hugging Face protocol)."""
        return self.unembed

    def _init_weights(self, module: nn.Module) -> None:
        """GPT-2's init (N(0, 0.02), stream writes scaled by 1/√(2N)) or Xavier.

        DeepNorm is always Xavier with gain β on the value, output and FFN weights (Wang et
        al. 2022). Under Xavier the writes start ~50× larger than the N(0, 0.02) embeddings,
        which drowns token identity; with it, induction heads did not form in our twins.
        """
        if isinstance(module, nn.Embedding):
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, (Attention, MLP)):
            xavier = self.config.init == "xavier" or self.config.placement == "deepnorm"
            (_xavier_init if xavier else _gpt2_init)(module, self.config)
        elif isinstance(module, nn.Linear) and module is self.unembed:
            nn.init.normal_(module.weight, std=0.02)
        elif isinstance(module, Block) and self.config.init == "gpt2":
            # Sandwich norms on the writes: their gain starts at GPT-2's write scale 0.02/√(2N),
            # not 1. With gain 1 every write starts at unit RMS against N(0, 0.02) embeddings
            # (block 0's attention write ~10× its input) and no induction head formed.
            for role in ("ln_attn_out", "ln_mlp_out"):
                norm = getattr(module, role, None)
                if norm is not None and getattr(norm, "weight", None) is not None:
                    nn.init.constant_(norm.weight, 0.02 / (2 * self.config.n_layers) ** 0.5)

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
        output_hidden_states: bool = False, output_attentions: bool = False,
        logits_to_keep: int = 0,
    ) -> TwinOutput:
        """Run the model. Padding must be on the right (causal attention ignores it).

        ``logits_to_keep=k > 0`` unembeds only the last ``k`` positions (as in Hugging Face).
        """
        for block in self.blocks:
            block.attn.keep_pattern = output_attentions
        P = input_ids.shape[1]
        if P > self.config.n_ctx:
            raise ValueError(f"sequence of {P} tokens exceeds n_ctx={self.config.n_ctx}")
        x = self.embed(input_ids)
        if self.pos_embed is not None:
            x = x + self.pos_embed(torch.arange(P, device=input_ids.device))[None]
        states = []
        for block in self.blocks:
            states.append(x)
            x = block(x)
        x = self.ln_final(x)
        states.append(x)
        patterns = tuple(b.attn.pattern for b in self.blocks) if output_attentions else None
        for block in self.blocks:
            block.attn.keep_pattern, block.attn.pattern = False, None
        head_in = x[:, -logits_to_keep:] if logits_to_keep else x
        return TwinOutput(self.unembed(head_in), tuple(states) if output_hidden_states else None,
                          patterns)

