"""The rows the table's families are variants of, and the phrases their descriptions share.

Llama's, Gemma's, OLMo 2's, Mixtral's, DeepSeek's, GPT-J's, Granite's and Cohere's blocks as
data; ``families`` makes each family a ``dataclasses.replace`` of one of these.
"""

from __future__ import annotations

from dataclasses import replace

from .arch_spec import ArchSpec
from .family_rules import dense_layer_types, first_dense, flag, routing_of, with_dense

LLAMA = ArchSpec(
    family="Llama-style decoder (pre-RMSNorm, rotary)",
    layers="layers", embeds={"embed": "embed_tokens"}, final_norm="norm",
    block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "post_attention_layernorm"},
    attn_out="self_attn.o_proj", mlp_out="mlp",
)
GEMMA = ArchSpec(
    family="Gemma 2/3 decoder (sandwich RMSNorm with (1+γ), scaled embeddings)",
    layers="layers", embeds={"embed": "embed_tokens"}, final_norm="norm", placement="sandwich",
    block_norms={"ln_attn_in": "input_layernorm", "ln_attn_out": "post_attention_layernorm",
                 "ln_mlp_in": "pre_feedforward_layernorm", "ln_mlp_out": "post_feedforward_layernorm"},
    attn_out="self_attn.o_proj", mlp_out="mlp", weight_offset=1.0,
)
QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
APERTUS = replace(
    LLAMA, family="Apertus decoder (pre-RMSNorm, RMSNorm on q and k, MLP without a gate)", mlp_gate=None,
    block_norms={"ln_attn_in": "attention_layernorm", "ln_mlp_in": "feedforward_layernorm"},
    qk_norms=QK_NORMS)


OLMO2 = ArchSpec(
    family="OLMo 2 decoder (RMSNorm on each write, none on the read)",
    layers="layers", embeds={"embed": "embed_tokens"}, final_norm="norm", placement="sandwich",
    block_norms={"ln_attn_out": "post_attention_layernorm", "ln_mlp_out": "post_feedforward_layernorm"},
    attn_out="self_attn.o_proj", mlp_out="mlp", qk_norms=QK_NORMS,
)
PARALLEL_ONE_NORM = "parallel attention and MLP reading one LayerNorm"
COHERE = replace(
    LLAMA, family=f"Cohere / Command-R decoder ({PARALLEL_ONE_NORM} without a bias, scaled logits)",
    placement="parallel", block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "input_layernorm"},
    refuse=flag("use_qk_norm", "LayerNorms on each head's queries and keys (use_qk_norm)"),
    logit_scale=lambda cfg: cfg.logit_scale)
GATE_UP = dict(mlp_in="mlp.gate_up_proj", mlp_gate="mlp.gate_up_proj", mlp_layout="gate_up")


MOE_MAPS = dict(routing=routing_of())  # the MLP paths name a dense block's (GLM-4-MoE's first)
MOE = replace(LLAMA, family="Mixtral decoder (pre-RMSNorm, mixture-of-experts MLPs)",
              d_mlp_keys=("intermediate_size",), **MOE_MAPS)
# the widths of one routed expert and of DeepSeek-style shared experts (one MLP, n experts wide)
SHARED_EXPERTS = ("moe_intermediate_size", "moe_intermediate_size*n_shared_experts")
# multi-head latent attention: queries, keys and values through low-rank maps with an RMSNorm
# between; the modules reading the stream are the row's qkv, and there are no linear W_Q/W_K/W_V
DEEPSEEK = replace(
    MOE, family="DeepSeek-V3 decoder (pre-RMSNorm, multi-head latent attention, mixture-of-experts MLPs "
    "with shared experts after the first dense ones)", qkv_layout="latent",
    qkv=lambda cfg: ("self_attn.q_a_proj" if cfg.q_lora_rank else "self_attn.q_proj",
                     "self_attn.kv_a_proj_with_mqa"),
    d_mlp_keys=with_dense("intermediate_size", first_dense, *SHARED_EXPERTS),
    routing=routing_of(experts="n_routed_experts"))
MLA_DENSE = replace(LLAMA, qkv_layout="latent", qkv=DEEPSEEK.qkv)  # latent attention, one dense MLP
MLA_MOE = replace(DEEPSEEK, d_mlp_keys=with_dense(  # dense blocks where mlp_layer_types says
    "intermediate_size", dense_layer_types, *SHARED_EXPERTS))
MLA = "multi-head latent attention"
# DeepSeek-V3.2's reads of the stream: MLA's, and its sparse-attention indexer's own modules
DSA_QKV = ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa", "self_attn.indexer.wk",
           "self_attn.indexer.weights_proj")
GLM4_NORMS = {"ln_attn_in": "input_layernorm", "ln_attn_out": "post_self_attn_layernorm",
              "ln_mlp_in": "post_attention_layernorm", "ln_mlp_out": "post_mlp_layernorm"}
SHARED_AFTER_DENSE = "mixture-of-experts MLPs with shared experts after the first dense ones"
GLM4_MOE = replace(MOE, family=f"GLM-4-MoE decoder (pre-RMSNorm, partial rotary, {SHARED_AFTER_DENSE})",
                   qk_norms=QK_NORMS,
                   d_mlp_keys=("intermediate_size", *SHARED_EXPERTS),
                   routing=routing_of(experts="n_routed_experts"))


# Hunyuan's q/k norms follow the rotary embedding. An RMS is the same either side of it, so
# their gains folded before it give the position-free bilinear forms composition scores
# exactly; but a gain does not commute with the rotation (unless equal on both halves of each
# pair), so a piece's share of a query or key is the model's at position 0 only (helper 43)
HUNYUAN_QK = dict(qk_norms=("self_attn.query_layernorm", "self_attn.key_layernorm"), maps_caveat=lambda _: (
    "its RMSNorms on queries and keys come after the rotary embedding, and their gains do not commute with "
    "it: composition's position-free scores are exact, but read attribution of queries and keys takes each "
    "piece's share before the rotary embedding, which is the model's own at position 0 only"))
GPTJ = ArchSpec(
    family=f"GPT-J decoder ({PARALLEL_ONE_NORM}, rotary)",
    layers="h", embeds={"embed": "wte"}, final_norm="ln_f", placement="parallel",
    block_norms={"ln_attn_in": "ln_1", "ln_mlp_in": "ln_1"},
    attn_out="attn.out_proj", mlp_out="mlp", n_ctx_keys=("n_positions",),
    qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"), mlp_in="mlp.fc_in", mlp_gate=None,
    mlp_down="mlp.fc_out",
)
GRANITE = replace(
    LLAMA, family="Granite decoder (pre-RMSNorm; embedding, write and logit multipliers)",
    multipliers=lambda cfg: {"ln_embed": cfg.embedding_multiplier, "ln_attn_out": cfg.residual_multiplier,
                             "ln_mlp_out": cfg.residual_multiplier},
    logit_scale=lambda cfg: 1.0 / cfg.logits_scaling)
GRANITE_MOE = replace(GRANITE, family="Granite MoE decoder (pre-RMSNorm, mixture-of-experts MLPs; "
                      "embedding, write and logit multipliers)", mlp_out="block_sparse_moe",
                      d_mlp_keys=("intermediate_size",), **MOE_MAPS,
                      refuse=flag("shared_intermediate_size", "a shared MLP beside the experts (its "
                                  "output and theirs are summed into one write by the block)"))
PERI = {"ln_attn_out": "post_norm1", "ln_mlp_out": "post_norm2"}
PERI_SCALED = ("a residual_multiplier other than 1 after the RMSNorm on each write (use_post_norm): a norm "
               "and then a constant on one write")
