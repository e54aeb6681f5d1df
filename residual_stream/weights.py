"""Read and write weights of attention and MLP components, in TransformerLens's shapes.

Frameworks store projections differently (``nn.Linear`` keeps ``[out, in]``, GPT-2's
``Conv1D`` keeps ``[in, out]``); this module hides that so analyses see one layout:
``W_O [head, d_head, d_model]`` with ``write_h = z_h @ W_O[h]``. Views are returned where
the model is float32 (no copy); other dtypes are upcast to float32 for analysis.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import einops
import torch
from jaxtyping import Float
from torch import Tensor, nn

from .anatomy import ModulePaths
from .devices import parameter
from .errors import NotAvailableError

LATENT = ("this model's attention is multi-head latent attention (DeepSeek's MLA): its queries, keys and "
          "values come through low-rank maps with an RMSNorm between them, so no linear W_Q, W_K, W_V read "
          "the stream and analyses of what heads read (composition, read attribution, the readers' spaces, "
          "patching one head's q, k or v) are not available; each head's write (W_O), the stream's "
          "decomposition, growth, the lens, and patching whole components stay exact")

VOCAB_SLICE = 8192  # columns of a lower-precision W_U cast to float32 at a time


def vocab_slices(n: int) -> list[slice]:
    """``n`` vocabulary columns as slices of ``VOCAB_SLICE`` (the last may be shorter)."""
    return [slice(s, s + VOCAB_SLICE) for s in range(0, n, VOCAB_SLICE)]


def as_in_out(module: nn.Module, *, native: bool = False) -> Float[Tensor, "d_in d_out"]:
    """The weight of a Linear or Conv1D as an ``[in, out]`` matrix (``y = x @ W + b``).

    Float32 (a copy when the model is not), or with ``native`` in the parameter's own dtype
    (a view, no copy).
    """
    w = parameter(module, "weight")
    w = w if type(module).__name__ == "Conv1D" else w.T
    return w.detach() if native else w.detach().float()


def bias_of(module: nn.Module) -> Float[Tensor, " d_out"] | None:
    """The bias of a projection as float32, or None."""
    b = parameter(module, "bias")
    return None if b is None else b.detach().float()


def attn_W_O(module: nn.Module, n_heads: int) -> Float[Tensor, "head d_head d_model"]:
    """Split an attention output projection into per-head write maps."""
    return einops.rearrange(as_in_out(module), "(head d_head) d_model -> head d_head d_model",
                            head=n_heads)


def head_writes(
    z: Float[Tensor, "batch pos head_d_head"], W_O: Float[Tensor, "head d_head d_model"],
    out: Tensor | None = None,
) -> Float[Tensor, "head batch pos d_model"]:
    """Per-head attention writes ``z_h @ W_O[h]`` (without the output bias).

    One batched product over heads, in ``W_O``'s dtype (``out``'s, when given: it is
    written in place, a contiguous ``[head, batch, pos, d_model]`` tensor).
    """
    dtype = W_O.dtype if out is None else out.dtype
    H, (b, p, _) = W_O.shape[0], z.shape
    if out is not None and (not out.is_floating_point() or tuple(out.shape) != (H, b, p, W_O.shape[-1])
                            or not out.is_contiguous()):
        from .errors import InputError

        raise InputError(f"out is a contiguous floating tensor [head, batch, pos, d_model] = "
                         f"{[H, b, p, W_O.shape[-1]]}, not {out.dtype} {list(out.shape)}")
    zh = einops.rearrange(z.to(dtype), "batch pos (head k) -> head (batch pos) k", head=H)
    res = torch.bmm(zh, W_O.to(zh.device, dtype), out=None if out is None else out.view(H, b * p, -1))
    return res.view(H, b, p, -1)


@dataclass(frozen=True, eq=False)
class LayerWeights:
    """Read and write maps of one block, float32, in TransformerLens's shapes.

    Key and value maps of grouped-query attention are expanded to one per query head.
    Biases are None where the model has none. ``W_gate`` is None for ungated MLPs; every MLP
    map is None for attention-only models, and for an MLP of experts (no single map). ``g_Q``
    and ``g_K`` are the gains of the RMSNorms that Qwen3, OLMo 2 and Gemma 3 put on queries
    and keys after ``W_Q`` / ``W_K`` (offset included, one row per query head), None
    elsewhere: with each such norm's per-token scale frozen, head ``h``'s query is
    ``x W_Q[h] diag(g_Q[h]) / s``. ``W_Q`` is the query projection's own weight: the scores'
    scale is the model's, ``1 / √d_head`` in most (OPT multiplies its queries by it after
    the projection, GPT-2 divides the scores; GPT-Neo scales by 1, Gemma 2 and Granite by a
    config value), and rotary embeddings, ALiBi and soft-caps apply to the scores as the
    model computes them; composition's scores are scale-free. ``v_norm_eps`` is set where each
    head's values pass a parameterless RMSNorm with that ε (Gemma 4): the values are
    ``x W_V[h] / s`` with ``s`` frozen per token and head, which changes no share of a value and
    no score of composition.
    """

    W_Q: Float[Tensor, "head d_model d_head"] | None  # None: latent attention (``LATENT``)
    W_K: Float[Tensor, "head d_model d_head"] | None
    W_V: Float[Tensor, "head d_model d_head"] | None
    b_Q: Float[Tensor, "head d_head"] | None
    b_K: Float[Tensor, "head d_head"] | None
    b_V: Float[Tensor, "head d_head"] | None
    W_O: Float[Tensor, "head d_head d_model"]
    b_O: Float[Tensor, " d_model"] | None
    W_in: Float[Tensor, "d_model d_mlp"] | None
    b_in: Float[Tensor, " d_mlp"] | None
    W_gate: Float[Tensor, "d_model d_mlp"] | None
    b_gate: Float[Tensor, " d_mlp"] | None
    W_out: Float[Tensor, "d_mlp d_model"] | None
    b_out: Float[Tensor, " d_model"] | None
    g_Q: Float[Tensor, "head d_head"] | None = None
    g_K: Float[Tensor, "head d_head"] | None = None
    v_norm_eps: float | None = None

    def attention_reads(self) -> tuple[tuple[Tensor, Tensor | None], ...]:
        """``((W_Q, b_Q), (W_K, b_K), (W_V, b_V))`` as the attention scores and values use them.

        Where the model normalizes queries and keys (``g_Q``, ``g_K``) their gains are folded
        in, ``W diag(g)`` and ``b ⊙ g``: up to each norm's frozen scale (a positive factor per
        token, and per head where the norm is per head) and the rotary embedding (orthogonal
        per position, so no share or angle changes), these make the queries and keys the
        model attends with; where the norms follow the rotary embedding (Hunyuan), a gain does
        not commute with it, and they do at position 0 only (the position-free scores of
        composition stay exact; the load warns). Elsewhere, the maps themselves.
        """
        if self.W_Q is None:
            raise NotAvailableError(LATENT)
        if self.g_Q is None:
            return (self.W_Q, self.b_Q), (self.W_K, self.b_K), (self.W_V, self.b_V)
        return (_gained(self.W_Q, self.b_Q, self.g_Q), _gained(self.W_K, self.b_K, self.g_K),
                (self.W_V, self.b_V))

    def mlp_read(self) -> tuple[Tensor, Tensor | None]:
        """``(W_in, b_in)`` as the MLP reads the stream.

        For an MLP of experts, which has no single map (its router and every expert read its
        whole input), the identity ``[d_model, d_model]`` and no bias.
        """
        if self.W_in is not None:
            return self.W_in, self.b_in
        return torch.eye(self.W_O.shape[-1], device=self.W_O.device), None

    def to(self, device: torch.device) -> LayerWeights:
        """The same maps on ``device`` (no copy for those already there)."""
        return LayerWeights(**{f.name: getattr(self, f.name).to(device)
                               if isinstance(getattr(self, f.name), Tensor) else getattr(self, f.name)
                               for f in fields(self)})


def widened(W: Tensor, d_head: int) -> Tensor:
    """``W [..., k]`` with zero columns up to ``d_head``, to stack blocks whose heads differ in width.

    (Gemma 4's full attentions have wider heads than its sliding ones.) A zero column adds nothing
    to a Gram matrix, a projection's energy or a product of maps, so stacked maps keep their values.
    """
    return torch.nn.functional.pad(W, (0, d_head - W.shape[-1])) if W.shape[-1] < d_head else W


def _gained(W: Tensor, b: Tensor | None, g: Tensor) -> tuple[Tensor, Tensor | None]:
    """``(W diag(g), b ⊙ g)`` per head, for ``W [head, d, k]``, ``b, g [head, k]``."""
    return W * g[:, None, :], None if b is None else b * g


def qkv_columns(layout: str, n_heads: int, n_kv: int, d_head: int) -> tuple[Tensor, Tensor, Tensor]:
    """Where the queries, keys and values sit in the output of the projection(s) computing them.

    Each is a ``LongTensor`` of column indices, head by head (``[head, d_head]`` flattened;
    ``n_heads`` heads of queries, ``n_kv`` of keys and of values). Layouts: ``"separate"``,
    three projections (each its own columns); one fused projection with ``"blocks"``,
    ``[q | k | v]`` (GPT-2, Phi-3, GPTBigCode's one key/value head); ``"per_head"``, ``[head:
    q k v]`` (NeoX); ``"groups"``, ``[kv head: its query heads, k, v]`` (Falcon's new decoder);
    ``"shards4"``, ``[shard of 4: q | v | k]``, each shard a quarter of the width (CodeGen,
    trained on 4 model-parallel shards). ``"latent"`` (multi-head latent attention) has no such
    columns: ``NotAvailableError``.
    """
    if layout == "latent":  # no per-head columns: the queries, keys and values are not projections
        raise NotAvailableError(LATENT)
    rep = n_heads // n_kv
    if layout == "separate":
        return tuple(torch.arange(n * d_head) for n in (n_heads, n_kv, n_kv))
    if layout == "blocks":
        cols = torch.arange((n_heads + 2 * n_kv) * d_head)
        return tuple(cols.split([n_heads * d_head, n_kv * d_head, n_kv * d_head]))
    if layout == "per_head":
        by_head = torch.arange(3 * n_heads * d_head).view(n_heads, 3, d_head)
        return tuple(by_head[:, c].flatten() for c in range(3))
    if layout == "groups":
        by_group = torch.arange((n_heads + 2 * n_kv) * d_head).view(n_kv, rep + 2, d_head)
        return by_group[:, :rep].flatten(), by_group[:, rep].flatten(), by_group[:, rep + 1].flatten()
    if layout == "shards4":  # a shard is a quarter of the width: heads may straddle two
        by_shard = torch.arange(3 * n_heads * d_head).view(4, 3, n_heads * d_head // 4)
        return by_shard[:, 0].flatten(), by_shard[:, 2].flatten(), by_shard[:, 1].flatten()
    raise ValueError(f"unknown qkv layout {layout!r}")


def _split_qkv(block: nn.Module, paths: ModulePaths, n_heads: int, n_kv: int):
    """``[(W, b)] * 3`` with W ``[d_model, n·d_head]`` for q, k, v, whatever the layout.

    A block without a value projection takes its values from ``paths.values_from`` (Gemma 4).
    """
    if paths.qkv_layout == "latent":  # multi-head latent attention: no linear map to read through
        return [(None, None)] * 3
    mods = [module_or_none(block, p) for p in paths.qkv]
    if paths.qkv_layout == "separate":
        if mods[-1] is None and paths.values_from:
            mods[-1] = block.get_submodule(paths.values_from)
        return [(as_in_out(m), bias_of(m)) for m in mods]
    W, b = as_in_out(mods[0]), bias_of(mods[0])
    d_head = W.shape[-1] // (n_heads + 2 * n_kv)
    return [(W[:, cols.to(W.device)], None if b is None else b[cols.to(b.device)])
            for cols in qkv_columns(paths.qkv_layout, n_heads, n_kv, d_head)]


def module_or_none(block: nn.Module, path: str) -> nn.Module | None:
    """The module at ``path``, or None where the block lacks it or sets it to None (Gemma 4's ``v_proj``).

    The module owning it must exist: a misspelt path still fails loudly.
    """
    owner, _, name = path.rpartition(".")
    parent = block.get_submodule(owner) if owner else block
    return None if getattr(parent, name, None) is None else block.get_submodule(path)


def _qk_gains(block: nn.Module, paths: ModulePaths, n_heads: int, n_kv: int, d_head: int):
    """``(g_Q, g_K)``, each ``[n_heads, d_head]`` float32, or ``(None, None)`` (``LayerWeights``).

    A gain of ``d_head`` entries is shared by every head (Qwen3, Gemma 3); one of ``groups ×
    d_head`` (OLMo 2 normalizes all heads' queries together) is split per head, keys'
    groups repeated for the query heads that read them.
    """
    if paths.qk_norms is None:
        return None, None
    out = []
    for path, groups in zip(paths.qk_norms, (n_heads, n_kv), strict=True):
        g = parameter(block.get_submodule(path), "weight").detach().float() + paths.qk_norm_offset
        if g.numel() == d_head:
            out.append(g.expand(n_heads, d_head))
        else:
            out.append(g.view(groups, d_head).repeat_interleave(n_heads // groups, 0))
    return tuple(out)


def _per_head(W: Tensor | None, b: Tensor | None, n_heads: int, n_groups: int):
    if W is None:
        return None, None
    W = einops.rearrange(W, "d (group k) -> group d k", group=n_groups)
    b = None if b is None else einops.rearrange(b, "(group k) -> group k", group=n_groups)
    rep = n_heads // n_groups  # grouped-query attention: head h reads kv group h // rep
    if rep == 1:
        return W, b
    return W.repeat_interleave(rep, 0), None if b is None else b.repeat_interleave(rep, 0)


def layer_weights(model: nn.Module, anatomy, layer: int) -> LayerWeights:
    """The read and write maps of block ``layer`` of ``model`` (described by ``anatomy``)."""
    paths, H = anatomy.modules, anatomy.n_heads
    block = model.get_submodule(paths.layers[layer])
    o = model.get_submodule(paths.attn_out[layer])
    d_head, n_kv = anatomy.heads_at(layer)  # this block's (Gemma 4's blocks differ)
    (Wq, bq), (Wk, bk), (Wv, bv) = _split_qkv(block, paths, H, n_kv)
    W_Q, b_Q = _per_head(Wq, bq, H, H)
    W_K, b_K = _per_head(Wk, bk, H, n_kv)
    W_V, b_V = _per_head(Wv, bv, H, n_kv)
    dense = has_mlp_maps(block, anatomy)
    down = block.get_submodule(paths.mlp_down) if dense else None
    g_Q, g_K = _qk_gains(block, paths, H, n_kv, d_head)
    v_norm = module_or_none(block, paths.v_norm) if paths.v_norm else None
    (W_in, b_in), (W_gate, b_gate) = _mlp_reads(block, paths) if dense else ((None, None), (None, None))
    return LayerWeights(
        W_Q=W_Q, W_K=W_K, W_V=W_V, b_Q=b_Q, b_K=b_K, b_V=b_V,
        W_O=attn_W_O(o, H), b_O=bias_of(o), W_in=W_in, b_in=b_in, W_gate=W_gate, b_gate=b_gate,
        W_out=None if down is None else as_in_out(down), b_out=None if down is None else bias_of(down),
        g_Q=g_Q, g_K=g_K, v_norm_eps=None if v_norm is None else float(v_norm.eps),
    )


def has_mlp_maps(block: nn.Module, anatomy) -> bool:
    """Whether ``block``'s MLP has read and write maps (``ModulePaths.mlp_in``, ``mlp_down``).

    A model of experts (``anatomy.routing``) may have dense MLPs in some blocks (GLM-4-MoE's
    first, Qwen2-MoE's ``mlp_only_layers``): those have them, its MLPs of experts do not.
    """
    paths = anatomy.modules
    if not paths.mlp_in:
        return False
    if anatomy.routing is None:
        return True  # a dense model: every block has them (a wrong path fails loudly)
    try:
        block.get_submodule(paths.mlp_in)
    except AttributeError:
        return False
    return True


def _mlp_reads(block: nn.Module, paths: ModulePaths):
    """``((W_in, b_in), (W_gate, b_gate))`` of an MLP, ``(None, None)`` for what it lacks.

    ``mlp_layout == "gate_up"``: one projection whose output is ``[gate | up]`` (Phi-3).
    """
    def read(path: str | None):
        module = block.get_submodule(path) if path else None
        return (None, None) if module is None else (as_in_out(module), bias_of(module))

    if paths.mlp_layout != "gate_up":
        return read(paths.mlp_in), read(paths.mlp_gate)
    W, b = read(paths.mlp_in)
    (W_gate, W_up), (b_gate, b_up) = W.chunk(2, -1), b.chunk(2, -1) if b is not None else (None, None)
    return (W_up, b_up), (W_gate, b_gate)


@dataclass(frozen=True, eq=False)
class Unembed:
    """How the final stream becomes logits: ``transform`` (if any), ``@ W_U + b_U``, scale, soft-cap.

    ``transform`` is a module applied before ``W_U`` (BERT's MLM head: dense, GELU,
    LayerNorm); when it is set the map is not linear, so direct logit attribution is not
    defined. ``scale`` multiplies the logits (``Anatomy.logit_scale``: Cohere's ``logit_scale``,
    Granite's ``1 / logits_scaling``); ``softcap`` is
    Gemma 2's ``final_logit_softcapping`` (``c · tanh(logits / c)``).
    """

    W_U: Float[Tensor, "d_model d_vocab"]
    b_U: Float[Tensor, " d_vocab"] | None
    transform: nn.Module | None
    softcap: float | None
    scale: float | None = None

    def logits(self, h: Float[Tensor, "*lead d_model"]) -> Float[Tensor, "*lead d_vocab"]:
        """Logits of final-normed states ``h``, as the model computes them, in ``h``'s dtype.

        For analysis: a head transform (BERT's) runs without autograd, so no gradient reaches
        ``h`` through one; without a transform, ``h @ W_U`` keeps ``h``'s graph.

        A ``W_U`` in a lower precision (``Model.unembed(native=True)``) is cast one slice of
        ``VOCAB_SLICE`` columns at a time: the same values as a float32 copy of it, without
        holding one.
        """
        width = None if self.transform is not None else self.W_U.shape[0]  # a transform reads its own
        if not isinstance(h, Tensor) or not h.is_floating_point() or width and h.shape[-1:] != (width,):
            from .errors import InputError

            what = (f"a {type(h).__name__}" if not isinstance(h, Tensor) else
                    f"{h.dtype}" if not h.is_floating_point() else f"of shape {tuple(h.shape)}")
            raise InputError(f"logits read final-normed states, a floating tensor [..., d_model"
                             f"{f'={width}' if width else ''}]; not {what} (token ids go through rs.trace; "
                             "a list: torch.tensor(h))")
        if self.transform is not None:  # an inference tensor (a lean pass's) stays one; and
            # no graph: inference_mode(False) turns grad mode on, so no_grad comes inside it
            with torch.inference_mode(h.is_inference()), torch.no_grad():
                h = self.transform(h.to(next(self.transform.parameters()).dtype)).float()
        if self.W_U.dtype == h.dtype:
            out = h @ self.W_U
        else:  # each slice's product goes straight into its columns: no second [*, d_vocab]
            out = h.new_empty(*h.shape[:-1], self.W_U.shape[-1])
            for cols in vocab_slices(out.shape[-1]):
                torch.matmul(h, self.W_U[:, cols].to(h.dtype), out=out[..., cols])
        if self.b_U is not None:
            out = out + self.b_U
        if self.scale:
            out = out * self.scale
        if self.softcap:
            out = self.softcap * torch.tanh(out / self.softcap)
        return out


def unembedding(model: nn.Module, anatomy, *, native: bool = False) -> Unembed:
    """The model's unembedding, or ``NotAvailableError`` when it has no trained LM head.

    ``W_U`` is float32 unless ``native`` (then the head's own weight, uncopied, but for a
    model with ``unembed_in``: the product of it and the head's weight, in the head's dtype).
    """
    from .errors import NotAvailableError

    head = model.get_output_embeddings() if anatomy.has_lm_head else None
    if head is None:
        raise NotAvailableError(anatomy.lm_head_note or "this model has no LM head")
    bias, W_U = bias_of(head), as_in_out(head, native=native)
    if bias is None and anatomy.modules.unembed_bias:  # beside the Linear (ESM's lm_head.bias)
        bias = model.get_parameter(anatomy.modules.unembed_bias).detach().float()
    if anatomy.modules.unembed_in:  # folded in float32: [d_model, d_proj] @ [d_proj, d_vocab]
        W_U = (as_in_out(model.get_submodule(anatomy.modules.unembed_in)) @ W_U.float()).to(W_U.dtype)
    transform = None
    if anatomy.modules.lm_head:  # the model's own modules (no copy), applied in turn
        from transformers.activations import ACT2FN

        steps = [ACT2FN[s[4:]] if s.startswith("act:") else model.get_submodule(s)
                 for s in anatomy.modules.lm_head]
        transform = steps[0] if len(steps) == 1 else nn.Sequential(*steps)
    config = getattr(model, "config", None)  # a multimodal container's head caps as its text model says
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    return Unembed(W_U, bias, transform,
                   getattr(config, "final_logit_softcapping", None), anatomy.logit_scale)
