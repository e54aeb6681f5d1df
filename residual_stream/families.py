"""The table of supported model families: each one ``ArchSpec`` row of *data*.

A row says where the layers, embeddings, norms, the attention output projection (whose
input is the per-head ``z``) and the MLP write live, relative to the framework's base model,
how blocks place their norms, and which config options it does not describe (``refuse``).
``architectures.describe`` turns a live model into an ``Anatomy`` from its row; a
``model_type`` missing here is refused with ``UnsupportedArchitectureError``.
"""

from __future__ import annotations

from dataclasses import replace

from .arch_spec import ArchSpec
from .encoder_families import CROSS, ENCODERS
from .family_rules import (
    any_of,
    clipped,
    dense_layer_types,
    falcon_norms,
    flag,
    llama4_queries,
    opt_norms,
    qwen_moe_widths,
    routing_of,
    with_dense,
)

_LLAMA = ArchSpec(
    family="Llama-style decoder (pre-RMSNorm, rotary)",
    layers="layers", embeds={"embed": "embed_tokens"}, final_norm="norm",
    block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "post_attention_layernorm"},
    attn_out="self_attn.o_proj", mlp_out="mlp",
)
_GEMMA = ArchSpec(
    family="Gemma 2/3 decoder (sandwich RMSNorm with (1+γ), scaled embeddings)",
    layers="layers", embeds={"embed": "embed_tokens"}, final_norm="norm", placement="sandwich",
    block_norms={"ln_attn_in": "input_layernorm", "ln_attn_out": "post_attention_layernorm",
                 "ln_mlp_in": "pre_feedforward_layernorm", "ln_mlp_out": "post_feedforward_layernorm"},
    attn_out="self_attn.o_proj", mlp_out="mlp", weight_offset=1.0,
)
_QK_NORMS = ("self_attn.q_norm", "self_attn.k_norm")
_APERTUS = replace(
    _LLAMA, family="Apertus decoder (pre-RMSNorm, RMSNorm on q and k, MLP without a gate)", mlp_gate=None,
    block_norms={"ln_attn_in": "attention_layernorm", "ln_mlp_in": "feedforward_layernorm"},
    qk_norms=_QK_NORMS)


_QK_LAYERNORMS = "LayerNorms on each head's queries and keys (qk_layernorm)"
_OLMO2 = ArchSpec(
    family="OLMo 2 decoder (RMSNorm on each write, none on the read)",
    layers="layers", embeds={"embed": "embed_tokens"}, final_norm="norm", placement="sandwich",
    block_norms={"ln_attn_out": "post_attention_layernorm", "ln_mlp_out": "post_feedforward_layernorm"},
    attn_out="self_attn.o_proj", mlp_out="mlp", qk_norms=_QK_NORMS,
)
_PARALLEL_ONE_NORM = "parallel attention and MLP reading one LayerNorm"
_COHERE = replace(
    _LLAMA, family=f"Cohere / Command-R decoder ({_PARALLEL_ONE_NORM} without a bias, scaled logits)",
    placement="parallel", block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "input_layernorm"},
    refuse=flag("use_qk_norm", "LayerNorms on each head's queries and keys (use_qk_norm)"),
    logit_scale=lambda cfg: cfg.logit_scale)
_GATE_UP = dict(mlp_in="mlp.gate_up_proj", mlp_gate="mlp.gate_up_proj", mlp_layout="gate_up")


_MOE_MAPS = dict(routing=routing_of())  # the MLP paths name a dense block's (GLM-4-MoE's first)
_MOE = replace(_LLAMA, family="Mixtral decoder (pre-RMSNorm, mixture-of-experts MLPs)",
               d_mlp_keys=("intermediate_size",), **_MOE_MAPS)
# multi-head latent attention: queries, keys and values through low-rank maps with an RMSNorm
# between; the modules reading the stream are the row's qkv, and there are no linear W_Q/W_K/W_V
_DEEPSEEK = replace(
    _MOE, family="DeepSeek-V3 decoder (pre-RMSNorm, multi-head latent attention, mixture-of-experts MLPs "
    "with shared experts after the first dense ones)", qkv_layout="latent",
    qkv=lambda cfg: ("self_attn.q_a_proj" if cfg.q_lora_rank else "self_attn.q_proj",
                     "self_attn.kv_a_proj_with_mqa"),
    d_mlp_keys=with_dense("intermediate_size", lambda cfg: cfg.first_k_dense_replace > 0,
                          "moe_intermediate_size", "moe_intermediate_size*n_shared_experts"),
    routing=routing_of(experts="n_routed_experts"))
_GLM4_NORMS = {"ln_attn_in": "input_layernorm", "ln_attn_out": "post_self_attn_layernorm",
               "ln_mlp_in": "post_attention_layernorm", "ln_mlp_out": "post_mlp_layernorm"}
_SHARED_AFTER_DENSE = "mixture-of-experts MLPs with shared experts after the first dense ones"
_GLM4_MOE = replace(_MOE, family=f"GLM-4-MoE decoder (pre-RMSNorm, partial rotary, {_SHARED_AFTER_DENSE})",
                    qk_norms=_QK_NORMS,
                    d_mlp_keys=("intermediate_size", "moe_intermediate_size",
                                "moe_intermediate_size*n_shared_experts"),
                    routing=routing_of(experts="n_routed_experts"))


# Hunyuan's q/k norms follow the rotary embedding. An RMS is the same either side of it, so
# their gains folded before it give the position-free bilinear forms composition scores
# exactly; but a gain does not commute with the rotation (unless equal on both halves of each
# pair), so a piece's share of a query or key is the model's at position 0 only (helper 43)
_HUNYUAN_QK = dict(qk_norms=("self_attn.query_layernorm", "self_attn.key_layernorm"), maps_caveat=lambda _: (
    "its RMSNorms on queries and keys come after the rotary embedding, and their gains do not commute with "
    "it: composition's position-free scores are exact, but read attribution of queries and keys takes each "
    "piece's share before the rotary embedding, which is the model's own at position 0 only"))
_GPTJ = ArchSpec(
    family=f"GPT-J decoder ({_PARALLEL_ONE_NORM}, rotary)",
    layers="h", embeds={"embed": "wte"}, final_norm="ln_f", placement="parallel",
    block_norms={"ln_attn_in": "ln_1", "ln_mlp_in": "ln_1"},
    attn_out="attn.out_proj", mlp_out="mlp", n_ctx_keys=("n_positions",),
    qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"), mlp_in="mlp.fc_in", mlp_gate=None,
    mlp_down="mlp.fc_out",
)
_GRANITE = replace(
    _LLAMA, family="Granite decoder (pre-RMSNorm; embedding, write and logit multipliers)",
    multipliers=lambda cfg: {"ln_embed": cfg.embedding_multiplier, "ln_attn_out": cfg.residual_multiplier,
                             "ln_mlp_out": cfg.residual_multiplier},
    logit_scale=lambda cfg: 1.0 / cfg.logits_scaling)
_GRANITE_MOE = replace(_GRANITE, family="Granite MoE decoder (pre-RMSNorm, mixture-of-experts MLPs; "
                       "embedding, write and logit multipliers)", mlp_out="block_sparse_moe",
                       d_mlp_keys=("intermediate_size",), **_MOE_MAPS,
                       refuse=flag("shared_intermediate_size", "a shared MLP beside the experts (its "
                                   "output and theirs are summed into one write by the block)"))
_PERI = {"ln_attn_out": "post_norm1", "ln_mlp_out": "post_norm2"}
_PERI_SCALED = ("a residual_multiplier other than 1 after the RMSNorm on each write (use_post_norm): a norm "
                "and then a constant on one write")
ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": _LLAMA, "mistral": _LLAMA, "qwen2": _LLAMA,
    "helium": _LLAMA, "ernie4_5": _LLAMA, "seed_oss": _LLAMA, "ministral": _LLAMA,
    # InternLM3, IQuest-Coder and EXAONE 3 are configs of Llama's own classes; CWM, Llama's with
    # sliding windows in 3 layers of 4
    "internlm3": _LLAMA, "iquestcoder": _LLAMA, "exaone": _LLAMA, "cwm": _LLAMA,
    "nanochat": replace(  # one parameterless RMSNorm module, run on the embeddings and on the final stream
        _LLAMA, family="nanochat decoder (pre-RMSNorm without gains, also on the embeddings, RMSNorm on q "
        "and k after the rotary embedding, relu² MLP without a gate, soft-capped logits)", embed_norm="norm",
        mlp_in="mlp.fc1", mlp_gate=None, mlp_down="mlp.fc2"),
    "arcee": replace(_LLAMA, family="Arcee decoder (pre-RMSNorm, rotary, MLP without a gate)", mlp_gate=None),
    "nemotron": replace(_LLAMA, family="Nemotron decoder (pre-LayerNorm with (1+γ), partial rotary, MLP "
                        "without a gate)", weight_offset=1.0, mlp_gate=None),
    "apertus": _APERTUS,
    # Apertus 1.5's text model: Apertus's, its unembedding maybe pruned to the text tokens' rows
    "apertus1p5_text": replace(_APERTUS, family=_APERTUS.family.replace("Apertus", "Apertus 1.5")),
    "ministral3": replace(_LLAMA, family="Ministral 3 decoder (pre-RMSNorm, rotary, queries scaled by "
                          "position beyond the original context)", maps_caveat=llama4_queries),
    "jais2": replace(_LLAMA, family="Jais 2 decoder (pre-LayerNorm, rotary, MLP without a gate)",
                     mlp_gate=None),
    "vaultgemma": replace(_LLAMA, family="VaultGemma decoder (pre-RMSNorm with (1+γ), scaled embeddings)",
                          weight_offset=1.0, block_norms={"ln_attn_in": "input_layernorm",
                                                          "ln_mlp_in": "pre_feedforward_layernorm"}),
    "smollm3": replace(_LLAMA, family="SmolLM3 decoder (pre-RMSNorm, rotary in 3 layers of 4)"),
    "gemma": replace(_LLAMA, family="Gemma decoder (pre-RMSNorm with (1+γ), scaled embeddings)",
                     weight_offset=1.0),
    "qwen3": replace(_LLAMA, family="Qwen3 decoder (pre-RMSNorm, rotary, RMSNorm on q and k)",
                     qk_norms=_QK_NORMS),
    # the text models of Qwen2.5-VL and Qwen3-VL: Qwen2's and Qwen3's blocks; their multimodal rotary
    # gives text alone the same position on each axis, so plain rotary (Qwen3-VL's visual features,
    # added to early blocks' streams, come only with images)
    "qwen2_5_vl_text": replace(_LLAMA, family="Qwen2.5-VL text decoder (Qwen2's: pre-RMSNorm, biases on q, k "
                               "and v; multimodal rotary)"),
    "qwen3_vl_text": replace(_LLAMA, family="Qwen3-VL text decoder (Qwen3's: pre-RMSNorm, RMSNorm on q and "
                             "k; multimodal rotary)", qk_norms=_QK_NORMS),
    "hunyuan_v1_dense": replace(_LLAMA, family="Hunyuan decoder (pre-RMSNorm, rotary, RMSNorm on q and k "
                                "after the rotary embedding)", **_HUNYUAN_QK),
    "phi3": replace(_LLAMA, family="Phi-3 decoder (pre-RMSNorm, fused q/k/v and gate/up projections)",
                    qkv=("self_attn.qkv_proj",), qkv_layout="blocks", **_GATE_UP),
    "glm": replace(_LLAMA, family="GLM decoder (pre-RMSNorm, partial rotary, fused gate/up projection)",
                   **_GATE_UP),
    "glm4": replace(_GEMMA, family="GLM-4 decoder (sandwich RMSNorm, partial rotary, fused gate/up "
                    "projection)", weight_offset=0.0, **_GATE_UP, block_norms=_GLM4_NORMS),
    "olmo": replace(_LLAMA, family="OLMo decoder (pre-LayerNorm without parameters, rotary)", norm_eps=1e-5,
                    maps_caveat=clipped),
    "mixtral": _MOE,
    "qwen2_moe": replace(_MOE, family="Qwen2-MoE decoder (pre-RMSNorm, mixture-of-experts MLPs "
                         "with a shared expert)",
                         d_mlp_keys=qwen_moe_widths("moe_intermediate_size",
                                                    "shared_expert_intermediate_size"),
                         routing=routing_of(experts="num_experts")),
    "qwen3_moe": replace(_MOE, family="Qwen3-MoE decoder (pre-RMSNorm, mixture-of-experts MLPs, "
                         "RMSNorm on q and k)", qk_norms=_QK_NORMS,
                         d_mlp_keys=qwen_moe_widths("moe_intermediate_size"),
                         routing=routing_of(experts="num_experts")),
    "hunyuan_v1_moe": replace(_MOE, family="Hunyuan MoE decoder (pre-RMSNorm, RMSNorm on q and k after the "
                              "rotary embedding, mixture-of-experts MLPs with a shared MLP)", **_HUNYUAN_QK),
    "olmoe": replace(_MOE, family="OLMoE decoder (pre-RMSNorm, mixture-of-experts MLPs, RMSNorm "
                     "on q and k)", qk_norms=_QK_NORMS, routing=routing_of(experts="num_experts"),
                     maps_caveat=clipped),
    "glm4_moe": _GLM4_MOE,
    "sarvam_moe": replace(_GLM4_MOE, family="Sarvam MoE decoder (GLM-4-MoE's: pre-RMSNorm, RMSNorm on q and "
                          f"k, {_SHARED_AFTER_DENSE})"),
    "dots1": replace(_MOE, family=f"dots.llm1 decoder (pre-RMSNorm, RMSNorm on q and k, "
                     f"{_SHARED_AFTER_DENSE})", qk_norms=_QK_NORMS,
                     d_mlp_keys=with_dense("intermediate_size", lambda cfg: cfg.first_k_dense_replace > 0,
                                           "moe_intermediate_size", "moe_intermediate_size*n_shared_experts"),
                     routing=routing_of(experts="n_routed_experts")),
    "hy_v3": replace(_MOE, family=f"Hy3 decoder (pre-RMSNorm, RMSNorm on q and k, {_SHARED_AFTER_DENSE})",
                     qk_norms=_QK_NORMS,
                     d_mlp_keys=with_dense("intermediate_size", dense_layer_types, "moe_intermediate_size",
                                           "moe_intermediate_size*num_shared_experts"),
                     routing=routing_of(experts="num_experts")),
    "flint": replace(_MOE, family="Flint decoder (pre-RMSNorm, RMSNorm on q and k, attention sinks, rotary "
                     "in sliding-window layers only, mixture-of-experts MLPs with a shared expert)",
                     qk_norms=_QK_NORMS, routing=routing_of(experts="num_experts"),
                     d_mlp_keys=qwen_moe_widths("moe_intermediate_size", "shared_expert_intermediate_size")),
    "kolibri1": replace(_GEMMA, family="Kolibri decoder (sandwich RMSNorm, RMSNorm on q and k, rotary in "
                        "sliding-window layers only, mixture-of-experts MLPs with a shared expert)",
                        weight_offset=0.0, block_norms=_GLM4_NORMS, qk_norms=_QK_NORMS,
                        routing=routing_of(experts="num_experts"),
                        d_mlp_keys=("moe_intermediate_size", "shared_expert_intermediate_size")),
    "deepseek_v3": _DEEPSEEK,
    "deepseek_v2": replace(_DEEPSEEK, family=_DEEPSEEK.family.replace("V3", "V2")),
    "flex_olmo": replace(_OLMO2, family="FlexOlmo decoder (RMSNorm on each write, none on the read; RMSNorm "
                         "on q and k; mixture-of-experts MLPs)", d_mlp_keys=("intermediate_size",),
                         routing=routing_of(experts="num_experts")),
    "ernie4_5_moe": replace(_MOE, family="ERNIE 4.5 MoE decoder (pre-RMSNorm, mixture-of-experts MLPs with "
                            "shared experts after the first dense ones)",
                            d_mlp_keys=("intermediate_size", "moe_intermediate_size",
                                        "moe_intermediate_size*moe_num_shared_experts"),
                            routing=routing_of("moe_k", "moe_num_experts")),
    "exaone_moe": replace(_MOE, family="EXAONE MoE decoder (pre-RMSNorm, RMSNorm on q and k, "
                          "mixture-of-experts MLPs with a shared expert after the first dense ones)",
                          qk_norms=_QK_NORMS, d_mlp_keys=("intermediate_size", "moe_intermediate_size",
                                                          "moe_intermediate_size*num_shared_experts"),
                          routing=routing_of(experts="num_experts")),
    "solar_open": replace(_MOE, family="Solar Open decoder (pre-RMSNorm, mixture-of-experts MLPs with a "
                          "shared expert)", d_mlp_keys=("moe_intermediate_size",
                                                        "moe_intermediate_size*n_shared_experts"),
                          routing=routing_of(experts="n_routed_experts")),
    "mellum": replace(_MOE, family="Mellum decoder (pre-RMSNorm, RMSNorm on q and k, sliding windows, "
                      "mixture-of-experts MLPs, dense ones where configured)", qk_norms=_QK_NORMS,
                      d_mlp_keys=lambda cfg: ("moe_intermediate_size", *(
                          ("intermediate_size",) if "dense" in cfg.mlp_layer_types else ())),
                      routing=routing_of(experts="num_experts")),
    "phimoe": replace(_MOE, family="PhiMoE decoder (pre-LayerNorm, mixture-of-experts MLPs)"),
    "gpt_oss": replace(_MOE, family="gpt-oss decoder (pre-RMSNorm, mixture-of-experts MLPs, "
                       "attention sinks)"),
    "granite": _GRANITE,
    # HyperCLOVA X: Granite's block with, by default, an RMSNorm on each write before its multiplier
    "hyperclovax": replace(
        _GRANITE, family="HyperCLOVA X decoder (pre-RMSNorm, RMSNorm on each write where use_post_norm; "
        "embedding, write and logit multipliers)",
        placement=lambda cfg: "sandwich" if cfg.use_post_norm else "pre",
        block_norms=lambda cfg: {**_LLAMA.block_norms, **(_PERI if cfg.use_post_norm else {})},
        multipliers=lambda cfg: {"ln_embed": cfg.embedding_multiplier} if cfg.use_post_norm else
        _GRANITE.multipliers(cfg), logit_scale=lambda cfg: cfg.logits_scaling,  # a multiplier, not a divisor
        refuse=lambda cfg: _PERI_SCALED if cfg.use_post_norm and cfg.residual_multiplier != 1 else None),
    "granite_swa": replace(_GRANITE, family="Granite SWA decoder (pre-RMSNorm, sliding windows, "
                           "attention sinks; embedding, write and logit multipliers)",
                           sinks_after_softmax=True),
    "granitemoe": _GRANITE_MOE,
    "granitemoe_swa": replace(_GRANITE_MOE, family="Granite MoE SWA decoder (pre-RMSNorm, "
                              "mixture-of-experts MLPs, sliding windows, attention sinks; embedding, "
                              "write and logit multipliers)", sinks_after_softmax=True),
    "gemma2": _GEMMA,
    "gemma3_text": replace(_GEMMA, family="Gemma 3 decoder (sandwich RMSNorm with (1+γ), scaled "
                           "embeddings, RMSNorm on q and k; bidirectional where configured, EmbeddingGemma)",
                           qk_norms=_QK_NORMS, causal=lambda cfg: not cfg.use_bidirectional_attention),
    "olmo2": _OLMO2,
    "exaone4": replace(_OLMO2, family="EXAONE 4 decoder (RMSNorm on each write, none on the read; RMSNorm "
                       "on q and k)"),
    "olmo3": replace(_OLMO2, family="OLMo 3 decoder (RMSNorm on each write, none on the read)"),
    "gpt2": ArchSpec(
        family="GPT-2 decoder (pre-LayerNorm, learned positions)",
        layers="h", embeds={"embed": "wte", "pos_embed": "wpe"}, final_norm="ln_f",
        block_norms={"ln_attn_in": "ln_1", "ln_mlp_in": "ln_2"},
        attn_out="attn.c_proj", mlp_out="mlp", n_ctx_keys=("n_positions",),
        qkv=("attn.c_attn",), qkv_layout="blocks", mlp_in="mlp.c_fc", mlp_gate=None,
        mlp_down="mlp.c_proj", refuse=flag("add_cross_attention", CROSS),
    ),
    "openai-gpt": ArchSpec(
        family="GPT-1 decoder (post-LayerNorm, learned positions, no final norm)",
        layers="h", embeds={"embed": "tokens_embed", "pos_embed": "positions_embed"}, placement="post",
        block_norms={"ln_resid_attn": "ln_1", "ln_resid_mlp": "ln_2"}, attn_out="attn.c_proj", mlp_out="mlp",
        n_ctx_keys=("n_positions",), qkv=("attn.c_attn",), qkv_layout="blocks", mlp_in="mlp.c_fc",
        mlp_gate=None, mlp_down="mlp.c_proj",
    ),
    # OPT runs its MLP and that norm on tokens flattened to [batch·pos, d] (hooks see them
    # as [batch, pos, d]: hookio.by_token); 350m's embeddings are 512 wide, projected in and out
    "opt": ArchSpec(
        family="OPT decoder (pre-LayerNorm, learned positions; 350m: post-LayerNorm, embeddings "
               "projected into the stream and out of it)",
        layers="decoder.layers", embeds=lambda cfg: {"embed": "decoder.project_in" if (
            cfg.word_embed_proj_dim != cfg.hidden_size) else "decoder.embed_tokens",
            "pos_embed": "decoder.embed_positions"},
        final_norm="decoder.final_layer_norm", unembed_in="decoder.project_out",
        placement=lambda cfg: "pre" if cfg.do_layer_norm_before else "post", block_norms=opt_norms,
        attn_out="self_attn.out_proj", mlp_out="fc2", mlp_in="fc1", mlp_gate=None, mlp_down="fc2",
    ),
    "biogpt": ArchSpec(  # fairseq's decoder layer: the MLP's projections sit in the block itself
        family="BioGPT decoder (pre-LayerNorm, learned positions, scaled embeddings)", layers="layers",
        embeds={"embed": "embed_tokens", "pos_embed": "embed_positions"}, final_norm="layer_norm",
        block_norms={"ln_attn_in": "self_attn_layer_norm", "ln_mlp_in": "final_layer_norm"},
        attn_out="self_attn.out_proj", mlp_out="fc2", mlp_in="fc1", mlp_gate=None, mlp_down="fc2",
    ),
    "gpt_bigcode": ArchSpec(
        family="GPTBigCode / StarCoder decoder (pre-LayerNorm, learned positions, one key/value head)",
        layers="h", embeds={"embed": "wte", "pos_embed": "wpe"}, final_norm="ln_f",
        block_norms={"ln_attn_in": "ln_1", "ln_mlp_in": "ln_2"},
        attn_out="attn.c_proj", mlp_out="mlp", n_ctx_keys=("n_positions",), qkv=("attn.c_attn",),
        # one key/value head: [q | k | v]; a head of each (multi_query=False): [h: q k v]
        qkv_layout=lambda cfg: "blocks" if cfg.multi_query else "per_head", mlp_in="mlp.c_fc", mlp_gate=None,
        mlp_down="mlp.c_proj", refuse=flag("add_cross_attention", CROSS),
    ),
    "falcon": ArchSpec(
        family="Falcon decoder (parallel attention and MLP reading one or two LayerNorms; sequential "
               "where configured; rotary or ALiBi)",
        layers="h", embeds={"embed": "word_embeddings"}, final_norm="ln_f",
        placement=lambda cfg: "parallel" if cfg.parallel_attn else "pre", block_norms=falcon_norms,
        attn_out="self_attention.dense", mlp_out="mlp", qkv=("self_attention.query_key_value",),
        qkv_layout=lambda cfg: "groups" if cfg.new_decoder_architecture else
        "blocks" if cfg.multi_query else "per_head",
        n_kv_heads=lambda cfg: cfg.num_kv_heads if cfg.new_decoder_architecture or not cfg.multi_query else 1,
        mlp_in="mlp.dense_h_to_4h", mlp_gate=None, mlp_down="mlp.dense_4h_to_h", mlp_out_in_place=True,
        patterns_refused=flag("alibi", "transformers' eager attention for Falcon with ALiBi adds the bias "
                              "twice (its default attention adds it once), so its attention weights "
                              "are not this model's"),
        refuse=lambda cfg: "the new decoder with sequential blocks (new_decoder_architecture without "
        "parallel_attn), which transformers builds without its LayerNorms" if (
            cfg.new_decoder_architecture and not cfg.parallel_attn) else None,
    ),
    "gpt_neo": ArchSpec(
        family="GPT-Neo decoder (pre-LayerNorm, learned positions, local attention in alternate layers)",
        layers="h", embeds={"embed": "wte", "pos_embed": "wpe"}, final_norm="ln_f",
        block_norms={"ln_attn_in": "ln_1", "ln_mlp_in": "ln_2"}, attn_out="attn.attention.out_proj",
        mlp_out="mlp", qkv=("attn.attention.q_proj", "attn.attention.k_proj", "attn.attention.v_proj"),
        mlp_in="mlp.c_fc", mlp_gate=None, mlp_down="mlp.c_proj",
    ),
    # BLOOM's and MPT's MLP modules add the residual themselves: the write is their down
    # projection's output (and BLOOM's attention's is its dense projection's)
    "bloom": ArchSpec(
        family="BLOOM decoder (pre-LayerNorm, LayerNorm on the embeddings, ALiBi)",
        layers="h", embeds={"embed": "word_embeddings"}, embed_norm="word_embeddings_layernorm",
        final_norm="ln_f", block_norms=_LLAMA.block_norms,
        attn_out="self_attention.dense", mlp_out="mlp.dense_4h_to_h", qkv=("self_attention.query_key_value",),
        qkv_layout="per_head", mlp_in="mlp.dense_h_to_4h", mlp_gate=None, mlp_down="mlp.dense_4h_to_h",
        refuse=any_of(flag("apply_residual_connection_post_layernorm", "the residual taken after each "
                           "block's LayerNorm (apply_residual_connection_post_layernorm)"),
                      lambda cfg: "projections computed in slices outside their modules (slow_but_exact "
                      "with pretraining_tp > 1)" if cfg.slow_but_exact and cfg.pretraining_tp > 1 else None),
    ),
    "mpt": ArchSpec(
        family="MPT decoder (pre-LayerNorm without biases, ALiBi)",
        layers="blocks", embeds={"embed": "wte"}, final_norm="norm_f",
        block_norms={"ln_attn_in": "norm_1", "ln_mlp_in": "norm_2"}, attn_out="attn.out_proj",
        mlp_out="ffn.down_proj", n_ctx_keys=("max_seq_len",), qkv=("attn.Wqkv",), qkv_layout="blocks",
        mlp_in="ffn.up_proj", mlp_gate=None, mlp_down="ffn.down_proj", maps_caveat=clipped,
    ),
    "dbrx": replace(  # its blocks' maps are nested: norm_attn_norm holds both norms and the attention
        _MOE, family="DBRX decoder (pre-LayerNorm without biases, fused q/k/v, mixture-of-experts MLPs)",
        layers="blocks", embeds={"embed": "wte"}, final_norm="norm_f", n_ctx_keys=("max_seq_len",),
        block_norms={"ln_attn_in": "norm_attn_norm.norm_1", "ln_mlp_in": "norm_attn_norm.norm_2"},
        attn_out="norm_attn_norm.attn.out_proj", mlp_out="ffn", qkv=("norm_attn_norm.attn.Wqkv",),
        qkv_layout="blocks", n_kv_heads=lambda cfg: cfg.attn_config.kv_n_heads, maps_caveat=clipped,
        d_mlp_keys=("ffn_config.ffn_hidden_size",),
        routing=routing_of("ffn_config.moe_top_k", "ffn_config.moe_num_experts")),
    "starcoder2": replace(_LLAMA, family="StarCoder2 decoder (pre-LayerNorm, rotary)",
                          mlp_in="mlp.c_fc", mlp_gate=None, mlp_down="mlp.c_proj"),
    "stablelm": replace(
        _LLAMA, family="StableLM decoder (pre-LayerNorm, rotary; parallel where configured)",
        placement=lambda cfg: "parallel" if cfg.use_parallel_residual else "pre",
        block_norms=lambda cfg: {"ln_attn_in": "input_layernorm", "ln_mlp_in": (
            "input_layernorm" if cfg.use_parallel_residual else "post_attention_layernorm")},
        refuse=flag("qk_layernorm", _QK_LAYERNORMS),
    ),
    "gpt_neox": ArchSpec(
        family="GPT-NeoX / Pythia decoder (parallel attention and MLP, LayerNorm)",
        layers="layers", embeds={"embed": "embed_in"}, final_norm="final_layer_norm",
        block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "post_attention_layernorm"},
        attn_out="attention.dense", mlp_out="mlp",
        placement=lambda cfg: "parallel" if cfg.use_parallel_residual else "pre",
        qkv=("attention.query_key_value",), qkv_layout="per_head", mlp_in="mlp.dense_h_to_4h",
        mlp_gate=None, mlp_down="mlp.dense_4h_to_h",
    ),
    "gptj": _GPTJ,
    "codegen": replace(_GPTJ, family=f"CodeGen decoder ({_PARALLEL_ONE_NORM}, partial rotary, fused q/v/k "
                       "projection in 4 shards)", qkv=("attn.qkv_proj",), qkv_layout="shards4"),
    "phi": ArchSpec(
        family=f"Phi-1/2 decoder ({_PARALLEL_ONE_NORM}, partial rotary)",
        layers="layers", embeds={"embed": "embed_tokens"}, final_norm="final_layernorm",
        placement="parallel", block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "input_layernorm"},
        attn_out="self_attn.dense", mlp_out="mlp", mlp_in="mlp.fc1", mlp_gate=None, mlp_down="mlp.fc2",
        refuse=flag("qk_layernorm", _QK_LAYERNORMS),
    ),
    "cohere": _COHERE, "cohere2": replace(_COHERE, family=_COHERE.family.replace("Cohere", "Cohere 2")),
    "cohere2_moe": replace(
        _COHERE, family=f"Cohere 2 MoE decoder ({_PARALLEL_ONE_NORM} or RMSNorm, mixture-of-experts MLPs "
        "with shared experts after dense ones, scaled logits)", routing=routing_of(experts="num_experts"),
        d_mlp_keys=with_dense("prefix_dense_intermediate_size", dense_layer_types, "intermediate_size",
                              "intermediate_size*num_shared_experts")),
    "rs-twin": ArchSpec(
        family="residual-stream twin (any norm, any placement)",
        layers="blocks", embeds={"embed": "embed", "pos_embed": "pos_embed"},
        final_norm="ln_final",
        block_norms={r: r for r in ("ln_attn_in", "ln_mlp_in", "ln_attn_out", "ln_mlp_out",
                                    "ln_resid_attn", "ln_resid_mlp")},
        attn_out="attn.o_proj", mlp_out="mlp", placement=lambda cfg: cfg.placement,
        alpha=lambda cfg: cfg.deepnorm_alpha, n_ctx_keys=("n_ctx",),
        qkv=("attn.q_proj", "attn.k_proj", "attn.v_proj"), mlp_in="mlp.fc_in", mlp_gate="mlp.gate",
        mlp_down="mlp.fc_out",
    ),
    **ENCODERS,
}

# Multimodal containers of a text model (Gemma 3 4B-27B, Mistral Small 3.1, Qwen2.5-VL): model_type → the text
# model's path under the base model. On text-only inputs the container runs that model on them
# alone (its embeddings, blocks and final norm; the container's LM head), so it is described as
# that model, by the row of its own model_type (``config.get_text_config()``); images are no part
# of the stream program
CONTAINERS: dict[str, str] = {"gemma3": "language_model", "mistral3": "language_model",
                              "qwen2_5_vl": "language_model", "qwen3_vl": "language_model"}
