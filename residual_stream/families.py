"""The table of supported model families: each one ``ArchSpec`` row of *data*.

A row says where the layers, embeddings, norms, the attention output projection (whose
input is the per-head ``z``) and the MLP write live, relative to the framework's base model,
how blocks place their norms, and which config options it does not describe (``refuse``).
``architectures.describe`` turns a live model into an ``Anatomy`` from its row; a
``model_type`` missing here is refused with ``UnsupportedArchitectureError``.
"""

from __future__ import annotations

import math
from dataclasses import replace

from .arch_spec import ArchSpec
from .encoder_families import CROSS, ENCODERS
from .family_rules import (
    any_of,
    clipped,
    dense_layer_types,
    falcon_norms,
    flag,
    llama4_dense,
    llama4_queries,
    llama4_temperature,
    opt_norms,
    qk_layernorms,
    qwen_moe_widths,
    routing_of,
    with_dense,
)
from .family_templates import (
    APERTUS,
    COHERE,
    DEEPSEEK,
    DSA_QKV,
    GATE_UP,
    GEMMA,
    GLM4_MOE,
    GLM4_NORMS,
    GPTJ,
    GRANITE,
    GRANITE_MOE,
    HUNYUAN_QK,
    LLAMA,
    MLA,
    MLA_DENSE,
    MLA_MOE,
    MOE,
    OLMO2,
    PARALLEL_ONE_NORM,
    PERI,
    PERI_SCALED,
    QK_NORMS,
    SHARED_AFTER_DENSE,
    SHARED_EXPERTS,
)
from .recent_families import RECENT, RECENT_CONTAINERS
from .seq2seq_families import SEQ2SEQ, T5GEMMA2_CONTAINERS
from .tower_families import TEXT_TOWERS, TOWERS, WHOLE_TOWERS

ARCHITECTURES: dict[str, ArchSpec] = {
    "llama": LLAMA, "mistral": LLAMA, "qwen2": LLAMA,
    "helium": LLAMA, "ernie4_5": LLAMA, "seed_oss": LLAMA, "ministral": LLAMA,
    # InternLM3, IQuest-Coder and EXAONE 3 are configs of Llama's own classes; CWM, Llama's with
    # sliding windows in 3 layers of 4
    "internlm3": LLAMA, "iquestcoder": LLAMA, "exaone": LLAMA, "cwm": LLAMA,
    "nanochat": replace(  # one parameterless RMSNorm module, run on the embeddings and on the final stream
        LLAMA, family="nanochat decoder (pre-RMSNorm without gains, also on the embeddings, RMSNorm on q "
        "and k after the rotary embedding, relu² MLP without a gate, soft-capped logits)", embed_norm="norm",
        mlp_in="mlp.fc1", mlp_gate=None, mlp_down="mlp.fc2"),
    "arcee": replace(LLAMA, family="Arcee decoder (pre-RMSNorm, rotary, MLP without a gate)", mlp_gate=None),
    "nemotron": replace(LLAMA, family="Nemotron decoder (pre-LayerNorm with (1+γ), partial rotary, MLP "
                        "without a gate)", weight_offset=1.0, mlp_gate=None),
    "apertus": APERTUS,
    # Apertus 1.5's text model: Apertus's, its unembedding maybe pruned to the text tokens' rows
    "apertus1p5_text": replace(APERTUS, family=APERTUS.family.replace("Apertus", "Apertus 1.5")),
    "ministral3": replace(LLAMA, family="Ministral 3 decoder (pre-RMSNorm, rotary, queries scaled by "
                          "position beyond the original context)", maps_caveat=llama4_queries),
    # Llama 4's text model: the L2 norm on q and k (after the rotary embedding) has no gains; the router's
    # sigmoid scores scale each expert's input, and a shared expert sees every token
    "llama4_text": replace(
        MOE, family="Llama 4 decoder (pre-RMSNorm; rotary, chunked attention and parameterless RMSNorm on q "
        "and k in most blocks, no positions in the rest; mixture-of-experts MLPs with a shared expert, dense "
        "ones between in Maverick)", mlp_out="feed_forward", mlp_in="feed_forward.up_proj",
        mlp_gate="feed_forward.gate_proj", mlp_down="feed_forward.down_proj",
        d_mlp_keys=with_dense("intermediate_size_mlp", llama4_dense, "intermediate_size"),
        maps_caveat=llama4_temperature),
    "jais2": replace(LLAMA, family="Jais 2 decoder (pre-LayerNorm, rotary, MLP without a gate)",
                     mlp_gate=None),
    "vaultgemma": replace(LLAMA, family="VaultGemma decoder (pre-RMSNorm with (1+γ), scaled embeddings)",
                          weight_offset=1.0, block_norms={"ln_attn_in": "input_layernorm",
                                                          "ln_mlp_in": "pre_feedforward_layernorm"}),
    "smollm3": replace(LLAMA, family="SmolLM3 decoder (pre-RMSNorm, rotary in 3 layers of 4)"),
    "gemma": replace(LLAMA, family="Gemma decoder (pre-RMSNorm with (1+γ), scaled embeddings)",
                     weight_offset=1.0),
    "qwen3": replace(LLAMA, family="Qwen3 decoder (pre-RMSNorm, rotary, RMSNorm on q and k)",
                     qk_norms=QK_NORMS),
    # the text models of Qwen2.5-VL and Qwen3-VL: Qwen2's and Qwen3's blocks; their multimodal rotary
    # gives text alone the same position on each axis, so plain rotary (Qwen3-VL's visual features,
    # added to early blocks' streams, come only with images)
    "qwen2_5_vl_text": replace(LLAMA, family="Qwen2.5-VL text decoder (Qwen2's: pre-RMSNorm, biases on q, k "
                               "and v; multimodal rotary)"),
    "qwen2_vl_text": replace(LLAMA, family="Qwen2-VL text decoder (Qwen2's: pre-RMSNorm, biases on q, k and "
                             "v; multimodal rotary)"),
    "qwen3_vl_text": replace(LLAMA, family="Qwen3-VL text decoder (Qwen3's: pre-RMSNorm, RMSNorm on q and "
                             "k; multimodal rotary)", qk_norms=QK_NORMS),
    "hunyuan_v1_dense": replace(LLAMA, family="Hunyuan decoder (pre-RMSNorm, rotary, RMSNorm on q and k "
                                "after the rotary embedding)", **HUNYUAN_QK),
    "phi3": replace(LLAMA, family="Phi-3 decoder (pre-RMSNorm, fused q/k/v and gate/up projections)",
                    qkv=("self_attn.qkv_proj",), qkv_layout="blocks", **GATE_UP),
    "glm": replace(LLAMA, family="GLM decoder (pre-RMSNorm, partial rotary, fused gate/up projection)",
                   **GATE_UP),
    "glm4": replace(GEMMA, family="GLM-4 decoder (sandwich RMSNorm, partial rotary, fused gate/up "
                    "projection)", weight_offset=0.0, **GATE_UP, block_norms=GLM4_NORMS),
    "olmo": replace(LLAMA, family="OLMo decoder (pre-LayerNorm without parameters, rotary)", norm_eps=1e-5,
                    maps_caveat=clipped),
    "mixtral": MOE,
    "qwen2_moe": replace(MOE, family="Qwen2-MoE decoder (pre-RMSNorm, mixture-of-experts MLPs "
                         "with a shared expert)",
                         d_mlp_keys=qwen_moe_widths("moe_intermediate_size",
                                                    "shared_expert_intermediate_size"),
                         routing=routing_of(experts="num_experts")),
    "qwen3_moe": replace(MOE, family="Qwen3-MoE decoder (pre-RMSNorm, mixture-of-experts MLPs, "
                         "RMSNorm on q and k)", qk_norms=QK_NORMS,
                         d_mlp_keys=qwen_moe_widths("moe_intermediate_size"),
                         routing=routing_of(experts="num_experts")),
    "hunyuan_v1_moe": replace(MOE, family="Hunyuan MoE decoder (pre-RMSNorm, RMSNorm on q and k after the "
                              "rotary embedding, mixture-of-experts MLPs with a shared MLP)", **HUNYUAN_QK),
    "olmoe": replace(MOE, family="OLMoE decoder (pre-RMSNorm, mixture-of-experts MLPs, RMSNorm "
                     "on q and k)", qk_norms=QK_NORMS, routing=routing_of(experts="num_experts"),
                     maps_caveat=clipped),
    "glm4_moe": GLM4_MOE,
    "sarvam_moe": replace(GLM4_MOE, family="Sarvam MoE decoder (GLM-4-MoE's: pre-RMSNorm, RMSNorm on q and "
                          f"k, {SHARED_AFTER_DENSE})"),
    "dots1": replace(MOE, family=f"dots.llm1 decoder (pre-RMSNorm, RMSNorm on q and k, "
                     f"{SHARED_AFTER_DENSE})", qk_norms=QK_NORMS,
                     d_mlp_keys=DEEPSEEK.d_mlp_keys,
                     routing=routing_of(experts="n_routed_experts")),
    "hy_v3": replace(MOE, family=f"Hy3 decoder (pre-RMSNorm, RMSNorm on q and k, {SHARED_AFTER_DENSE})",
                     qk_norms=QK_NORMS,
                     d_mlp_keys=with_dense("intermediate_size", dense_layer_types, "moe_intermediate_size",
                                           "moe_intermediate_size*num_shared_experts"),
                     routing=routing_of(experts="num_experts")),
    "flint": replace(MOE, family="Flint decoder (pre-RMSNorm, RMSNorm on q and k, attention sinks, rotary "
                     "in sliding-window layers only, mixture-of-experts MLPs with a shared expert)",
                     qk_norms=QK_NORMS, routing=routing_of(experts="num_experts"),
                     d_mlp_keys=qwen_moe_widths("moe_intermediate_size", "shared_expert_intermediate_size")),
    "kolibri1": replace(GEMMA, family="Kolibri decoder (sandwich RMSNorm, RMSNorm on q and k, rotary in "
                        "sliding-window layers only, mixture-of-experts MLPs with a shared expert)",
                        weight_offset=0.0, block_norms=GLM4_NORMS, qk_norms=QK_NORMS,
                        routing=routing_of(experts="num_experts"),
                        d_mlp_keys=("moe_intermediate_size", "shared_expert_intermediate_size")),
    "deepseek_v3": DEEPSEEK,
    "deepseek_v2": replace(DEEPSEEK, family=DEEPSEEK.family.replace("V3", "V2")),
    # Sarvam's MLA model is DeepSeek-V3's classes with its config
    "sarvam_mla": replace(DEEPSEEK, family=DEEPSEEK.family.replace("DeepSeek-V3", "Sarvam MLA")),
    "glm4_moe_lite": replace(MLA_MOE, family=f"GLM-4-MoE-Lite decoder (pre-RMSNorm, {MLA}, "
                             f"{SHARED_AFTER_DENSE})"),
    # A.X K1: each mixture-of-experts MLP ends in an RMSNorm of its own output, inside its module:
    # the write is that module's output, the norm one more step of the MLP's function
    "axk1": replace(MLA_MOE, family=f"A.X K1 decoder (pre-RMSNorm, {MLA}, {SHARED_AFTER_DENSE}, "
                    "an RMSNorm on each mixture-of-experts MLP's output inside it)"),
    # DeepSeek-V3.2: a sparse-attention indexer in each attention picks the keys each query reads
    # (top index_topk) and masks the rest in the attention mask, eager's too, so its patterns are
    # the model's; the indexer reads the stream through modules of its own, listed with MLA's
    "deepseek_v32": replace(MLA_MOE, family=f"DeepSeek-V3.2 decoder (pre-RMSNorm, {MLA} with "
                            f"keys chosen by a sparse-attention indexer, {SHARED_AFTER_DENSE})",
                            qkv=DSA_QKV),
    "youtu": replace(MLA_DENSE, family=f"Youtu-LLM decoder (pre-RMSNorm, {MLA})"),
    # MiniCPM3: embeddings scaled inside their module; writes by scale_depth / √layers; the
    # final stream divided by hidden_size / dim_model_base before the unembedding (no bias: the
    # logits divided by it)
    "minicpm3": replace(MLA_DENSE, family=f"MiniCPM3 decoder (pre-RMSNorm, {MLA}, scaled embeddings; "
                        "write and logit multipliers)", multipliers=lambda cfg: dict.fromkeys(
                            ("ln_attn_out", "ln_mlp_out"),
                            cfg.scale_depth / math.sqrt(cfg.num_hidden_layers)),
                        logit_scale=lambda cfg: 1.0 / cfg.logits_scaling),
    "flex_olmo": replace(OLMO2, family="FlexOlmo decoder (RMSNorm on each write, none on the read; RMSNorm "
                         "on q and k; mixture-of-experts MLPs)", d_mlp_keys=("intermediate_size",),
                         routing=routing_of(experts="num_experts")),
    "ernie4_5_moe": replace(MOE, family="ERNIE 4.5 MoE decoder (pre-RMSNorm, mixture-of-experts MLPs with "
                            "shared experts after the first dense ones)",
                            d_mlp_keys=("intermediate_size", "moe_intermediate_size",
                                        "moe_intermediate_size*moe_num_shared_experts"),
                            routing=routing_of("moe_k", "moe_num_experts")),
    "exaone_moe": replace(MOE, family="EXAONE MoE decoder (pre-RMSNorm, RMSNorm on q and k, "
                          "mixture-of-experts MLPs with a shared expert after the first dense ones)",
                          qk_norms=QK_NORMS, d_mlp_keys=("intermediate_size", "moe_intermediate_size",
                                                          "moe_intermediate_size*num_shared_experts"),
                          routing=routing_of(experts="num_experts")),
    "solar_open": replace(MOE, family="Solar Open decoder (pre-RMSNorm, mixture-of-experts MLPs with a "
                          "shared expert)", d_mlp_keys=SHARED_EXPERTS,
                          routing=routing_of(experts="n_routed_experts")),
    "mellum": replace(MOE, family="Mellum decoder (pre-RMSNorm, RMSNorm on q and k, sliding windows, "
                      "mixture-of-experts MLPs, dense ones where configured)", qk_norms=QK_NORMS,
                      d_mlp_keys=with_dense("intermediate_size", dense_layer_types, "moe_intermediate_size"),
                      routing=routing_of(experts="num_experts")),
    "phimoe": replace(MOE, family="PhiMoE decoder (pre-LayerNorm, mixture-of-experts MLPs)"),
    "gpt_oss": replace(MOE, family="gpt-oss decoder (pre-RMSNorm, mixture-of-experts MLPs, "
                       "attention sinks)"),
    "granite": GRANITE,
    # HyperCLOVA X: Granite's block with, by default, an RMSNorm on each write before its multiplier
    "hyperclovax": replace(
        GRANITE, family="HyperCLOVA X decoder (pre-RMSNorm, RMSNorm on each write where use_post_norm; "
        "embedding, write and logit multipliers)",
        placement=lambda cfg: "sandwich" if cfg.use_post_norm else "pre",
        block_norms=lambda cfg: {**LLAMA.block_norms, **(PERI if cfg.use_post_norm else {})},
        multipliers=lambda cfg: {"ln_embed": cfg.embedding_multiplier} if cfg.use_post_norm else
        GRANITE.multipliers(cfg), logit_scale=lambda cfg: cfg.logits_scaling,  # a multiplier, not a divisor
        refuse=lambda cfg: PERI_SCALED if cfg.use_post_norm and cfg.residual_multiplier != 1 else None),
    "granite_swa": replace(GRANITE, family="Granite SWA decoder (pre-RMSNorm, sliding windows, "
                           "attention sinks; embedding, write and logit multipliers)",
                           sinks_after_softmax=True),
    "granitemoe": GRANITE_MOE,
    "granitemoe_swa": replace(GRANITE_MOE, family="Granite MoE SWA decoder (pre-RMSNorm, "
                              "mixture-of-experts MLPs, sliding windows, attention sinks; embedding, "
                              "write and logit multipliers)", sinks_after_softmax=True),
    "gemma2": GEMMA,
    "gemma3_text": replace(GEMMA, family="Gemma 3 decoder (sandwich RMSNorm with (1+γ), scaled "
                           "embeddings, RMSNorm on q and k; bidirectional where configured, EmbeddingGemma)",
                           qk_norms=QK_NORMS, causal=lambda cfg: not cfg.use_bidirectional_attention),
    "olmo2": OLMO2,
    "exaone4": replace(OLMO2, family="EXAONE 4 decoder (RMSNorm on each write, none on the read; RMSNorm "
                       "on q and k)"),
    "olmo3": replace(OLMO2, family="OLMo 3 decoder (RMSNorm on each write, none on the read)"),
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
        final_norm="ln_f", block_norms=LLAMA.block_norms,
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
        MOE, family="DBRX decoder (pre-LayerNorm without biases, fused q/k/v, mixture-of-experts MLPs)",
        layers="blocks", embeds={"embed": "wte"}, final_norm="norm_f", n_ctx_keys=("max_seq_len",),
        block_norms={"ln_attn_in": "norm_attn_norm.norm_1", "ln_mlp_in": "norm_attn_norm.norm_2"},
        attn_out="norm_attn_norm.attn.out_proj", mlp_out="ffn", qkv=("norm_attn_norm.attn.Wqkv",),
        qkv_layout="blocks", n_kv_heads=lambda cfg: cfg.attn_config.kv_n_heads, maps_caveat=clipped,
        d_mlp_keys=("ffn_config.ffn_hidden_size",),
        routing=routing_of("ffn_config.moe_top_k", "ffn_config.moe_num_experts")),
    "starcoder2": replace(LLAMA, family="StarCoder2 decoder (pre-LayerNorm, rotary)",
                          mlp_in="mlp.c_fc", mlp_gate=None, mlp_down="mlp.c_proj"),
    "stablelm": replace(
        LLAMA, family="StableLM decoder (pre-LayerNorm, rotary; parallel where configured; LayerNorms on "
        "each head's q and k where configured)",
        placement=lambda cfg: "parallel" if cfg.use_parallel_residual else "pre",
        block_norms=lambda cfg: {"ln_attn_in": "input_layernorm", "ln_mlp_in": (
            "input_layernorm" if cfg.use_parallel_residual else "post_attention_layernorm")},
        maps_caveat=qk_layernorms,
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
    "gptj": GPTJ,
    "codegen": replace(GPTJ, family=f"CodeGen decoder ({PARALLEL_ONE_NORM}, partial rotary, fused q/v/k "
                       "projection in 4 shards)", qkv=("attn.qkv_proj",), qkv_layout="shards4"),
    "phi": ArchSpec(
        family=f"Phi-1/2 decoder ({PARALLEL_ONE_NORM}, partial rotary; LayerNorms on q and k where "
        "configured)",
        layers="layers", embeds={"embed": "embed_tokens"}, final_norm="final_layernorm",
        placement="parallel", block_norms={"ln_attn_in": "input_layernorm", "ln_mlp_in": "input_layernorm"},
        attn_out="self_attn.dense", mlp_out="mlp", mlp_in="mlp.fc1", mlp_gate=None, mlp_down="mlp.fc2",
        maps_caveat=qk_layernorms,
    ),
    "cohere": COHERE, "cohere2": replace(COHERE, family=COHERE.family.replace("Cohere", "Cohere 2")),
    "cohere2_moe": replace(
        COHERE, family=f"Cohere 2 MoE decoder ({PARALLEL_ONE_NORM} or RMSNorm, mixture-of-experts MLPs "
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
    **RECENT,
    **SEQ2SEQ,
    **TOWERS,
}

# Multimodal containers of a text model (Gemma 3 4B-27B, Mistral Small 3.1, Qwen2.5-VL, LLaVA, InternVL,
# SmolVLM, Kimi K2.5, Aya Vision, ...): model_type → the text model's path under the base model. On
# text-only inputs the container runs that model on them alone (its embeddings, blocks and final norm), so
# it is described as that model, by the row of its own model_type (``config.get_text_config()``); images
# are no part of the stream program. Its LM head is the container's own Linear, which multiplies the logits
# by nothing: a text row's logit_scale (Cohere's, Granite's) is a step of that family's own head only,
# and of the heads of the containers in recent_families.SCALING_HEADS
CONTAINERS: dict[str, str] = {
    **dict.fromkeys(("gemma3", "mistral3", "qwen2_vl", "qwen2_5_vl", "qwen3_vl", "llava", "llava_next",
                     "llava_onevision", "llava_next_video", "vipllava", "internvl", "ovis2", "lighton_ocr",
                     "exaone4_5", "kimi_k25", "apertus1p5", "aya_vision", "cohere2_vision"),
                    "language_model"),
    **dict.fromkeys(("smolvlm", "idefics3"), "text_model"), **RECENT_CONTAINERS, **T5GEMMA2_CONTAINERS}
# Multimodal containers whose text model is a whole LM, head included (Llama 4's language_model, a
# Llama4ForCausalLM): on text alone that LM is the model, so rs.load analyses it (the same weights;
# transformers 5.24's Llama4ForConditionalGeneration.forward fails on text alone), and a saved folder
# loads only it (AutoModelForCausalLM: the vision tower stays on disk)
TEXT_LMS: dict[str, str] = {"llama4": "language_model"}
# model_type → the whole text model analysed alone: a container's LM, a contrastive model's text tower
# (``tower_families``)
WHOLE_TEXT_MODELS: dict[str, str] = {**TEXT_LMS, **dict.fromkeys((*TEXT_TOWERS, *WHOLE_TOWERS), "text_model")}
