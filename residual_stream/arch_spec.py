"""``ArchSpec``: one model family described as data (the rows are in ``families``)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class ArchSpec:
    """One model family as data. Paths are relative to ``model.base_model`` (block paths to a block).

    ``embeds``, ``placement``, ``block_norms``, ``qkv_layout``, ``causal``, ``mlp_out``,
    ``mlp_out_input`` and ``mlp_in`` may be functions of the config, where a family's options
    change them (GPT-NeoX's parallel residual, Gemma 4's experts).
    """

    family: str
    layers: str
    embeds: Mapping[str, str] | Callable[[object], Mapping[str, str]]
    block_norms: Mapping[str, str] | Callable[[object], Mapping[str, str]]
    attn_out: str
    mlp_out: str | Callable[[object], str]
    placement: str | Callable[[object], str] = "pre"
    embed_norm: str | None = None
    final_norm: str | None = None
    weight_offset: float = 0.0
    alpha: Callable[[object], float] = field(default=lambda cfg: 1.0)
    n_ctx_keys: tuple[str, ...] = ("max_position_embeddings",)
    # read and write maps, relative to a block: separate q/k/v projections, or one fused
    # projection with its layout ("blocks": [q | k | v], GPT-2, Phi-3, GPTBigCode's one
    # key/value head; "per_head": [h: q k v], NeoX; "groups": [kv head: q … q k v], Falcon's
    # new decoder, each key/value head after the query heads that read it; "shards4": [shard
    # of 4: q | v | k], CodeGen's; weights.qkv_columns)
    # "latent": multi-head latent attention (DeepSeek's MLA), whose qkv name the modules reading
    # the stream: no linear per-head maps from the stream to queries, keys and values exist
    qkv: tuple[str, ...] | Callable[[object], tuple[str, ...]] = (
        "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj")
    qkv_layout: str | Callable[[object], str] = "separate"
    mlp_in: str | Callable[[object], str] = "mlp.up_proj"
    mlp_gate: str | None = "mlp.gate_proj"
    mlp_down: str = "mlp.down_proj"
    # mixture-of-experts MLPs have no single read or write map (their blocks lack mlp_in and
    # mlp_down, which name the dense blocks' maps where a model has some): d_mlp is the widest
    # hidden layer a token's MLP computes, the largest of these config keys (one expert's
    # width; Qwen2-MoE's shared expert's; GLM-4-MoE's dense blocks'; dotted: nested, DBRX's;
    # "a*b": a product, DeepSeek-style shared experts' moe_intermediate_size*n_shared_experts)
    d_mlp_keys: tuple[str, ...] | Callable[[object], tuple[str, ...]] = ()
    # (experts a token uses, experts) of such an MLP, for the memory estimate
    routing: Callable[[object], tuple[int, int] | None] = field(default=lambda cfg: None)
    # "gate_up": mlp_in (= mlp_gate) is one projection whose output is [gate | up], the
    # activation on the first half (Phi-3, ModernBERT)
    mlp_layout: str = "separate"
    # a nonlinear transform between the final stream and the unembedding (an MLM head: dense,
    # activation, LayerNorm), relative to the top model: one module, or modules applied in
    # turn, "act:NAME" an activation of transformers' ACT2FN; the lens applies it, direct
    # logit attribution cannot
    head_transform: str | tuple[str, ...] | None = None
    # a linear map without a bias from the final stream to the unembedding's input (OPT-350m's
    # project_out), folded into W_U, so the unembedding still reads the stream's own directions
    unembed_in: str | None = None
    # the unembedding's bias where the head keeps it beside its Linear, not in it (ESM's lm_head.bias,
    # added to lm_head.decoder's output), relative to the top model
    unembed_bias: str | None = None
    # RMSNorms on the queries and keys after their projections (Qwen3, OLMo 2, Gemma 3),
    # relative to a block: their gains scale each head's W_Q / W_K (``LayerWeights.g_Q``)
    qk_norms: tuple[str, str] | None = None
    # where a block has no value projection (qkv's last module absent or None), the projection whose
    # output are its values, relative to a block (Gemma 4's full attentions with attention_k_eq_v: the
    # key projection's, before the key norm)
    values_from: str | None = None
    # a parameterless RMSNorm on each head's values, relative to a block (Gemma 4's v_norm): W_V gives
    # the values up to its frozen scale, a positive factor per token and head (``LayerWeights.v_norm_eps``)
    v_norm: str | None = None
    # a buffer of each block, relative to it, by which the block multiplies the whole stream as it ends
    # (Gemma 4's layer_scalar): a constant multiplier "ln_block_out" per block in the stream program
    block_scale: str | None = None
    # False: bidirectional attention, a masked-LM head (BERT; as a decoder, ``is_decoder``, causal)
    causal: bool | Callable[[object], bool] = True
    # why a config's variant of the family is not described by this row (None: it is)
    refuse: Callable[[object], str | None] = field(default=lambda cfg: None)
    # a decoder block's cross-attention, relative to a block (BART's encoder_attn): a stack whose blocks
    # have it is an encoder-decoder model's decoder, refused (its config may not say so: BART's is shared)
    cross_attention: str | None = None
    # the model multiplies by its multipliers as tensors of its own dtype (T5Gemma's normalizer), not as
    # Python numbers: each is rounded to the weights' dtype (√3584 = 59.87 is 60.0 in bfloat16)
    multipliers_in_model_dtype: bool = False
    # constant multipliers by norm role (Granite's): each is a norm of kind "multiplier",
    # "ln_embed" on the embeddings' sum, "ln_embed_token" on the token embedding before the others are
    # added (Marian's), "ln_attn_out" / "ln_mlp_out" on every block's writes
    multipliers: Callable[[object], Mapping[str, float]] = field(default=lambda cfg: {})
    # what the model multiplies its logits by (Cohere's logit_scale, Granite's 1 / logits_scaling)
    logit_scale: Callable[[object], float | None] = field(default=lambda cfg: None)
    # the norms' ε where their class keeps none (OLMo's LayerNorm without parameters: 1e-5)
    norm_eps: float | None = None
    # what the norms compute where their class name says otherwise (T5's ``T5LayerNorm``: "rmsnorm")
    norm_kind: str | None = None
    # the framework's hidden_states end with the stream BEFORE the final norm, its last_hidden_state
    # after it (CLIP's and SigLIP's text models)
    states_before_final_norm: bool = False
    # key/value heads where the config's num_key_value_heads does not say (Falcon's)
    n_kv_heads: Callable[[object], int] | None = None
    # the block adds to the MLP's output tensor in place once the module returns (Falcon)
    mlp_out_in_place: bool = False
    # the MLP's write is the INPUT of the module at mlp_out, where no module outputs it alone (Gemma 4's
    # blocks of experts: a dense MLP's and the experts' outputs, each normed, summed into the write's norm)
    mlp_out_input: bool | Callable[[object], bool] = False
    # why the framework's attention patterns (its eager attention) are not the model's, if so
    patterns_refused: Callable[[object], str | None] = field(default=lambda cfg: None)
    # attention sinks applied after the softmax, as a scale sigmoid(logsumexp(scores) − sink)
    # on each head's output (Granite SWA): the framework's patterns leave the scale out
    sinks_after_softmax: bool = False
    # what the weights' read maps do not describe in this config (a warning when it loads)
    maps_caveat: Callable[[object], str | None] = field(default=lambda cfg: None)
