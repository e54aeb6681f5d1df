"""Rows of recent families (mixture-of-experts, Gemma 4, Mistral 4, contrastive text encoders), containers.

``families.ARCHITECTURES`` merges them with the other decoders' rows, and ``families.CONTAINERS``
the containers (Gemma 4, Gemma 4 unified, Qwen3-VL-MoE, GLM-4.1V, GLM-4.5V, GLM-4.6V, Aria, ERNIE 4.5
VL, HunyuanOCR, Molmo2, Granite 4 Vision, Granite Docling, PaddleOCR-VL, GLM-OCR, Cosmos3 Edge, and those
of text models of other families: Idefics2, Video-LLaVA, ...) whose text models these rows describe.
"""

from __future__ import annotations

from dataclasses import replace

from .arch_spec import ArchSpec
from .encoder_families import CROSS
from .family_rules import dense_layer_types, flag, qk_layernorms, qwen_moe_widths, routing_of, with_dense
from .family_templates import (
    DEEPSEEK,
    DSA_QKV,
    GATE_UP,
    GEMMA,
    GLM4_MOE,
    GLM4_NORMS,
    GRANITE,
    HUNYUAN_QK,
    LLAMA,
    MLA,
    MLA_MOE,
    MOE,
    QK_NORMS,
    SHARED_AFTER_DENSE,
)


def _shared_indexer(cfg) -> str | None:
    """A ``refuse`` rule: GLM-5's attentions that reuse an earlier block's indexer selection."""
    return None if "shared" not in (cfg.indexer_types or ()) else (
        "attentions reusing the keys an earlier block's sparse-attention indexer chose (indexer_types "
        "'shared'): one block's read of the stream decides another's keys, a path the stream program does "
        "not have, and those attentions have no indexer modules of their own")


def _gemma4_variant(cfg) -> str | None:
    """A ``refuse`` rule: Gemma 4's per-layer inputs and keys and values shared across blocks.

    (Gemma 4 unified's config has no per-layer inputs or experts at all: an unset key is none.)
    """
    if getattr(cfg, "hidden_size_per_layer_input", None):
        return ("per-layer inputs (hidden_size_per_layer_input; Gemma 4 E2B and E4B): a third, gated "
                "sublayer in each block that multiplies what it reads by a per-layer embedding of each token")
    return None if not cfg.num_kv_shared_layers else (
        "blocks reusing an earlier block's keys and values (num_kv_shared_layers): one block's read of the "
        "stream feeds another block's attention")


def _gemma4_experts(cfg) -> bool:
    """Gemma 4's blocks of experts (26B-A4B): a dense MLP and experts beside it, one write.

    Each reads the stream through norms of its own (the router too), and their normed outputs'
    sum is the write, the input of ``post_feedforward_layernorm``: the MLP reads the raw stream.
    """
    return bool(getattr(cfg, "enable_moe_block", False))


def _experts_or(experts, dense):
    """A field of Gemma 4's row: ``experts`` for its blocks of experts, else ``dense``."""
    return lambda cfg: experts if _gemma4_experts(cfg) else dense


GEMMA4_NORMS = {"ln_attn_in": "input_layernorm", "ln_attn_out": "post_attention_layernorm",
                "ln_mlp_out": "post_feedforward_layernorm"}
# Gemma 4 (31B; 26B-A4B, with experts): Gemma 3's sandwich with plain gains (γ, not 1 + γ); each head's
# values through a parameterless RMSNorm, and full attentions with attention_k_eq_v (wider heads, fewer
# key/value heads) take the key projection's output as values; every block ends by multiplying the
# stream by its layer_scalar
GEMMA4 = replace(
    GEMMA, family="Gemma 4 decoder (sandwich RMSNorm, scaled embeddings, RMSNorm on q, k and v, keys as "
    "values in full attentions, the stream scaled as each block ends; experts beside the MLP where "
    "configured)",
    weight_offset=0.0, qk_norms=QK_NORMS, values_from="self_attn.k_proj", v_norm="self_attn.v_norm",
    block_scale="layer_scalar", n_kv_heads=lambda cfg: cfg.per_layer_config[0].num_key_value_heads,
    block_norms=_experts_or(GEMMA4_NORMS, GEMMA.block_norms),
    mlp_out=_experts_or("post_feedforward_layernorm", "mlp"), mlp_out_input=_gemma4_experts,
    mlp_in=_experts_or("", "mlp.up_proj"),
    d_mlp_keys=("intermediate_size", "moe_intermediate_size"),  # (an expert's: unset in a dense one)
    routing=lambda cfg: routing_of("top_k_experts", "num_experts")(cfg) if _gemma4_experts(cfg) else None,
    causal=lambda cfg: cfg.use_bidirectional_attention != "all", refuse=_gemma4_variant)


def _molmo2_norms(cfg) -> dict[str, str]:
    """Molmo2's two RMSNorms: before each sublayer, or on each sublayer's write (``norm_after``, OLMo 2's)."""
    roles = ("ln_attn_out", "ln_mlp_out") if cfg.norm_after else ("ln_attn_in", "ln_mlp_in")
    return dict(zip(roles, ("input_layernorm", "post_attention_layernorm"), strict=True))


def _granite_text(name: str) -> ArchSpec:
    """The row of a multimodal model's Granite text model (Granite 4 Vision's, Granite Docling's)."""
    return replace(GRANITE, family=f"{name} text decoder (Granite's: pre-RMSNorm; embedding, write and logit "
                   "multipliers)")


# GLM-4.1V's and GLM-4.6V's text model: GLM-4's blocks (each head's dims 2i and 2i + 1 rotated together)
GLM4V_TEXT = replace(GEMMA, family="GLM-4V text decoder (GLM-4's: sandwich RMSNorm, biases on q, k and v, "
                     "fused gate/up projection; multimodal partial rotary)", weight_offset=0.0, **GATE_UP,
                     block_norms=GLM4_NORMS)

# the text encoders of contrastive image-text models (CLIP, SigLIP): pre-LayerNorm blocks over token and
# learned position embeddings, a GELU MLP fc1 → fc2 (CLIP's quick_gelu); CLIP's attend causally, SigLIP's
# bidirectionally. Their final_layer_norm gives last_hidden_state, but their hidden states end before it (as
# SDXL's penultimate-layer reads do): states_before_final_norm. The pooling (the EOS or last token) and the
# projections (text_projection, SigLIP's head) read the final stream from outside. No LM head
CLIP_TEXT = ArchSpec(
    family="CLIP text encoder (pre-LayerNorm, learned positions, causal, no LM head)",
    layers="encoder.layers",
    embeds={"embed": "embeddings.token_embedding", "pos_embed": "embeddings.position_embedding"},
    block_norms={"ln_attn_in": "layer_norm1", "ln_mlp_in": "layer_norm2"}, final_norm="final_layer_norm",
    attn_out="self_attn.out_proj", mlp_out="mlp", mlp_in="mlp.fc1", mlp_gate=None, mlp_down="mlp.fc2",
    states_before_final_norm=True)  # its hidden_states end before final_layer_norm (SDXL reads them)
SIGLIP_TEXT = replace(CLIP_TEXT, family=CLIP_TEXT.family.replace("CLIP", "SigLIP").replace(
    "causal", "bidirectional"), causal=False)

RECENT: dict[str, ArchSpec] = {
    "gemma4_text": GEMMA4,
    # Gemma 4 unified: Gemma 4's dense blocks (its config has no per-layer inputs or experts); the MLPs
    # twice as wide (use_double_wide_mlp) only in blocks sharing keys and values, refused
    "gemma4_unified_text": replace(
        GEMMA4, family="Gemma 4 unified decoder (Gemma 4's dense blocks: sandwich RMSNorm, scaled "
        "embeddings, RMSNorm on q, k and v, keys as values in full attentions, the stream scaled as each "
        "block ends)",
        d_mlp_keys=("intermediate_size",)),
    # the text models of the containers: on text alone their multimodal rotary gives each axis the
    # same position, so plain rotary (Qwen3-VL-MoE's visual features, added to early blocks' streams,
    # come only with images). Qwen3-VL-MoE's: Qwen3-MoE's blocks, dense where mlp_only_layers says
    "qwen3_vl_moe_text": replace(
        MOE, family="Qwen3-VL-MoE text decoder (Qwen3-MoE's: pre-RMSNorm, RMSNorm on q and k, "
        "mixture-of-experts MLPs; multimodal rotary)", qk_norms=QK_NORMS,
        d_mlp_keys=qwen_moe_widths("moe_intermediate_size"), routing=routing_of(experts="num_experts")),
    "glm4v_text": GLM4V_TEXT,
    # GLM-OCR's: GLM-4V's blocks without biases on q, k and v
    "glm_ocr_text": replace(GLM4V_TEXT, family=GLM4V_TEXT.family.replace("GLM-4V", "GLM-OCR").replace(
        "biases on q, k and v, ", "")),
    # GLM-4.5V's: GLM-4-MoE's blocks without RMSNorms on q and k
    "glm4v_moe_text": replace(GLM4_MOE, family=f"GLM-4.5V text decoder (GLM-4-MoE's: pre-RMSNorm, biases on "
                              f"q, k and v, {SHARED_AFTER_DENSE}; multimodal partial rotary)", qk_norms=None,
                              d_mlp_keys=DEEPSEEK.d_mlp_keys),
    # MiniMax-M2: one RMSNorm over all heads' queries and one over all heads' keys (OLMo 2's), its gains
    # split per head (weights._qk_gains); sigmoid routing with a bias choosing the experts
    "minimax_m2": replace(MOE, family="MiniMax-M2 decoder (pre-RMSNorm, partial rotary, RMSNorm on all "
                          "heads' queries and on all heads' keys, mixture-of-experts MLPs)",
                          qk_norms=QK_NORMS),
    # Aria's text model: shared experts as wide as an expert times moe_num_shared_experts, in every block
    "aria_text": replace(MOE, family="Aria text decoder (pre-RMSNorm, rotary, mixture-of-experts MLPs with "
                         "shared experts)", routing=routing_of("moe_topk", "moe_num_experts"),
                         d_mlp_keys=("intermediate_size", "intermediate_size*moe_num_shared_experts")),
    # GLM-5: DeepSeek-V3.2's blocks (its indexer's rotary interleaved), dense where mlp_layer_types says
    "glm_moe_dsa": replace(MLA_MOE, family=f"GLM-5 decoder (DeepSeek-V3.2's: pre-RMSNorm, {MLA} with keys "
                           f"chosen by a sparse-attention indexer, {SHARED_AFTER_DENSE})", qkv=DSA_QKV,
                           refuse=_shared_indexer),
    # ERNIE 4.5 VL's: ERNIE 4.5 MoE's blocks with text and vision experts apart (moe_intermediate_size
    # [text, vision]); on text alone (no moe_mm_token_type_ids) every token goes to the text experts,
    # and the shared experts, as wide as a text expert times moe_num_shared_experts, see every token
    "ernie4_5_vl_moe_text": replace(
        MOE, family="ERNIE 4.5 VL MoE text decoder (ERNIE 4.5 MoE's: pre-RMSNorm, mixture-of-experts MLPs "
        "with shared experts after the first dense ones, text alone routed to the text experts; multimodal "
        "rotary)", routing=routing_of("moe_k", "moe_num_experts"), d_mlp_keys=with_dense(
            "intermediate_size", dense_layer_types, "moe_intermediate_size.0",
            "moe_intermediate_size.0*moe_num_shared_experts")),
    # Mistral Small 4: DeepSeek-V3's blocks (softmax routing in groups, dense first_k_dense_replace blocks);
    # its queries multiplied inside the attention by 1 + β·log(1 + ⌊p / n⌋) (Ministral 3's), which the
    # patterns include and no read map describes (latent attention has none)
    "mistral4": replace(DEEPSEEK, family=f"Mistral 4 decoder (pre-RMSNorm, {MLA} with queries scaled by "
                        f"position beyond the original context, {SHARED_AFTER_DENSE})"),
    # the text models of HunyuanOCR (Hunyuan's dense blocks, multimodal rotary: one position on every axis
    # on text alone), Molmo2 (its 2D embedding also holds additional_vocab_size image tokens' rows) and
    # Granite 4 Vision (Granite's blocks; image features are added to some blocks' inputs only with images)
    "hunyuan_vl_text": replace(LLAMA, family="HunyuanOCR text decoder (Hunyuan's: pre-RMSNorm, RMSNorm on q "
                               "and k after the rotary embedding; multimodal rotary)", **HUNYUAN_QK),
    "molmo2_text": replace(LLAMA, family="Molmo2 text decoder (pre-RMSNorm, or RMSNorm on each write "
                           "(norm_after); RMSNorm on each head's, or all heads', q and k)", qk_norms=QK_NORMS,
                           placement=lambda cfg: "sandwich" if cfg.norm_after else "pre",
                           block_norms=_molmo2_norms),
    "granite4_vision_text": _granite_text("Granite 4 Vision"),
    # Granite Docling's (its DeepStack image features are added to early blocks' outputs only with images);
    # PaddleOCR-VL's (ERNIE 4.5's blocks, biases everywhere where use_bias; multimodal rotary, one position on
    # every axis on text alone); Cosmos3 Edge's (Llama's attention, a relu² MLP fc1 → fc2 without a gate;
    # Qwen3-VL's interleaved multimodal rotary, likewise plain on text alone)
    "granite_docling_text": _granite_text("Granite Docling"),
    "paddleocr_vl_text": replace(LLAMA, family="PaddleOCR-VL text decoder (ERNIE 4.5's: pre-RMSNorm, biases "
                                 "where use_bias; multimodal rotary)"),
    "cosmos3_edge_text": replace(LLAMA, family="Cosmos3 Edge text decoder (pre-RMSNorm, relu² MLP without a "
                                 "gate; multimodal rotary)", mlp_in="mlp.fc1", mlp_gate=None,
                                 mlp_down="mlp.fc2"),
    # XGLM: BioGPT's fairseq blocks (the MLP's projections in the block itself); its sinusoidal positions
    # are embed_positions' output, and embed_tokens scales the token embeddings itself (scale_embedding)
    "xglm": ArchSpec(
        family="XGLM decoder (pre-LayerNorm, sinusoidal positions, scaled embeddings)", layers="layers",
        embeds={"embed": "embed_tokens", "pos_embed": "embed_positions"}, final_norm="layer_norm",
        block_norms={"ln_attn_in": "self_attn_layer_norm", "ln_mlp_in": "final_layer_norm"},
        attn_out="self_attn.out_proj", mlp_out="fc2", mlp_in="fc1", mlp_gate=None, mlp_down="fc2",
        refuse=flag("add_cross_attention", CROSS)),
    # Persimmon: GPT-NeoX's fused [h: q k v] projection in a sequential pre-LayerNorm block, partial rotary
    "persimmon": ArchSpec(
        family="Persimmon decoder (pre-LayerNorm, partial rotary, LayerNorm on each head's q and k where "
        "configured)",
        layers="layers", embeds={"embed": "embed_tokens"}, final_norm="final_layernorm",
        block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "post_attention_layernorm"},
        attn_out="self_attn.dense", mlp_out="mlp", qkv=("self_attn.query_key_value",), qkv_layout="per_head",
        mlp_in="mlp.dense_h_to_4h", mlp_gate=None, mlp_down="mlp.dense_4h_to_h", maps_caveat=qk_layernorms),
    # (MetaCLIP 2's, CLIPSeg's and X-CLIP's text encoders are CLIP's; SigLIP 2's is SigLIP's)
    **dict.fromkeys(("clip_text_model", "metaclip_2_text_model", "clipseg_text_model", "xclip_text_model"),
                    CLIP_TEXT),
    **dict.fromkeys(("siglip_text_model", "siglip2_text_model"), SIGLIP_TEXT),
}
# model_type → the text model's path under the base model (``families.CONTAINERS``)
RECENT_CONTAINERS: dict[str, str] = {**dict.fromkeys((
    "gemma4", "qwen3_vl_moe", "glm4v", "glm4v_moe", "glm46v", "aria", "ernie4_5_vl_moe", "hunyuan_vl",
    "molmo2", "granite4_vision", "gemma4_unified", "paddleocr_vl", "glm_ocr", "video_llava", "qianfan_ocr",
    "video_llama_3", "deepseek_vl", "hyperclovax_vision_v2", "janus", "cosmos3_edge"), "language_model"),
    **dict.fromkeys(("idefics2", "granite_docling"), "text_model")}
# containers whose own head multiplies the logits as their text row says (``families.CONTAINERS``: most
# multiply them by nothing); Granite 4 Vision's and Granite Docling's divide them by their text config's
# logits_scaling, HyperCLOVA X Vision V2's multiplies them by it (HyperCLOVA X's own head's)
SCALING_HEADS: frozenset[str] = frozenset({"granite4_vision", "granite_docling", "hyperclovax_vision_v2"})
