"""The rows of encoder-decoder models, whose ENCODER's stream is analysed (T5's and BART's descendants).

An encoder-decoder model (``T5ForConditionalGeneration``, ``T5Model``, ``T5EncoderModel``) is analysed
through its encoder stack alone (``architectures.stream_model``: ``model.get_encoder()``), which runs on
text by itself: a bidirectional encoder without an LM head, as T5's encoder conditions Flux and
Stable Diffusion 3. The decoder's stream has a third writer, cross-attention reading the encoder's
output, which no row describes; a decoder stack passed in alone is refused by name. A folder of such a
checkpoint loads its encoder only (``AutoModelForTextEncoding``'s class: ``ENCODERS_ALONE``), or the
model, of which the encoder is kept.

``families.ARCHITECTURES`` merges these rows with the others.
"""

from __future__ import annotations

from dataclasses import replace

from .arch_spec import ArchSpec
from .family_rules import any_of
from .family_templates import GEMMA, QK_NORMS

DECODER = "a decoder stack (its cross-attention, a third sublayer reading the encoder's output)"
_ENC = "bidirectional; the encoder of an encoder-decoder model"


def _decoder(cfg) -> str | None:
    """A ``refuse`` rule: a config that says it is a decoder's (``is_decoder``; M2M-100's has no such key)."""
    return DECODER if getattr(cfg, "is_decoder", False) else None


_FF = "layer.1.DenseReluDense"  # T5LayerFF's MLP: wi (or wi_0 gating wi_1), then wo
_T5 = ArchSpec(
    family=f"T5 encoder (pre-RMSNorm, relative position bias, {_ENC})",
    layers="block", embeds={"embed": "embed_tokens"}, final_norm="final_layer_norm",
    block_norms={"ln_attn_in": "layer.0.layer_norm", "ln_mlp_in": "layer.1.layer_norm"},
    attn_out="layer.0.SelfAttention.o", mlp_out=_FF,
    qkv=("layer.0.SelfAttention.q", "layer.0.SelfAttention.k", "layer.0.SelfAttention.v"),
    mlp_in=lambda cfg: f"{_FF}.wi_1" if cfg.is_gated_act else f"{_FF}.wi",
    mlp_gate=f"{_FF}.wi_0", mlp_down=f"{_FF}.wo",
    norm_kind="rmsnorm",  # T5LayerNorm: x / rms(x) · γ, no mean subtracted, no bias
    causal=False, n_ctx_keys=("n_positions",),
    refuse=_decoder, cross_attention="layer.1.EncDecAttention",
)

# BART's encoder and its descendants' (fairseq's): token embeddings (scaled by √d_model inside their module
# where scale_embedding) and positions (learned, looked up at position + 2, or sinusoidal; their module's
# output) summed, under layernorm_embedding where the model has one; blocks whose MLP is fc1, activation, fc2
# in the block itself
_BART = ArchSpec(
    family=f"BART encoder (post-LayerNorm, LayerNorm on the embeddings, learned positions, {_ENC})",
    layers="layers", embeds={"embed": "embed_tokens", "pos_embed": "embed_positions"},
    embed_norm="layernorm_embedding", placement="post",
    block_norms={"ln_resid_attn": "self_attn_layer_norm", "ln_resid_mlp": "final_layer_norm"},
    attn_out="self_attn.out_proj", mlp_out="fc2", mlp_in="fc1", mlp_gate=None, mlp_down="fc2",
    qkv=("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"), causal=False,
    refuse=_decoder,  # (*ForCausalLM's)
    cross_attention="encoder_attn",
)
_PRE_BART = replace(  # pre-LayerNorm blocks, a LayerNorm on the final stream (mBART's, M2M-100's)
    _BART, placement="pre", final_norm="layer_norm",
    block_norms={"ln_attn_in": "self_attn_layer_norm", "ln_mlp_in": "final_layer_norm"})
# Marian's, Pegasus's and Blenderbot Small's encoders multiply the token embeddings by √d_model in their own
# forward, outside the embedding module, before the positions are added: a multiplier on that embedding
_SCALED_OUTSIDE = {"multipliers": lambda cfg: {"ln_embed_token": cfg.d_model ** 0.5} if cfg.scale_embedding
                   else {}}


def _row(row: ArchSpec, name: str, what: str, **fields) -> ArchSpec:
    return replace(row, family=f"{name} encoder ({what}, {_ENC})", **fields)


# T5Gemma's encoder: Gemma 2's sandwich blocks, bidirectional (sliding windows both ways in some blocks); its
# forward multiplies the token embeddings by √hidden_size outside their module, the one embedding: a
# multiplier
_T5GEMMA = replace(
    GEMMA, family=f"T5Gemma encoder (sandwich RMSNorm with (1+γ), scaled embeddings, rotary, {_ENC})",
    block_norms={"ln_attn_in": "pre_self_attn_layernorm", "ln_attn_out": "post_self_attn_layernorm",
                 "ln_mlp_in": "pre_feedforward_layernorm", "ln_mlp_out": "post_feedforward_layernorm"},
    multipliers=lambda cfg: {"ln_embed": cfg.hidden_size ** 0.5}, multipliers_in_model_dtype=True,
    causal=False, refuse=_BART.refuse,
    cross_attention="cross_attn")

# Switch Transformers' encoder: T5's blocks, every encoder_sparse_step-th MLP a mixture of experts (top-1,
# its output times the router's probability; a token past an expert's capacity gets no MLP write)
_SWITCH = replace(
    _T5, family="Switch Transformers encoder (pre-RMSNorm, relative position bias, top-1 mixture-of-experts "
    f"MLPs in some blocks, {_ENC})",
    mlp_out="layer.1.mlp", mlp_in="layer.1.mlp.wi", mlp_gate=None, mlp_down="layer.1.mlp.wo",
    d_mlp_keys=("d_ff",), routing=lambda cfg: (1, cfg.num_experts))

# T5Gemma 2's encoder (T5Gemma2Encoder) holds a text model (text_model: Gemma 3's blocks, bidirectional, with
# sliding windows both ways in some, embeddings scaled in their module) beside a vision tower, which images
# alone reach: on text it runs that text model alone (``T5GEMMA2_CONTAINERS``). Its decoder's one attention
# reads its own stream and the encoder's output in one softmax: refused
_T5GEMMA2 = replace(
    _T5GEMMA, family=f"T5Gemma 2 encoder (Gemma 3's blocks: sandwich RMSNorm with (1+γ), scaled embeddings, "
    f"RMSNorm on q and k, rotary; {_ENC})", multipliers=lambda cfg: {}, qk_norms=QK_NORMS,
    refuse=lambda cfg: None, cross_attention=None)

# NLLB-MoE's encoder: M2M-100's, every encoder_sparse_step-th MLP a mixture of experts (top-2, each expert's
# output times its router probability; a token past an expert's capacity gets none of its write)
_NLLB_MOE = _row(
    _PRE_BART, "NLLB-MoE", "pre-LayerNorm, LayerNorm on the final stream, sinusoidal positions counted past "
    "the padding, mixture-of-experts MLPs in some blocks", embed_norm=None,
    block_norms={"ln_attn_in": "self_attn_layer_norm", "ln_mlp_in": "ff_layer_norm"}, mlp_out="ffn",
    mlp_in="ffn.fc1", mlp_down="ffn.fc2", d_mlp_keys=("encoder_ffn_dim",),
    routing=lambda cfg: (2, cfg.num_experts), cross_attention="cross_attention")
# BigBird-Pegasus's encoder with full attention (its final LayerNorm is named layernorm_embedding); its
# block-sparse attention (global, sliding and random blocks, the input padded to whole blocks) is refused
_BIGBIRD_PEGASUS = _row(
    _PRE_BART, "BigBird-Pegasus", "pre-LayerNorm, LayerNorm on the final stream, learned positions, full "
    "attention", embed_norm=None, final_norm="layernorm_embedding", attn_out="self_attn.output",
    qkv=("self_attn.self.query", "self_attn.self.key", "self_attn.self.value"),
    refuse=any_of(lambda cfg: "block-sparse attention (attention_type='block_sparse'; load it with "
                  "attention_type='original_full')" if cfg.attention_type != "original_full" else None,
                  _BART.refuse))

SEQ2SEQ: dict[str, ArchSpec] = {
    "t5": _T5,
    "mt5": replace(_T5, family=_T5.family.replace("T5 encoder", "mT5 encoder")),
    # UMT5: a relative position bias of each block's own, not block 0's shared
    "umt5": replace(_T5, family=_T5.family.replace("T5 encoder", "UMT5 encoder").replace(
        "relative position bias", "relative position bias in every block")),
    "switch_transformers": _SWITCH,
    "bart": _BART,
    "plbart": _row(_BART, "PLBart", "post-LayerNorm, LayerNorm on the embeddings, learned positions"),
    "mbart": _row(_PRE_BART, "mBART", "pre-LayerNorm, LayerNorm on the embeddings and the final stream, "
                  "learned positions"),
    "m2m_100": _row(_PRE_BART, "M2M-100 / NLLB", "pre-LayerNorm, LayerNorm on the final stream, sinusoidal "
                    "positions counted past the padding", embed_norm=None),
    "blenderbot": _row(_PRE_BART, "Blenderbot", "pre-LayerNorm, LayerNorm on the final stream, learned "
                       "positions", embed_norm=None),
    "pegasus": _row(_PRE_BART, "Pegasus", "pre-LayerNorm, LayerNorm on the final stream, sinusoidal "
                    "positions", embed_norm=None, **_SCALED_OUTSIDE),
    "marian": _row(_BART, "Marian", "post-LayerNorm, sinusoidal positions, scaled token embeddings: the "
                   "original Transformer's", embed_norm=None, **_SCALED_OUTSIDE),
    "blenderbot-small": _row(_BART, "Blenderbot Small", "post-LayerNorm, LayerNorm on the embeddings, "
                             "learned positions", **_SCALED_OUTSIDE),
    # T5Gemma: the whole model's type routes it to its encoder, whose config (a module config) is its row's
    "t5gemma": _T5GEMMA, "t5_gemma_module": _T5GEMMA,
    # T5Gemma 2: the whole model's type routes it to its encoder, whose text model is its text config's row
    "t5gemma2": _T5GEMMA2, "t5gemma2_text": _T5GEMMA2,
    "nllb-moe": _NLLB_MOE,
    # MVP's encoder: BART's, with layer-wise prompts (use_prompt: keys and values of each self-attention
    # that no token's stream gives) refused
    "mvp": _row(_BART, "MVP", "post-LayerNorm, LayerNorm on the embeddings, learned positions",
                **_SCALED_OUTSIDE, refuse=any_of(lambda cfg: "layer-wise prompts (use_prompt: keys and "
                                                 "values in each self-attention that no token's stream "
                                                 "gives)" if cfg.use_prompt else None, _BART.refuse)),
    "bigbird_pegasus": _BIGBIRD_PEGASUS,
}
# T5Gemma 2's encoder (the whole model routes to it): its text model's path (``families.CONTAINERS``)
T5GEMMA2_CONTAINERS: dict[str, str] = {"t5gemma2_encoder": "text_model"}
# decoder stacks with a config type of their own, refused by name (no row: they are not supported)
DECODER_TYPES: dict[str, str] = {
    "t5gemma2_decoder": "a decoder stack (its merged self- and cross-attention, whose keys and values "
    "include the encoder's output)"}
# model types analysed through their encoder (``model.get_encoder()``)
ENCODER_DECODERS: frozenset[str] = frozenset({*SEQ2SEQ, *T5GEMMA2_CONTAINERS})
# those whose folder loads the encoder alone (``AutoModelForTextEncoding``: T5EncoderModel); the others load
# as the class their config names and keep its encoder (T5Gemma's encoder class refuses an encoder-decoder
# config, and Marian's checkpoints leave out the sinusoid that only its whole class knows to rebuild)
ENCODERS_ALONE: frozenset[str] = frozenset({"t5", "mt5", "umt5"})
