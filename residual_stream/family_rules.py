"""Rules of the architecture table: functions of a model's config that its rows name.

A row (``arch_spec.ArchSpec``) is data; where a family's options change what it describes,
the row names one of these: which norms a block has, which variants are refused, what a
load warns of, how many experts a token uses.
"""

from __future__ import annotations

from collections.abc import Callable


def config_value(cfg, key: str, default=None):
    """``cfg``'s value at ``key``, a dotted path into nested configs (DBRX's ``ffn_config.moe_top_k``).

    An integer part indexes a list or tuple (ERNIE 4.5 VL's ``moe_intermediate_size.0``, its text
    experts' width of [text, vision]); past its end the value is unset, as a missing key is.
    """
    value = cfg
    for part in key.split("."):
        if part.isdigit() and isinstance(value, (list, tuple)):
            value = value[int(part)] if int(part) < len(value) else None
        else:
            value = getattr(value, part, None)
        if value is None:
            return default
    return value


def config_width(cfg, key: str) -> int:
    """A width from ``cfg``: one key's value, or the product of keys joined by ``*``.

    Shared experts are ``moe_intermediate_size*n_shared_experts`` wide; a factor the config
    leaves unset counts 0 (a model without shared experts). Every row's keys are fields of its
    config class, which the tests check, so a misspelt key cannot pass as unset.
    """
    width = 1
    for factor in key.split("*"):
        width *= int(config_value(cfg, factor, 0))
    return width


def flag(key: str, variant: str) -> Callable[[object], str | None]:
    """A ``refuse`` rule: a config with ``key`` set is ``variant``, which no row describes."""
    return lambda cfg: variant if getattr(cfg, key, False) else None


def clipped(cfg) -> str | None:
    """A ``maps_caveat``: queries, keys and values clamped after their projections (OLMo, MPT)."""
    attn = getattr(cfg, "attn_config", None)  # MPT's: an object or a dict
    clip = getattr(cfg, "clip_qkv", None) or (attn.get("clip_qkv") if isinstance(attn, dict) else
                                              getattr(attn, "clip_qkv", None))
    return None if not clip else (
        f"its queries, keys and values are clamped to ±{clip} after their projections (clip_qkv): the "
        "weights' read maps (model.weights' W_Q, W_K, W_V, composition, read attribution of queries, "
        "keys and values) describe them before the clamp; the stream, its decomposition and patching "
        "are exact")


def qk_layernorms(cfg) -> str | None:
    """A ``maps_caveat``: LayerNorms on each head's queries and keys (StableLM 2, Phi, Persimmon).

    ``qk_layernorm`` centres them, scales them by a gain and adds a bias after the projection.
    """
    return None if not getattr(cfg, "qk_layernorm", False) else (
        "a LayerNorm on each head's queries and keys (qk_layernorm), which centres them, scales them by a "
        "gain and adds a bias after the projection: the weights' read maps (W_Q, W_K, composition, read "
        "attribution of queries and keys) describe them before that norm; the stream, its decomposition, "
        "values and patching are exact")


def llama4_queries(cfg) -> str | None:
    """A ``maps_caveat``: queries scaled by position after the rotary embedding (Ministral 3's).

    By 1 + β·log(1 + ⌊p / n⌋), β the ``llama_4_scaling_beta`` and n the original context length.
    """
    rope = getattr(cfg, "rope_parameters", None) or {}
    beta, n = rope.get("llama_4_scaling_beta"), rope.get("original_max_position_embeddings")
    return None if not beta else (
        f"from position {n} on, its queries are multiplied by 1 + {beta}·log(1 + ⌊position / {n}⌋) after "
        "the rotary embedding: the weights' W_Q (composition, read attribution of queries) describes them "
        "before that factor, so there the scores they give are the model's divided by it; the stream, its "
        "decomposition, patching and attention patterns are exact")


def llama4_temperature(cfg) -> str | None:
    """A ``maps_caveat``: Llama 4's queries scaled by position in its blocks without rotary embedding.

    By 1 + a·log(1 + ⌊(p + 1) / f⌋), a the ``attn_scale`` and f the ``floor_scale``
    (``attn_temperature_tuning``): 1 before position f − 1.
    """
    if not cfg.attn_temperature_tuning or all(cfg.no_rope_layers):
        return None
    f, a = cfg.floor_scale, cfg.attn_scale
    return (f"from position {f - 1} on, the queries of its blocks without rotary embedding are multiplied by "
            f"1 + {a}·log(1 + ⌊(position + 1) / {f}⌋) (attn_temperature_tuning): the weights' W_Q "
            "(composition, read attribution of queries) describes them before that factor; the stream, its "
            "decomposition, patching and attention patterns are exact")


def llama4_dense(cfg) -> bool:
    """Whether some Llama 4 blocks have a dense MLP (``moe_layers`` not all of them; Maverick's)."""
    return len(cfg.moe_layers) < cfg.num_hidden_layers


def any_of(*rules: Callable[[object], str | None]) -> Callable[[object], str | None]:
    """A ``refuse`` rule: the first of ``rules`` that refuses the config."""
    return lambda cfg: next((why for why in (rule(cfg) for rule in rules) if why), None)


def routing_of(used: str = "num_experts_per_tok", experts: str = "num_local_experts"):
    """A ``routing`` rule: (experts a token uses, experts) from these config keys (dotted paths).

    A key given per layer (Hunyuan MoE's lists) counts its largest: the memory estimate it
    feeds is a bound for every block.
    """
    def most(value) -> int:
        return int(max(value)) if isinstance(value, (list, tuple)) else int(value)
    return lambda cfg: (most(config_value(cfg, used)), most(config_value(cfg, experts)))


def falcon_norms(cfg) -> dict[str, str]:
    """Falcon's block norms: two side by side, one read by both sublayers, or one before each.

    The new decoder's ``ln_attn`` and ``ln_mlp`` (unless ``num_ln_in_parallel_attn`` is 1);
    ``parallel_attn`` off: ``input_layernorm``, then ``post_attention_layernorm``.
    """
    if cfg.new_decoder_architecture and (cfg.num_ln_in_parallel_attn or 2) == 2:
        return {"ln_attn_in": "ln_attn", "ln_mlp_in": "ln_mlp"}
    mlp = "input_layernorm" if cfg.parallel_attn else "post_attention_layernorm"
    return {"ln_attn_in": "input_layernorm", "ln_mlp_in": mlp}


def opt_norms(cfg) -> dict[str, str]:
    """OPT's two LayerNorms: before each sublayer, or after each residual add (350m)."""
    roles = ("ln_attn_in", "ln_mlp_in") if cfg.do_layer_norm_before else ("ln_resid_attn", "ln_resid_mlp")
    return dict(zip(roles, ("self_attn_layer_norm", "final_layer_norm"), strict=True))


def qwen_moe_widths(*moe_keys: str) -> Callable[[object], tuple[str, ...]]:
    """A ``d_mlp_keys`` rule (Qwen2-MoE, Qwen3-MoE): the experts' widths, and the dense MLPs'.

    The dense MLPs' ``intermediate_size`` counts where some blocks have one
    (``mlp_only_layers``, a ``decoder_sparse_step`` over 1, or no experts at all).
    """
    def dense(cfg) -> bool:
        return bool(cfg.mlp_only_layers) or cfg.decoder_sparse_step > 1 or not cfg.num_experts
    return with_dense("intermediate_size", dense, *moe_keys)


def with_dense(dense_key: str, has_dense: Callable[[object], bool], *moe_keys: str):
    """A ``d_mlp_keys`` rule: the experts' widths, and the dense MLPs' (``dense_key``) where some have one.

    ``has_dense`` says whether some blocks have a dense MLP; ``dense_key`` counts where the
    config gives its width (Cohere 2 MoE's dense MLPs take the experts' where it does not).
    """
    return lambda cfg: (*moe_keys, dense_key) if has_dense(cfg) and config_value(cfg, dense_key) else moe_keys


def first_dense(cfg) -> bool:
    """Whether the first ``first_k_dense_replace`` blocks have dense MLPs (DeepSeek's, dots1's)."""
    return cfg.first_k_dense_replace > 0


def dense_layer_types(cfg) -> bool:
    """Whether ``mlp_layer_types`` names some blocks' MLPs dense (Hy3, Cohere 2 MoE)."""
    return "dense" in (cfg.mlp_layer_types or ())
