"""Tiny Hugging Face models built in code (no network), one per supported family."""

from __future__ import annotations

import torch
import transformers as tf

COMMON = dict(vocab_size=257, hidden_size=64, num_hidden_layers=3, num_attention_heads=4)
GRANITE = dict(embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3,
               logits_scaling=2.5, bos_token_id=1, eos_token_id=2)
MINISTRAL3_ROPE = dict(rope_type="yarn", rope_theta=1e6, factor=16.0, beta_fast=32.0, beta_slow=1.0,
                       mscale_all_dim=1.0, mscale=1.0, llama_4_scaling_beta=0.1)  # Ministral 3's
DEEPSEEK = dict(intermediate_size=96, max_position_embeddings=128, num_key_value_heads=4, n_routed_experts=4,
                n_group=1, topk_group=1, num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                first_k_dense_replace=1, kv_lora_rank=16, qk_rope_head_dim=8, qk_nope_head_dim=16,
                v_head_dim=16, initializer_range=0.1)
MISTRAL4_ROPE = dict(MINISTRAL3_ROPE, rope_theta=1e4, factor=16.0, original_max_position_embeddings=8)
TEXT = dict(COMMON, intermediate_size=96, num_key_value_heads=2, max_position_embeddings=128, head_dim=16)
MINICPM3 = dict(scale_emb=3.0, scale_depth=1.4, dim_model_base=16)  # embedding, write and logit multipliers
LLAMA4 = dict(TEXT, intermediate_size=48, intermediate_size_mlp=128, num_local_experts=4,
              no_rope_layer_interval=3, floor_scale=4, attn_scale=0.5, attention_chunk_size=8, pad_token_id=0,
              bos_token_id=1, eos_token_id=2)
MROPE = dict(rope_type="default", rope_theta=1e6, mrope_section=[2, 3, 3])
QWEN3_MOE = dict(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=48)
ARIA = dict(intermediate_size=48, moe_num_experts=4, moe_topk=2, moe_num_shared_experts=2,
            attention_bias=True, mlp_bias=True, pad_token_id=0, bos_token_id=1, eos_token_id=2)
GLM_MROPE = dict(rope_type="default", rope_theta=1e4, mrope_section=[2, 1, 1], partial_rotary_factor=0.5)
GLM_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64,
                  image_size=28)
QWEN_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=64)
MLA = dict(max_position_embeddings=128, num_key_value_heads=4, kv_lora_rank=16, qk_rope_head_dim=8,
           qk_nope_head_dim=16, v_head_dim=16, initializer_range=0.1)  # multi-head latent attention
MLA_MOE = dict(MLA, intermediate_size=96, n_routed_experts=4, n_group=1, topk_group=1, num_experts_per_tok=2,
               moe_intermediate_size=48, n_shared_experts=1, mlp_layer_types=["dense", "sparse", "sparse"])
CLIP = dict(model_type="clip_vision_model", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, image_size=28, patch_size=14)  # a tiny vision tower: 1 block, 2×2 patches
SIGLIP = dict(CLIP, model_type="siglip_vision_model")
QFORMER = dict(model_type="blip_2_qformer", num_hidden_layers=1, intermediate_size=32,
               max_position_embeddings=16)  # Granite 4 Vision's windowed Q-Former projectors
VISION = dict(hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2)
# Gemma 4 31B's attention in small: full attentions (the last block's) with wider heads, one key/value
# head and keys as values (attention_k_eq_v); no per-layer inputs
GEMMA4 = dict(TEXT, layer_types=["sliding_attention", "sliding_attention", "full_attention"],
              sliding_window=4, global_head_dim=32, num_global_key_value_heads=1, attention_k_eq_v=True,
              hidden_size_per_layer_input=0, final_logit_softcapping=30.0, pad_token_id=0, bos_token_id=1,
              eos_token_id=2)
GEMMA4_UNIFIED = {k: v for k, v in GEMMA4.items() if k != "hidden_size_per_layer_input"}
T5 = dict(vocab_size=257, d_model=64, d_kv=16, d_ff=96, num_layers=3, num_decoder_layers=2, num_heads=4,
          relative_attention_num_buckets=8, relative_attention_max_distance=16)
BART = dict(vocab_size=257, d_model=64, encoder_layers=3, decoder_layers=2, encoder_attention_heads=4,
            decoder_attention_heads=4, encoder_ffn_dim=96, decoder_ffn_dim=96, max_position_embeddings=128)
T5GEMMA = dict(TEXT, sliding_window=4, query_pre_attn_scalar=16, hidden_activation="gelu_pytorch_tanh")
T5GEMMA2 = dict(TEXT, sliding_window=4, query_pre_attn_scalar=16,
                layer_types=["sliding_attention", "full_attention", "sliding_attention"])
# T5Gemma 2's encoder: that text model, a one-block vision tower, an end-of-image token in the vocabulary
T5GEMMA2_ENCODER = dict(text_config=T5GEMMA2, vision_config=SIGLIP, mm_tokens_per_image=4,
                        boi_token_index=249, eoi_token_index=250, image_token_index=251)
COHERE2_TEXT = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2, logit_scale=0.25,
                    sliding_window=4)  # logits scaled by its own head only
COHERE2_MOE = dict(pad_token_id=None, bos_token_id=1, eos_token_id=2, logit_scale=0.25, sliding_window=4,
                   num_experts=4, num_experts_per_tok=2, num_shared_experts=1)


def _llama_like(cls_cfg, cls_model, **extra):
    def build():
        cfg = cls_cfg(**COMMON, intermediate_size=96, num_key_value_heads=2,
                      max_position_embeddings=128, **extra)
        return cls_model(cfg)
    return build


def _random_biases(build):
    """``build`` with every bias drawn at random (transformers initializes them to 0, where a
    dropped or misplaced bias would change nothing)."""
    def built():
        model = build()
        with torch.no_grad():
            for name, p in model.named_parameters():
                if name.endswith(".bias"):
                    p.normal_(0.0, 0.2)
        return model
    return built


def _sinks(model):
    """A model's attention sinks (gpt-oss, Granite SWA) drawn at random (they start at 0)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("sinks"):
                p.normal_()
    return model


def _layer_scalars(model):
    """A Gemma 4 model with each block's layer_scalar drawn at random (a buffer of ones at init)."""
    with torch.no_grad():
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.uniform_(0.5, 1.5)
    return model


def _container(cls_model, cls_cfg, text_type, vision, text=(), **extra):
    """A multimodal container with the usual tiny text model of ``text_type`` (and ``text``'s options)
    and a tiny vision tower."""
    return lambda: cls_model(cls_cfg(text_config=dict(TEXT, model_type=text_type, **dict(text)),
                                     vision_config=vision, **extra))


def _mistral3(**text):
    return tf.Mistral3ForConditionalGeneration(tf.Mistral3Config(
        text_config=dict(TEXT, **text), vision_config=tf.PixtralVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
            patch_size=14, head_dim=8)))


def _molmo2(**text):
    vit = dict(VISION, num_key_value_heads=2, head_dim=8)
    return tf.Molmo2ForConditionalGeneration(tf.Molmo2Config(
        text_config=dict(TEXT, additional_vocab_size=8, **text), vision_config=dict(vit, image_size=[28, 28]),
        adapter_config=dict(vit, vision_feature_layer=[-1], text_hidden_size=64)))


TOWER = dict(COMMON, intermediate_size=128, max_position_embeddings=128)  # a text tower's encoder
TOWER_VISION = dict(VISION, image_size=28, patch_size=14)
CONTRASTIVE_TEXT = dict(TOWER, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def _contrastive_text(cls_cfg, cls_model, **extra):
    """A contrastive image-text model's tiny text encoder, every bias drawn at random."""
    return _random_biases(lambda: cls_model(cls_cfg(**CONTRASTIVE_TEXT, **extra)))


def _contrastive(cls_cfg, cls_model):
    """A whole contrastive image-text model: that text encoder and a one-block vision tower."""
    return _random_biases(lambda: cls_model(cls_cfg(text_config=CONTRASTIVE_TEXT, vision_config=TOWER_VISION,
                                                    projection_dim=48)))


BUILDERS = {
    "llama": _llama_like(tf.LlamaConfig, tf.LlamaForCausalLM),
    "llama_mlp_bias": _llama_like(tf.LlamaConfig, tf.LlamaForCausalLM, mlp_bias=True),
    "mistral": _llama_like(tf.MistralConfig, tf.MistralForCausalLM),
    "qwen2": _random_biases(_llama_like(tf.Qwen2Config, tf.Qwen2ForCausalLM)),  # on q, k and v
    "qwen3": _llama_like(tf.Qwen3Config, tf.Qwen3ForCausalLM, head_dim=16),
    "gemma2": _llama_like(tf.Gemma2Config, tf.Gemma2ForCausalLM, head_dim=16),
    "gemma3_text": _llama_like(tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, head_dim=16),
    "gemma3_text_bidirectional": _llama_like(tf.Gemma3TextConfig, tf.Gemma3ForCausalLM, head_dim=16,
                                             use_bidirectional_attention=True),  # EmbeddingGemma's
    "olmo2": _llama_like(tf.Olmo2Config, tf.Olmo2ForCausalLM),
    "gpt2": lambda: tf.GPT2LMHeadModel(tf.GPT2Config(
        vocab_size=257, n_embd=64, n_layer=3, n_head=4, n_positions=128)),
    "gpt_neox_parallel": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, use_parallel_residual=True)),
    "gpt_neox_sequential": lambda: tf.GPTNeoXForCausalLM(tf.GPTNeoXConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, use_parallel_residual=False)),
    "bert": lambda: tf.BertModel(tf.BertConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128), add_pooling_layer=False),
    "bert_mlm": lambda: tf.BertForMaskedLM(tf.BertConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128)),
    # (every builder gets the same checks: test_conservation.py, test_weights.py)
    "helium": _llama_like(tf.HeliumConfig, tf.HeliumForCausalLM, head_dim=16),
    "ernie4_5": _llama_like(tf.Ernie4_5Config, tf.Ernie4_5ForCausalLM, head_dim=16, use_bias=True),
    "seed_oss": _random_biases(_llama_like(tf.SeedOssConfig, tf.SeedOssForCausalLM, head_dim=16,
                                           attention_bias=True, attention_out_bias=True)),
    "ministral": _llama_like(tf.MinistralConfig, tf.MinistralForCausalLM, head_dim=16, sliding_window=4,
                             layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    # configs of Llama's own classes (InternLM3's one bias setting for q, k, v, o and the MLP)
    "internlm3": _random_biases(_llama_like(tf.InternLM3Config, tf.LlamaForCausalLM, head_dim=16,
                                            attention_bias=True, mlp_bias=True)),
    "iquestcoder": _llama_like(tf.IQuestCoderConfig, tf.LlamaForCausalLM, head_dim=16),
    "exaone": _llama_like(tf.ExaoneConfig, tf.LlamaForCausalLM, eos_token_id=2),
    "cwm": _llama_like(tf.CwmConfig, tf.CwmForCausalLM, head_dim=16, sliding_window=4, bos_token_id=1,
                       eos_token_id=2),  # layer 0 full, 1 and 2 sliding (CWM's 1 in 4)
    "nanochat": _llama_like(tf.NanoChatConfig, tf.NanoChatForCausalLM, head_dim=16, bos_token_id=1,  # relu²
                            eos_token_id=2, pad_token_id=None, final_logit_softcapping=3.0,
                            initializer_range=0.1),
    "arcee": _llama_like(tf.ArceeConfig, tf.ArceeForCausalLM, head_dim=16),
    "nemotron": _random_biases(_llama_like(tf.NemotronConfig, tf.NemotronForCausalLM, head_dim=16,
                                           pad_token_id=None, bos_token_id=1, eos_token_id=2)),
    "apertus": _llama_like(tf.ApertusConfig, tf.ApertusForCausalLM, head_dim=16, pad_token_id=None,
                           bos_token_id=1, eos_token_id=2),
    "apertus1p5_text": _llama_like(tf.Apertus1p5TextConfig, tf.Apertus1p5TextForCausalLM, head_dim=16,
                                   pad_token_id=None, bos_token_id=1, eos_token_id=2,
                                   output_vocab_size=200),  # its unembedding pruned to 200 rows
    # queries scaled by position from 8 on (Ministral 3's 1 + 0.1·log(1 + ⌊p / 16384⌋) from 16384)
    "ministral3": _llama_like(tf.Ministral3Config, tf.Ministral3ForCausalLM, head_dim=16,
                              rope_parameters=dict(MINISTRAL3_ROPE, original_max_position_embeddings=8)),
    "jais2": _random_biases(_llama_like(tf.Jais2Config, tf.Jais2ForCausalLM, bos_token_id=0, eos_token_id=2)),
    "vaultgemma": _llama_like(tf.VaultGemmaConfig, tf.VaultGemmaForCausalLM, head_dim=16),
    "exaone4": _llama_like(tf.Exaone4Config, tf.Exaone4ForCausalLM, head_dim=16, sliding_window=4,
                           bos_token_id=1, eos_token_id=2, pad_token_id=None),
    "hunyuan_v1_dense": _llama_like(tf.HunYuanDenseV1Config, tf.HunYuanDenseV1ForCausalLM, head_dim=16,
                                    pad_token_id=None, bos_token_id=1, eos_token_id=2),
    "smollm3": _llama_like(tf.SmolLM3Config, tf.SmolLM3ForCausalLM, pad_token_id=None),
    "gemma": _llama_like(tf.GemmaConfig, tf.GemmaForCausalLM, head_dim=16),
    "phi3": _random_biases(_llama_like(tf.Phi3Config, tf.Phi3ForCausalLM, pad_token_id=None)),
    "olmo3": _llama_like(tf.Olmo3Config, tf.Olmo3ForCausalLM),
    "starcoder2": _random_biases(_llama_like(tf.Starcoder2Config, tf.Starcoder2ForCausalLM)),
    "stablelm": _random_biases(_llama_like(tf.StableLmConfig, tf.StableLmForCausalLM)),
    "stablelm_parallel": _random_biases(_llama_like(tf.StableLmConfig, tf.StableLmForCausalLM,
                                                    use_parallel_residual=True)),
    # StableLM 2 12B's: a LayerNorm of its own on each head's queries and keys (qk_layernorm)
    "stablelm_qk_layernorm": _random_biases(_llama_like(tf.StableLmConfig, tf.StableLmForCausalLM,
                                                        qk_layernorm=True)),
    "cohere": _llama_like(tf.CohereConfig, tf.CohereForCausalLM, pad_token_id=None, logit_scale=0.25),
    "cohere2": _llama_like(tf.Cohere2Config, tf.Cohere2ForCausalLM, pad_token_id=None, logit_scale=0.25,
                           sliding_window=4),
    # Granite: embedding, residual (every write), attention and logit multipliers
    "granite": _llama_like(tf.GraniteConfig, tf.GraniteForCausalLM, **GRANITE),
    # HyperCLOVA X: an RMSNorm on each write (use_post_norm, so no residual multiplier); Granite's block
    "hyperclovax": _llama_like(tf.HyperCLOVAXConfig, tf.HyperCLOVAXForCausalLM, embedding_multiplier=3.0,
                               attention_multiplier=0.3, logits_scaling=2.5, bos_token_id=1, eos_token_id=2),
    "hyperclovax_no_post_norm": _llama_like(tf.HyperCLOVAXConfig, tf.HyperCLOVAXForCausalLM, **GRANITE,
                                            use_post_norm=False),
    "granite_swa": lambda: _sinks(_llama_like(tf.GraniteSWAConfig, tf.GraniteSWAForCausalLM, **GRANITE,
                                              sliding_window=4, head_dim=16)()),
    # mixture-of-experts MLPs (4 experts, 2 a token; Qwen2-MoE with a shared expert)
    "mixtral": _llama_like(tf.MixtralConfig, tf.MixtralForCausalLM, num_local_experts=4),
    "qwen2_moe": _random_biases(_llama_like(tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM, num_experts=4,
                                            moe_intermediate_size=48, shared_expert_intermediate_size=96,
                                            num_experts_per_tok=2)),
    "qwen2_moe_dense": _random_biases(_llama_like(  # block 1 a dense MLP between two of experts
        tf.Qwen2MoeConfig, tf.Qwen2MoeForCausalLM, num_experts=4, moe_intermediate_size=48,
        shared_expert_intermediate_size=96, num_experts_per_tok=2, mlp_only_layers=[1])),
    "qwen3_moe": _llama_like(tf.Qwen3MoeConfig, tf.Qwen3MoeForCausalLM, num_experts=4, num_experts_per_tok=2,
                             head_dim=16, moe_intermediate_size=48),
    "hunyuan_v1_moe": _llama_like(tf.HunYuanMoEV1Config, tf.HunYuanMoEV1ForCausalLM, head_dim=16,
                                  num_experts=4, moe_topk=2, pad_token_id=None, bos_token_id=1,
                                  eos_token_id=2),
    "olmoe": _llama_like(tf.OlmoeConfig, tf.OlmoeForCausalLM, num_experts=4, num_experts_per_tok=2),
    "granitemoe": _llama_like(tf.GraniteMoeConfig, tf.GraniteMoeForCausalLM, **GRANITE, num_local_experts=4,
                              num_experts_per_tok=2),
    "granitemoe_swa": lambda: _sinks(_llama_like(
        tf.GraniteMoeSWAConfig, tf.GraniteMoeSWAForCausalLM, **GRANITE, num_local_experts=4,
        num_experts_per_tok=2, sliding_window=4, head_dim=16)()),
    "glm4_moe": _llama_like(tf.Glm4MoeConfig, tf.Glm4MoeForCausalLM, head_dim=16, n_routed_experts=4,
                            num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                            first_k_dense_replace=1, use_qk_norm=True, pad_token_id=None),
    "ernie4_5_moe": _llama_like(tf.Ernie4_5_MoeConfig, tf.Ernie4_5_MoeForCausalLM, head_dim=16,
                                moe_num_experts=4, moe_k=2, moe_intermediate_size=48,
                                moe_num_shared_experts=1, moe_layer_start_index=1),
    "exaone_moe": _llama_like(tf.ExaoneMoeConfig, tf.ExaoneMoeForCausalLM, head_dim=16, num_experts=4,
                              num_experts_per_tok=2, moe_intermediate_size=48, num_shared_experts=1,
                              mlp_layer_types=["dense", "sparse", "sparse"], sliding_window=4,
                              layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                              pad_token_id=None, bos_token_id=1, eos_token_id=2),
    "solar_open": lambda: tf.SolarOpenForCausalLM(tf.SolarOpenConfig(  # a shared expert beside 4
        **COMMON, num_key_value_heads=2, max_position_embeddings=128, head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1)),
    "mellum": _llama_like(tf.MellumConfig, tf.MellumForCausalLM, head_dim=16, num_experts=4,  # block 0 dense
                          num_experts_per_tok=2, moe_intermediate_size=48, sliding_window=4,
                          mlp_layer_types=["dense", "sparse", "sparse"],
                          layer_types=["sliding_attention", "full_attention", "sliding_attention"]),
    # GLM-4-MoE's model with Sarvam's config (full rotary, biases on q, k and v)
    "sarvam_moe": _random_biases(lambda: tf.Glm4MoeForCausalLM(tf.SarvamMoEConfig(
        **COMMON, intermediate_size=96, num_key_value_heads=2, head_dim=16, n_routed_experts=4,
        num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1,
        use_qk_norm=True, attention_bias=True, max_position_embeddings=128, pad_token_id=None,
        eos_token_id=2))),
    "dots1": _llama_like(tf.Dots1Config, tf.Dots1ForCausalLM, head_dim=16, n_routed_experts=4,  # last: SWA
                         num_experts_per_tok=2, moe_intermediate_size=48, n_shared_experts=1,
                         first_k_dense_replace=1, sliding_window=4, max_window_layers=2),
    "hy_v3": _random_biases(_llama_like(tf.HYV3Config, tf.HYV3ForCausalLM, head_dim=16, num_experts=4,
                                        num_experts_per_tok=2, moe_intermediate_size=48, num_shared_experts=1,
                                        attention_bias=True)),
    "flint": lambda: _sinks(_llama_like(  # dense block 0; rotary in the sliding-window blocks only
        tf.FlintConfig, tf.FlintForCausalLM, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=48, shared_expert_intermediate_size=64, mlp_only_layers=[0], sliding_window=4,
        layer_types=["full_attention", "sliding_attention", "sliding_attention"])()),
    "kolibri1": lambda: tf.Kolibri1ForCausalLM(tf.Kolibri1Config(  # sandwich norms; rotary where SWA
        **COMMON, num_key_value_heads=2, head_dim=16, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=48, shared_expert_intermediate_size=64, max_position_embeddings=128,
        sliding_window=4, layer_types=["sliding_attention", "full_attention", "sliding_attention"])),
    # multi-head latent attention: keys and values through one low-rank map and an RMSNorm, queries
    # through another (V3's) or their own projection (V2-Lite's); block 0 dense
    "deepseek_v3": lambda: tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
        **COMMON, **DEEPSEEK, q_lora_rank=24)),
    "deepseek_v3_q": lambda: tf.DeepseekV3ForCausalLM(tf.DeepseekV3Config(
        **COMMON, **DEEPSEEK, q_lora_rank=None)),
    "deepseek_v2": lambda: tf.DeepseekV2ForCausalLM(tf.DeepseekV2Config(  # V2-Lite's: no low-rank queries
        **COMMON, **DEEPSEEK, q_lora_rank=None)),
    # DeepSeek-V3's classes with Sarvam's config; GLM-4-MoE-Lite's and A.X K1's blocks (dense where
    # mlp_layer_types says; A.X K1's experts end in an RMSNorm); V3.2's indexer keeps 4 keys a query
    # (8 indexer heads: with 2, scores of keys every head's ReLU zeroes tie exactly at 0, and topk
    # breaks such ties by the padded length, so the model's own output for a row changes with padding)
    "sarvam_mla": lambda: tf.DeepseekV3ForCausalLM(tf.SarvamMLAConfig(**COMMON, **DEEPSEEK, q_lora_rank=24)),
    "glm4_moe_lite": lambda: tf.Glm4MoeLiteForCausalLM(tf.Glm4MoeLiteConfig(
        **COMMON, **MLA_MOE, q_lora_rank=None)),
    "axk1": lambda: tf.AXK1ForCausalLM(tf.AXK1Config(**COMMON, **MLA_MOE, q_lora_rank=24, bos_token_id=1,
                                                     eos_token_id=2)),
    "deepseek_v32": lambda: tf.DeepseekV32ForCausalLM(tf.DeepseekV32Config(
        **COMMON, **MLA_MOE, q_lora_rank=24, index_topk=4, index_head_dim=16, index_n_heads=8)),
    # GLM-5: V3.2's blocks, every attention with an indexer of its own
    "glm_moe_dsa": lambda: tf.GlmMoeDsaForCausalLM(tf.GlmMoeDsaConfig(
        **COMMON, **MLA_MOE, q_lora_rank=24, index_topk=4, index_head_dim=16, index_n_heads=8, bos_token_id=1,
        eos_token_id=2)),
    # Mistral 4: V3's blocks, its queries scaled from position 8 on (1 + 0.1·log(1 + ⌊p / 8⌋)); interleaved
    # rotary with low-rank queries, or half-split rotary with their own projection and no dense block
    "mistral4": lambda: tf.Mistral4ForCausalLM(tf.Mistral4Config(
        **COMMON, **DEEPSEEK, q_lora_rank=24, rope_parameters=MISTRAL4_ROPE)),
    "mistral4_q": lambda: tf.Mistral4ForCausalLM(tf.Mistral4Config(
        **COMMON, **dict(DEEPSEEK, first_k_dense_replace=0), q_lora_rank=None, rope_interleave=False,
        rope_parameters=MISTRAL4_ROPE)),
    # MiniMax-M2: an RMSNorm over all heads' queries (keys), half of each head rotated, sigmoid routing
    "minimax_m2": _llama_like(tf.MiniMaxM2Config, tf.MiniMaxM2ForCausalLM, head_dim=16, num_local_experts=4,
                              num_experts_per_tok=2, rotary_dim=8, bos_token_id=1, eos_token_id=2),
    # latent attention with one dense MLP; MiniCPM3's embedding, write and logit multipliers
    "youtu": lambda: tf.YoutuForCausalLM(tf.YoutuConfig(**COMMON, **MLA, intermediate_size=96, q_lora_rank=24,
                                                      bos_token_id=1, eos_token_id=2)),
    "minicpm3": _random_biases(lambda: tf.MiniCPM3ForCausalLM(tf.MiniCPM3Config(
        **COMMON, **MLA, intermediate_size=96, q_lora_rank=24, attention_bias=True, **MINICPM3))),
    "minicpm3_q": lambda: tf.MiniCPM3ForCausalLM(tf.MiniCPM3Config(  # queries by their own projection
        **COMMON, **MLA, intermediate_size=96, q_lora_rank=None, **MINICPM3)),
    "flex_olmo": _llama_like(tf.FlexOlmoConfig, tf.FlexOlmoForCausalLM, num_experts=4, num_experts_per_tok=2,
                             pad_token_id=None, eos_token_id=2),
    # Cohere 2 MoE: a dense block, then experts with a shared MLP; LayerNorms, or RMSNorms and sigmoid routing
    "cohere2_moe": _llama_like(
        tf.Cohere2MoeConfig, tf.Cohere2MoeForCausalLM, **COHERE2_MOE, sliding_window_pattern=2,
        first_k_dense_replace=1, prefix_dense_intermediate_size=128),
    "cohere2_moe_rms": _llama_like(
        tf.Cohere2MoeConfig, tf.Cohere2MoeForCausalLM, **COHERE2_MOE, rms_norm_eps=1e-6,
        expert_selection_fn="sigmoid", shared_expert_combination_strategy="sum"),
    "gemma4_text": lambda: _layer_scalars(tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(**GEMMA4))),
    # Gemma 4 26B-A4B's blocks: a dense MLP and 4 experts (2 a token) beside it, one write
    "gemma4_moe": lambda: _layer_scalars(tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(
        **GEMMA4, enable_moe_block=True, num_experts=4, top_k_experts=2, moe_intermediate_size=48))),
    "gemma4_text_bidirectional": lambda: _layer_scalars(tf.Gemma4ForCausalLM(tf.Gemma4TextConfig(
        **GEMMA4, use_bidirectional_attention="all"))),
    # multimodal containers, run on text alone: a tiny vision tower (one block, 2×2 patches) beside
    # the text model, which is described by its own row (Gemma 3 4B-27B; Mistral Small 3.1, Ministral 3)
    "gemma3": lambda: tf.Gemma3ForConditionalGeneration(tf.Gemma3Config(
        text_config=tf.Gemma3TextConfig(**TEXT), mm_tokens_per_image=4, vision_config=tf.SiglipVisionConfig(
            hidden_size=16, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28,
            patch_size=14))),
    # Gemma 4 unified (12B): Gemma 4's dense blocks, no per-layer inputs (its config has no such key);
    # its container embeds image patches without a vision tower (a tiny 2×2-patch embedder here)
    "gemma4_unified_text": lambda: _layer_scalars(tf.Gemma4UnifiedForCausalLM(tf.Gemma4UnifiedTextConfig(
        **GEMMA4_UNIFIED))),
    "gemma4_unified": lambda: _layer_scalars(tf.Gemma4UnifiedForConditionalGeneration(tf.Gemma4UnifiedConfig(
        text_config=tf.Gemma4UnifiedTextConfig(**GEMMA4_UNIFIED), vision_config=tf.Gemma4UnifiedVisionConfig(
            patch_size=2, pooling_kernel_size=1, mm_embed_dim=16, mm_posemb_size=8, output_proj_dims=16)))),
    "gemma4": lambda: _layer_scalars(tf.Gemma4ForConditionalGeneration(tf.Gemma4Config(
        text_config=GEMMA4, vision_config=dict(VISION, num_key_value_heads=2, head_dim=8, patch_size=14,
                                               pooling_kernel_size=1)))),
    "mistral3": lambda: _mistral3(model_type="mistral"),
    "mistral3_ministral3": lambda: _mistral3(
        model_type="ministral3", rope_parameters=dict(MINISTRAL3_ROPE, original_max_position_embeddings=8)),
    # Qwen2.5-VL's (biases on q, k, v) and Qwen3-VL's (interleaved sections, features of images added to
    # block 0's output) text models with their multimodal rotary in sections of 2, 3 and 3 frequencies
    "qwen2_5_vl": _random_biases(lambda: tf.Qwen2_5_VLForConditionalGeneration(tf.Qwen2_5_VLConfig(
        text_config=dict(TEXT, rope_parameters=MROPE),
        vision_config=dict(QWEN_VISION, fullatt_block_indexes=[0])))),
    "qwen2_vl": _random_biases(lambda: tf.Qwen2VLForConditionalGeneration(tf.Qwen2VLConfig(
        text_config=dict(TEXT, rope_parameters=MROPE), vision_config=dict(
            depth=1, embed_dim=16, hidden_size=64, num_heads=2, mlp_ratio=2)))),
    "qwen3_vl": lambda: tf.Qwen3VLForConditionalGeneration(tf.Qwen3VLConfig(
        text_config=dict(TEXT, rope_parameters=dict(MROPE, mrope_interleaved=True)), vision_config=dict(
            QWEN_VISION, deepstack_visual_indexes=[0], num_position_embeddings=16))),
    # LLaVA and its kin (1.5, NeXT, OneVision, NeXT-Video, ViP), InternVL 3, SmolVLM, Idefics 3,
    # Ovis 2, LightOnOCR, EXAONE 4.5, Kimi K2.5, Apertus 1.5: a text model of a supported type
    # beside their vision tower (smolvlm and idefics3 call theirs text_model)
    "llava": _container(tf.LlavaForConditionalGeneration, tf.LlavaConfig, "llama", CLIP),
    "llava_next": _container(tf.LlavaNextForConditionalGeneration, tf.LlavaNextConfig, "mistral", CLIP,
                             image_grid_pinpoints=[[28, 28]]),
    "llava_onevision": _random_biases(_container(
        tf.LlavaOnevisionForConditionalGeneration, tf.LlavaOnevisionConfig, "qwen2", SIGLIP,
        image_grid_pinpoints=[[28, 28]])),
    "llava_next_video": _container(tf.LlavaNextVideoForConditionalGeneration, tf.LlavaNextVideoConfig,
                                   "llama", CLIP, image_grid_pinpoints=[[28, 28]]),
    # Granite Vision's: a LLaVA-NeXT head (a plain Linear) over Granite's text model, whose own head divides
    # the logits by logits_scaling and the container's by nothing
    "llava_next_granite": _container(tf.LlavaNextForConditionalGeneration, tf.LlavaNextConfig, "granite",
                                     CLIP, text=GRANITE, image_grid_pinpoints=[[28, 28]]),
    "vipllava": _container(tf.VipLlavaForConditionalGeneration, tf.VipLlavaConfig, "llama", CLIP,
                           vision_feature_layers=[-1]),
    "internvl": _random_biases(_container(tf.InternVLForConditionalGeneration, tf.InternVLConfig, "qwen2",
                                          dict(VISION, image_size=28, patch_size=14))),
    "smolvlm": _container(tf.SmolVLMForConditionalGeneration, tf.SmolVLMConfig, "llama",
                          dict(VISION, image_size=28, patch_size=14), scale_factor=1),
    "idefics3": _container(tf.Idefics3ForConditionalGeneration, tf.Idefics3Config, "llama",
                           dict(VISION, image_size=28, patch_size=14), scale_factor=1),
    "ovis2": _random_biases(_container(tf.Ovis2ForConditionalGeneration, tf.Ovis2Config, "qwen2", dict(
        VISION, image_size=28, patch_size=14, vocab_size=32), hidden_size=64, vocab_size=257)),
    "lighton_ocr": _container(tf.LightOnOcrForConditionalGeneration, tf.LightOnOcrConfig, "qwen3", dict(
        VISION, model_type="pixtral", image_size=28, patch_size=14, head_dim=8)),
    "exaone4_5": lambda: tf.Exaone4_5_ForConditionalGeneration(tf.Exaone4_5_Config(
        text_config=dict(TEXT, model_type="exaone4", sliding_window=4, pad_token_id=None), vision_config=dict(
            QWEN_VISION, num_key_value_heads=2, fullatt_block_indexes=[0]))),
    "kimi_k25": lambda: tf.Kimi_K25ForConditionalGeneration(tf.Kimi_K25Config(
        text_config=dict(COMMON, **DEEPSEEK, q_lora_rank=24, model_type="deepseek_v3"),
        vision_config=dict(VISION, pos_emb_height=4, pos_emb_width=4))),
    # Apertus 1.5: its unembedding pruned to the text tokens (200), then 16 image and 16 audio tokens
    "apertus1p5": lambda: tf.Apertus1p5ForConditionalGeneration(tf.Apertus1p5Config(
        text_config=dict(TEXT, output_vocab_size=200, pad_token_id=None, bos_token_id=1, eos_token_id=2),
        vision_config=dict(codebook_size=16, embed_dim=8, latent_channels=8, base_channels=32,
                           channel_multiplier=[1], num_res_blocks=1, attn_resolutions=[], resolution=28),
        image_token_offset=200, audio_token_offset=216, audio_config=dict(
            model_type="wavtokenizer_encoder", num_filters=4, upsampling_ratios=[2, 2], num_lstm_layers=1,
            hidden_size=8, codebook_size=16, codebook_dim=8, decoder_hidden_size=8,
            decoder_intermediate_size=16, decoder_num_layers=1, decoder_attention_num_groups=2))),
    # Aya Vision and Command A Vision: Cohere 2's text model (logit_scale 0.25, which the containers'
    # heads do not apply) beside a SigLIP tower, its 2×2 patches shuffled into one token
    "aya_vision": _container(tf.AyaVisionForConditionalGeneration, tf.AyaVisionConfig, "cohere2", SIGLIP,
                             text=COHERE2_TEXT),
    "cohere2_vision": _container(tf.Cohere2VisionForConditionalGeneration, tf.Cohere2VisionConfig, "cohere2",
                                 SIGLIP, text=COHERE2_TEXT, alignment_intermediate_size=32),
    # ERNIE 4.5 VL: ERNIE 4.5 MoE's blocks (block 0 dense, biases everywhere) with text experts 48 wide and
    # vision experts 32 wide (2 of 4 a token), a shared expert; multimodal rotary in sections of 3, 3, 2
    "ernie4_5_vl_moe": _random_biases(lambda: tf.Ernie4_5_VLMoeForConditionalGeneration(
        tf.Ernie4_5_VLMoeConfig(text_config=dict(
            TEXT, use_bias=True, moe_intermediate_size=[48, 32], moe_num_experts=4, moe_k=2,
            moe_num_shared_experts=1, rope_parameters=dict(rope_type="default", rope_theta=5e5,
                                                           mrope_section=[3, 3, 2])),
            vision_config=dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2)))),
    # Qwen3-VL-MoE's (block 1 a dense MLP between two of experts); GLM-4.1V's (biases on q, k and v),
    # GLM-4.6V's (its classes) and GLM-4.5V's (block 0 dense, then experts with a shared one) text models
    # with their multimodal partial rotary, sections of 2, 1 and 1 frequencies
    "qwen3_vl_moe": lambda: tf.Qwen3VLMoeForConditionalGeneration(tf.Qwen3VLMoeConfig(
        text_config=dict(TEXT, rope_parameters=dict(MROPE, mrope_interleaved=True), **QWEN3_MOE,
                         mlp_only_layers=[1]),
        vision_config=dict(QWEN_VISION, deepstack_visual_indexes=[0], num_position_embeddings=16))),
    "glm4v": _random_biases(lambda: tf.Glm4vForConditionalGeneration(tf.Glm4vConfig(
        text_config=dict(TEXT, rope_parameters=GLM_MROPE), vision_config=GLM_VISION))),
    "glm46v": _random_biases(lambda: tf.Glm46VForConditionalGeneration(tf.Glm46VConfig(
        text_config=dict(TEXT, rope_parameters=GLM_MROPE), vision_config=GLM_VISION))),
    "glm4v_moe": _random_biases(lambda: tf.Glm4vMoeForConditionalGeneration(tf.Glm4vMoeConfig(
        text_config=dict(TEXT, rope_parameters=GLM_MROPE, n_routed_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=48, n_shared_experts=1, first_k_dense_replace=1),
        vision_config=GLM_VISION))),
    # Aria: experts (2 of 4 a token) beside 2 shared ones, biases on q, k, v, o and the shared experts; the
    # container with a tiny Idefics3 vision tower
    "aria_text": _random_biases(lambda: tf.AriaTextForCausalLM(tf.AriaTextConfig(**dict(TEXT, **ARIA)))),
    "aria": _random_biases(lambda: tf.AriaForConditionalGeneration(tf.AriaConfig(
        text_config=dict(TEXT, **ARIA), projector_patch_to_query_dict={4: 4}, vision_config=dict(
            model_type="idefics3_vision", hidden_size=16, intermediate_size=32, num_hidden_layers=1,
            num_attention_heads=2, image_size=28, patch_size=14)))),
    # HunyuanOCR: Hunyuan's dense blocks (biases on q, k, v, o) with multimodal rotary in sections of 2, 3
    # and 3; Molmo2: Qwen3's RMSNorms on each head's q and k before each sublayer, or OLMo 2's (over all
    # heads, on each write); Granite 4 Vision: Granite's multipliers (its projectors 1/2 windowed Q-Formers)
    "hunyuan_vl": _random_biases(lambda: tf.HunYuanVLForConditionalGeneration(tf.HunYuanVLConfig(
        text_config=dict(TEXT, rope_parameters=dict(MROPE, mrope_section=[2, 3, 3]), attention_bias=True,
                         pad_token_id=0, bos_token_id=1, eos_token_id=2),
        vision_config=dict(VISION, out_hidden_size=64, patch_size=14)))),
    "molmo2": lambda: _molmo2(),
    "molmo2_olmo": lambda: _molmo2(qk_norm_type="olmo", norm_after=True),
    "granite4_vision": lambda: tf.Granite4VisionForConditionalGeneration(tf.Granite4VisionConfig(
        text_config=dict(TEXT, **GRANITE), vision_config=dict(CLIP, hidden_size=64), image_token_index=256,
        image_grid_pinpoints=[[28, 28]], downsample_rate="1/2", deepstack_layer_map=[[-1, 1]],
        spatial_target_layers=[0, 1, 2, 2], qformer_config=QFORMER)),
    # Granite Docling: Granite's text model, DeepStack image features, a head dividing by logits_scaling
    "granite_docling": lambda: tf.GraniteDoclingForConditionalGeneration(tf.GraniteDoclingConfig(
        text_config=dict(TEXT, **GRANITE, pad_token_id=0), pad_token_id=0, vision_config=dict(
            VISION, image_size=28, patch_size=14, out_hidden_size=64, scale_factor=2,
            deepstack_visual_indexes=[0]))),
    # Idefics2 (Mistral's text model, a perceiver resampler), PaddleOCR-VL (ERNIE 4.5's blocks with biases,
    # multimodal rotary), GLM-OCR (GLM-4V's blocks without q/k/v biases), Video-LLaVA, Qianfan-OCR,
    # VideoLLaMA3, DeepSeek-VL, HyperCLOVA X Vision V2 (its head multiplies by logits_scaling), Janus (a
    # tiny VQ model beside), Cosmos3 Edge (relu² MLPs, interleaved multimodal rotary)
    "idefics2": _container(tf.Idefics2ForConditionalGeneration, tf.Idefics2Config, "mistral",
                           dict(VISION, image_size=28, patch_size=14), perceiver_config=dict(
                               hidden_size=64, resampler_n_latents=4, resampler_depth=1, resampler_n_heads=2,
                               resampler_head_dim=8, num_key_value_heads=1)),
    "paddleocr_vl": _random_biases(lambda: tf.PaddleOCRVLForConditionalGeneration(tf.PaddleOCRVLConfig(
        text_config=dict(TEXT, use_bias=True, rope_parameters=MROPE),
        vision_config=dict(VISION, patch_size=14, image_size=28)))),
    "glm_ocr": lambda: tf.GlmOcrForConditionalGeneration(tf.GlmOcrConfig(
        text_config=dict(TEXT, rope_parameters=GLM_MROPE), vision_config=GLM_VISION)),
    "video_llava": _container(tf.VideoLlavaForConditionalGeneration, tf.VideoLlavaConfig, "llama", CLIP),
    "qianfan_ocr": _container(tf.QianfanOCRForConditionalGeneration, tf.QianfanOCRConfig, "qwen3",
                              dict(VISION, image_size=28, patch_size=14)),
    "video_llama_3": _random_biases(_container(tf.VideoLlama3ForConditionalGeneration, tf.VideoLlama3Config,
                                               "qwen2", dict(VISION, patch_size=14))),
    "deepseek_vl": _container(tf.DeepseekVLForConditionalGeneration, tf.DeepseekVLConfig, "llama", SIGLIP),
    "hyperclovax_vision_v2": _container(
        tf.HyperCLOVAXVisionV2ForConditionalGeneration, tf.HyperCLOVAXVisionV2Config, "hyperclovax",
        dict(QWEN_VISION, fullatt_block_indexes=[0]), text=dict(
            embedding_multiplier=3.0, attention_multiplier=0.3, logits_scaling=2.5, bos_token_id=1,
            eos_token_id=2)),
    "janus": _container(tf.JanusForConditionalGeneration, tf.JanusConfig, "llama", dict(
        VISION, image_size=28, patch_size=14, projection_dim=64, depth=1), vq_config=dict(
            embed_dim=8, num_embeddings=16, latent_channels=8, base_channels=32, channel_multiplier=[1],
            num_res_blocks=1, projection_dim=64, image_token_embed_dim=64, num_patches=2)),
    "cosmos3_edge": _container(tf.Cosmos3EdgeForConditionalGeneration, tf.Cosmos3EdgeConfig,
                               "cosmos3_edge_text", dict(VISION, patch_size=14), projector_hidden_size=32,
                               text=dict(rope_parameters=MROPE)),
    # Llama 4: Maverick's interleaving (block 1 of experts between dense ones 128 wide), block 2 without
    # rotary, its queries scaled from position 3 on (floor_scale 4), the others chunked by 8 positions;
    # the container (Scout's: every block of experts, 2 a token) as it is saved, its text model a whole LM
    "llama4_text": lambda: tf.Llama4ForCausalLM(tf.Llama4TextConfig(**LLAMA4, interleave_moe_layer_step=2)),
    "llama4": lambda: tf.Llama4ForConditionalGeneration(tf.Llama4Config(
        text_config=dict(LLAMA4, num_experts_per_tok=2), vision_config=dict(
            hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64, image_size=28,
            patch_size=14, vision_output_dim=32, projector_input_dim=32, projector_output_dim=64))),
    "gpt_oss": lambda: _sinks(tf.GptOssForCausalLM(tf.GptOssConfig(  # its MLP returns (write, scores)
        **COMMON, intermediate_size=96, num_key_value_heads=2, num_local_experts=4, num_experts_per_tok=2,
        head_dim=16, max_position_embeddings=128))),
    # Falcon: 7B's one key/value head and one LayerNorm read by both sublayers; 40B's new decoder
    # (2 key/value heads, each after its query heads; two LayerNorms); 11B's new decoder with one;
    # RW's sequential blocks with ALiBi and [h: q k v]
    "falcon": _random_biases(lambda: tf.FalconForCausalLM(tf.FalconConfig(
        **COMMON, multi_query=True, parallel_attn=True, bias=True))),
    "falcon_new": _random_biases(lambda: tf.FalconForCausalLM(tf.FalconConfig(
        **COMMON, new_decoder_architecture=True, num_kv_heads=2, bias=True))),
    "falcon_new_one_norm": lambda: tf.FalconForCausalLM(tf.FalconConfig(
        **COMMON, new_decoder_architecture=True, num_kv_heads=2, num_ln_in_parallel_attn=1)),
    "falcon_rw": _random_biases(lambda: tf.FalconForCausalLM(tf.FalconConfig(
        **COMMON, multi_query=False, parallel_attn=False, alibi=True, bias=True))),
    "gpt_neo": _random_biases(lambda: tf.GPTNeoForCausalLM(tf.GPTNeoConfig(  # local windows of 4
        vocab_size=257, hidden_size=64, num_layers=3, num_heads=4, max_position_embeddings=128,
        window_size=4, attention_types=[[["global", "local"], 1], [["local"], 1]]))),
    "bloom": _random_biases(lambda: tf.BloomForCausalLM(tf.BloomConfig(
        vocab_size=257, hidden_size=64, n_layer=3, n_head=4))),
    "mpt": lambda: tf.MptForCausalLM(tf.MptConfig(vocab_size=257, d_model=64, n_layers=3, n_heads=4,
                                                  max_seq_len=128)),
    "dbrx": lambda: tf.DbrxForCausalLM(tf.DbrxConfig(  # 2 key/value heads; 2 of 4 experts a token
        vocab_size=257, d_model=64, n_layers=3, n_heads=4, max_seq_len=128, initializer_range=0.1,
        attn_config=dict(kv_n_heads=2, rope_theta=10000.0, clip_qkv=8.0),  # 8 as DBRX
        ffn_config=dict(ffn_hidden_size=96, moe_num_experts=4, moe_top_k=2))),
    "olmo": _llama_like(tf.OlmoConfig, tf.OlmoForCausalLM, pad_token_id=None),  # LayerNorms without γ, β
    "glm": _llama_like(tf.GlmConfig, tf.GlmForCausalLM, head_dim=16, pad_token_id=None),
    "glm4": _llama_like(tf.Glm4Config, tf.Glm4ForCausalLM, head_dim=16, pad_token_id=None),
    "phimoe": _random_biases(_llama_like(tf.PhimoeConfig, tf.PhimoeForCausalLM, num_local_experts=4,
                                         num_experts_per_tok=2)),
    "openai-gpt": _random_biases(lambda: tf.OpenAIGPTLMHeadModel(tf.OpenAIGPTConfig(  # post-LayerNorm
        vocab_size=257, n_embd=64, n_layer=3, n_head=4, n_positions=128, initializer_range=0.1))),
    # OPT: 125m's pre-LayerNorm; 350m's post-LayerNorm with 48-wide embeddings projected in and out
    "opt": _random_biases(lambda: tf.OPTForCausalLM(tf.OPTConfig(
        vocab_size=257, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=96,
        max_position_embeddings=128, word_embed_proj_dim=64, init_std=0.1))),
    "opt_post": _random_biases(lambda: tf.OPTForCausalLM(tf.OPTConfig(
        vocab_size=257, hidden_size=64, num_hidden_layers=3, num_attention_heads=4, ffn_dim=96,
        max_position_embeddings=128, word_embed_proj_dim=48, do_layer_norm_before=False, init_std=0.1))),
    # a fairseq-style decoder: scaled embeddings, the MLP's projections in the block
    "biogpt": _random_biases(lambda: tf.BioGptForCausalLM(tf.BioGptConfig(
        **COMMON, intermediate_size=96, max_position_embeddings=128, initializer_range=0.1))),
    # XGLM: BioGPT's fairseq blocks with sinusoidal positions (a module's output) and scaled embeddings
    "xglm": _random_biases(lambda: tf.XGLMForCausalLM(tf.XGLMConfig(
        vocab_size=257, d_model=64, num_layers=3, attention_heads=4, ffn_dim=96, max_position_embeddings=128,
        init_std=0.1))),
    # Persimmon: NeoX's fused [h: q k v], partial rotary, a LayerNorm on each head's queries and keys
    "persimmon": _random_biases(lambda: tf.PersimmonForCausalLM(tf.PersimmonConfig(
        **COMMON, intermediate_size=96, max_position_embeddings=128, initializer_range=0.1))),
    "gpt_bigcode": _random_biases(lambda: tf.GPTBigCodeForCausalLM(tf.GPTBigCodeConfig(
        vocab_size=257, n_embd=64, n_layer=3, n_head=4, n_positions=128, multi_query=True))),
    "gpt_bigcode_mha": _random_biases(lambda: tf.GPTBigCodeForCausalLM(tf.GPTBigCodeConfig(  # [h: q k v]
        vocab_size=257, n_embd=64, n_layer=3, n_head=4, n_positions=128, multi_query=False))),
    "gptj": _random_biases(lambda: tf.GPTJForCausalLM(tf.GPTJConfig(
        vocab_size=257, n_embd=64, n_layer=3, n_head=4, n_positions=128, rotary_dim=8))),
    "codegen": _random_biases(lambda: tf.CodeGenForCausalLM(tf.CodeGenConfig(  # 8 heads, 2 in each shard
        vocab_size=257, n_embd=64, n_layer=3, n_head=8, n_positions=128, rotary_dim=4,
        initializer_range=0.1))),
    "phi": _random_biases(lambda: tf.PhiForCausalLM(tf.PhiConfig(
        **COMMON, intermediate_size=96, max_position_embeddings=128))),
    "phi_qk_layernorm": _random_biases(lambda: tf.PhiForCausalLM(tf.PhiConfig(  # one LayerNorm, every head
        **COMMON, intermediate_size=96, max_position_embeddings=128, qk_layernorm=True))),
    "roberta_mlm": _random_biases(lambda: tf.RobertaForMaskedLM(tf.RobertaConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130))),
    "roberta_causal": lambda: tf.RobertaForCausalLM(tf.RobertaConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130, is_decoder=True)),
    "xlm-roberta_mlm": lambda: tf.XLMRobertaForMaskedLM(tf.XLMRobertaConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130)),
    "modernbert_mlm": lambda: tf.ModernBertForMaskedLM(tf.ModernBertConfig(  # block 0 reads raw
        **COMMON, intermediate_size=96, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
        eos_token_id=2, cls_token_id=1, sep_token_id=2, global_attn_every_n_layers=2, local_attention=16)),
    "data2vec-text_mlm": _random_biases(lambda: tf.Data2VecTextForMaskedLM(tf.Data2VecTextConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130))),
    "ernie_mlm": _random_biases(lambda: tf.ErnieForMaskedLM(tf.ErnieConfig(  # task embeddings, a 4th
        **COMMON, intermediate_size=128, max_position_embeddings=128, use_task_id=True))),
    "bert-generation_causal": _random_biases(lambda: tf.BertGenerationDecoder(tf.BertGenerationConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, is_decoder=True))),
    # pre-LayerNorm descendants of BERT
    "roberta-prelayernorm_mlm": _random_biases(lambda: tf.RobertaPreLayerNormForMaskedLM(
        tf.RobertaPreLayerNormConfig(**COMMON, intermediate_size=128, max_position_embeddings=130))),
    "xlm-roberta-xl_mlm": _random_biases(lambda: tf.XLMRobertaXLForMaskedLM(tf.XLMRobertaXLConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130))),
    "megatron-bert_mlm": _random_biases(lambda: tf.MegatronBertForMaskedLM(tf.MegatronBertConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, initializer_range=0.1))),
    "camembert_mlm": lambda: tf.CamembertForMaskedLM(tf.CamembertConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130)),
    # ELECTRA's generator head (embedding_size = hidden_size); RoFormer (rotary); BigBird's full attention
    "electra_mlm": _random_biases(lambda: tf.ElectraForMaskedLM(tf.ElectraConfig(
        **COMMON, embedding_size=64, intermediate_size=128, max_position_embeddings=128))),
    "roformer_mlm": _random_biases(lambda: tf.RoFormerForMaskedLM(tf.RoFormerConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128))),
    "big_bird_mlm": _random_biases(lambda: tf.BigBirdForMaskedLM(tf.BigBirdConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, attention_type="original_full"))),
    "distilbert_mlm": _random_biases(lambda: tf.DistilBertForMaskedLM(tf.DistilBertConfig(
        vocab_size=257, dim=64, n_layers=3, n_heads=4, hidden_dim=128, max_position_embeddings=128))),
    # ESM-2: rotary, token_dropout ('e' the mask token: its embedding zeroed, the rest scaled per text)
    "esm_mlm": _random_biases(lambda: tf.EsmForMaskedLM(tf.EsmConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, pad_token_id=0, mask_token_id=101,
        position_embedding_type="rotary", token_dropout=True, emb_layer_norm_before=False))),
    "esm_mlm_absolute": _random_biases(lambda: tf.EsmForMaskedLM(tf.EsmConfig(  # ESM-1b's, token_dropout off
        **COMMON, intermediate_size=128, max_position_embeddings=130, pad_token_id=0, mask_token_id=101,
        position_embedding_type="absolute", token_dropout=False, emb_layer_norm_before=True))),
    # DeBERTa-v3's disentangled attention (c2p, p2c; 16 log buckets), no positions or types in the stream;
    # DeBERTa-v2's with learned positions, token types and separate position projections
    "deberta-v2_mlm": _random_biases(lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(
        **COMMON, intermediate_size=128, max_position_embeddings=128, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_biased_input=False, position_buckets=16,
        norm_rel_ebd="layer_norm", share_att_key=True, max_relative_positions=-1, initializer_range=0.1))),
    "deberta-v2_mlm_v2": _random_biases(lambda: tf.DebertaV2ForMaskedLM(tf.DebertaV2Config(
        **COMMON, intermediate_size=128, max_position_embeddings=128, relative_attention=True,
        pos_att_type=["p2c", "c2p"], position_biased_input=True, type_vocab_size=2, share_att_key=False,
        initializer_range=0.1))),
    "modernbert-decoder_causal": _random_biases(lambda: tf.ModernBertDecoderForCausalLM(  # windows of 4
        tf.ModernBertDecoderConfig(
            **COMMON, intermediate_size=96, max_position_embeddings=128, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, cls_token_id=1, sep_token_id=2, local_attention=8, attention_bias=True,
            mlp_bias=True, norm_bias=True, classifier_bias=True,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"]))),
    "eurobert_mlm": _random_biases(_llama_like(tf.EuroBertConfig, tf.EuroBertForMaskedLM, head_dim=16,
                                               attention_bias=True, mlp_bias=True, pad_token_id=0,
                                               bos_token_id=1, eos_token_id=2, mask_token_id=3)),
    # post-LayerNorm blocks with rotary: NomicBERT's and GTE's gated MLPs, Jina v3's GELU MLP
    "nomic_bert_mlm": _random_biases(lambda: tf.NomicBertForMaskedLM(tf.NomicBertConfig(
        **COMMON, intermediate_size=96, max_position_embeddings=128))),
    "gte_mlm": _random_biases(lambda: tf.GteForMaskedLM(tf.GteConfig(
        **COMMON, intermediate_size=96, max_position_embeddings=128, type_vocab_size=2, pad_token_id=0))),
    "jina_embeddings_v3_mlm": _random_biases(lambda: tf.JinaEmbeddingsV3ForMaskedLM(tf.JinaEmbeddingsV3Config(
        **COMMON, intermediate_size=128, max_position_embeddings=128, pad_token_id=0))),
    "mpnet_mlm": _random_biases(lambda: tf.MPNetForMaskedLM(tf.MPNetConfig(  # relative position bias
        **COMMON, intermediate_size=128, max_position_embeddings=130, initializer_range=0.1))),
    # ESM C: LayerNorms on all heads' queries and keys, writes divided by √(3 / 36)
    "esmc_mlm": _random_biases(lambda: tf.EsmcForMaskedLM(tf.EsmcConfig(
        **COMMON, intermediate_size=96, max_position_embeddings=128, attention_bias=True, mlp_bias=True))),
    "ultrabert_mlm": _random_biases(lambda: tf.UltrabertForMaskedLM(tf.UltrabertConfig(  # windows of ±4
        **TEXT, sliding_window=4, prediction_head_size=48, attention_bias=True, mlp_bias=True))),
    "rembert_mlm": _random_biases(lambda: tf.RemBertForMaskedLM(tf.RemBertConfig(  # embeddings 32 wide
        **COMMON, intermediate_size=128, max_position_embeddings=128, input_embedding_size=32,
        output_embedding_size=48, bos_token_id=1, eos_token_id=2))),
    # BERT's block: Splinter's (no MLM head), TAPAS's 7 token-type embeddings, MarkupLM's XPath embedding (no
    # MLM head), RoC-BERT's embeddings summed as BERT's (concat_input off; text alone: no shape or
    # pronunciation ids)
    "splinter": _random_biases(lambda: tf.SplinterModel(tf.SplinterConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128))),
    "tapas_mlm": _random_biases(lambda: tf.TapasForMaskedLM(tf.TapasConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128))),
    "markuplm": _random_biases(lambda: tf.MarkupLMModel(tf.MarkupLMConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130, max_depth=4,
        xpath_unit_hidden_size=8))),
    "roc_bert_mlm": _random_biases(lambda: tf.RoCBertForMaskedLM(tf.RoCBertConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=128, pronunciation_embed_dim=64,
        pronunciation_vocab_size=12, shape_embed_dim=64, shape_vocab_size=12, concat_input=False))),
    # LUKE on text alone (no entities), LiLT's text blocks beside its layout stream
    "luke_mlm": _random_biases(lambda: tf.LukeForMaskedLM(tf.LukeConfig(
        **COMMON, intermediate_size=128, max_position_embeddings=130, entity_vocab_size=16,
        entity_emb_size=32))),
    "lilt": _random_biases(lambda: tf.LiltModel(tf.LiltConfig(  # 48 wide: 6 box embeddings of 8
        **dict(COMMON, hidden_size=48), intermediate_size=128, max_position_embeddings=130))),
    # encoder-decoder models, analysed through their encoder: T5 v1.0's (ReLU MLP) in a whole model,
    # T5 v1.1's (gated GELU) encoder alone, mT5's and UMT5's (a position bias in every block)
    "t5": lambda: tf.T5ForConditionalGeneration(tf.T5Config(**T5)),
    "t5_encoder": lambda: tf.T5EncoderModel(tf.T5Config(**T5, feed_forward_proj="gated-gelu")),
    "mt5": lambda: tf.MT5ForConditionalGeneration(tf.MT5Config(**T5)),
    "umt5": lambda: tf.UMT5EncoderModel(tf.UMT5Config(**T5)),
    # the text encoders of contrastive image-text models, without LM heads: CLIP's (causal, quick_gelu; with
    # its projection: the encoder under text_model), MetaCLIP 2's, CLIPSeg's, X-CLIP's; SigLIP's and SigLIP
    # 2's (bidirectional, a pooling head on the last token's final stream)
    "clip_text_model": _contrastive_text(tf.CLIPTextConfig, tf.CLIPTextModel),
    "clip_text_model_projection": _contrastive_text(tf.CLIPTextConfig, tf.CLIPTextModelWithProjection,
                                                    projection_dim=48),
    "metaclip_2_text_model": _contrastive_text(tf.MetaClip2TextConfig, tf.MetaClip2TextModel),
    "clipseg_text_model": _contrastive_text(tf.CLIPSegTextConfig, tf.CLIPSegTextModel),
    "xclip_text_model": _contrastive_text(tf.XCLIPTextConfig, tf.XCLIPTextModel),
    "siglip_text_model": _contrastive_text(tf.SiglipTextConfig, tf.SiglipTextModel),
    "siglip2_text_model": _contrastive_text(tf.Siglip2TextConfig, tf.Siglip2TextModel),
    # the whole models, analysed through their text towers (their forward needs images)
    "clip": _contrastive(tf.CLIPConfig, tf.CLIPModel),
    "siglip": _contrastive(tf.SiglipConfig, tf.SiglipModel),
    "siglip2": _contrastive(tf.Siglip2Config, tf.Siglip2Model),
    "metaclip_2": _contrastive(tf.MetaClip2Config, tf.MetaClip2Model),
    # OWL-ViT's text class (its body under text_model), and whole OWL-ViT, OWLv2 and GroupViT models
    "owlvit_text_model": _contrastive_text(tf.OwlViTTextConfig, tf.OwlViTTextModel),
    "owlvit": _contrastive(tf.OwlViTConfig, tf.OwlViTModel),
    "owlv2": _contrastive(tf.Owlv2Config, tf.Owlv2Model),
    "groupvit_text_model": _contrastive_text(tf.GroupViTTextConfig, tf.GroupViTTextModel),
    "groupvit": _contrastive(tf.GroupViTConfig, tf.GroupViTModel),
    "altclip_text_model": _random_biases(lambda: tf.AltCLIPTextModel(tf.AltCLIPTextConfig(  # XLM-R's blocks
        **COMMON, intermediate_size=128, max_position_embeddings=130, project_dim=48))),
    # text towers of contrastive and retrieval models (tower_families): BERT's (Chinese-CLIP's, its pooler
    # outside the stream; ALIGN's), RoBERTa's (CLAP's; BridgeTower's, whose cross-modal layers read it),
    # FLAVA's pre-LN, TIPSv2's (scaled token embeddings over sinusoidal positions); the whole models, analysed
    # through their text_model
    "chinese_clip_text_model": _random_biases(lambda: tf.ChineseCLIPTextModel(tf.ChineseCLIPTextConfig(
        **TOWER))),
    "chinese_clip": _random_biases(lambda: tf.ChineseCLIPModel(tf.ChineseCLIPConfig(
        text_config=TOWER, vision_config=TOWER_VISION, projection_dim=48))),
    "align": _random_biases(lambda: tf.AlignModel(tf.AlignConfig(text_config=TOWER, vision_config=dict(
        image_size=28, width_coefficient=0.1, depth_coefficient=0.1, hidden_dim=64), projection_dim=64))),
    "clap": _random_biases(lambda: tf.ClapModel(tf.ClapConfig(text_config=TOWER, audio_config=dict(
        depths=[1, 1], num_attention_heads=[2, 2], hidden_size=16, patch_embeds_hidden_size=16, spec_size=64,
        num_mel_bins=64, window_size=4, patch_stride=(4, 4)), projection_dim=48))),
    "flava": _random_biases(lambda: tf.FlavaModel(tf.FlavaConfig(
        text_config=TOWER, image_config=TOWER_VISION, multimodal_config=VISION, projection_dim=48,
        hidden_size=64))),
    "x_clip": _random_biases(lambda: tf.XCLIPModel(tf.XCLIPConfig(
        text_config=CONTRASTIVE_TEXT, projection_dim=48, prompt_layers=1, prompt_num_attention_heads=2,
        vision_config=dict(TOWER_VISION, mit_hidden_size=16, mit_intermediate_size=32,
                           mit_num_hidden_layers=1, mit_num_attention_heads=2, num_frames=2)))),
    "bridgetower": _random_biases(lambda: tf.BridgeTowerModel(tf.BridgeTowerConfig(  # 1 cross-modal layer
        text_config=TOWER, hidden_size=64, num_hidden_layers=1, num_attention_heads=4,
        vision_config=dict(hidden_size=64, num_hidden_layers=3, image_size=28, patch_size=14)))),
    # a dual encoder built from any text model and any vision model (here BERT's and ViT's)
    "vision-text-dual-encoder": _random_biases(lambda: tf.VisionTextDualEncoderModel(
        tf.VisionTextDualEncoderConfig.from_vision_text_configs(tf.ViTConfig(**TOWER_VISION),
                                                                tf.BertConfig(**TOWER), projection_dim=48))),
    "tipsv2": _random_biases(lambda: tf.Tipsv2Model(tf.Tipsv2Config(text_config=TOWER, vision_config=dict(
        TOWER, image_size=28, patch_size=14)))),
    # Switch Transformers: experts in block 1 (capacity 3 a sequence, so some tokens get no MLP write)
    "switch_transformers": lambda: tf.SwitchTransformersForConditionalGeneration(tf.SwitchTransformersConfig(
        **T5, num_sparse_encoder_layers=1, num_sparse_decoder_layers=1, num_experts=4, expert_capacity=3)),
    # BART's post-LayerNorm encoder (embeddings scaled by √d_model in their module), mBART's pre-LN one,
    # PLBart's, M2M-100's (sinusoidal positions) and Blenderbot's, two as *Model (get_encoder from the base)
    "bart": _random_biases(lambda: tf.BartForConditionalGeneration(tf.BartConfig(
        **BART, scale_embedding=True))),
    "mbart": _random_biases(lambda: tf.MBartForConditionalGeneration(tf.MBartConfig(**BART))),
    "plbart": _random_biases(lambda: tf.PLBartModel(tf.PLBartConfig(**BART))),
    "m2m_100": _random_biases(lambda: tf.M2M100ForConditionalGeneration(tf.M2M100Config(**BART))),  # (NLLB's)
    "blenderbot": _random_biases(lambda: tf.BlenderbotModel(tf.BlenderbotConfig(
        **BART, scale_embedding=True))),
    # Marian's (the original Transformer's), Pegasus's and Blenderbot Small's, their token embeddings scaled
    # by √d_model outside the module, before the positions are added (as in their checkpoints)
    "pegasus": _random_biases(lambda: tf.PegasusForConditionalGeneration(tf.PegasusConfig(
        **BART, scale_embedding=True))),
    "marian": _random_biases(lambda: tf.MarianMTModel(tf.MarianConfig(
        **BART, pad_token_id=0, decoder_start_token_id=0, scale_embedding=True))),
    "blenderbot_small": _random_biases(lambda: tf.BlenderbotSmallForConditionalGeneration(
        tf.BlenderbotSmallConfig(**BART, scale_embedding=True))),
    # T5Gemma's Gemma 2-style encoder (sliding windows both ways, soft-capped scores) in a whole model
    "t5gemma": lambda: tf.T5GemmaForConditionalGeneration(tf.T5GemmaConfig(
        encoder=T5GEMMA, decoder=dict(T5GEMMA, num_hidden_layers=2), vocab_size=257)),
    # T5Gemma 2's whole model (its encoder: a text model of Gemma 3's blocks beside a vision tower) and its
    # encoder alone
    "t5gemma2": lambda: tf.T5Gemma2ForConditionalGeneration(tf.T5Gemma2Config(
        encoder=T5GEMMA2_ENCODER, decoder=dict(T5GEMMA2, num_hidden_layers=2, layer_types=[
            "sliding_attention", "full_attention"]), image_token_index=251)),
    "t5gemma2_encoder": lambda: tf.T5Gemma2Encoder(tf.T5Gemma2EncoderConfig(**dict(
        T5GEMMA2_ENCODER, text_config=dict(T5GEMMA2, dropout_rate=0.0)))),  # (dropout: the whole's to set)
    # NLLB-MoE's encoder: M2M-100's with experts in block 1 (top-2, capacity 3, so some tokens get no write)
    "nllb_moe": _random_biases(lambda: tf.NllbMoeForConditionalGeneration(tf.NllbMoeConfig(
        **BART, encoder_sparse_step=2, decoder_sparse_step=2, num_experts=4, expert_capacity=3))),
    "mvp": _random_biases(lambda: tf.MvpForConditionalGeneration(tf.MvpConfig(**BART, scale_embedding=True))),
    "bigbird_pegasus": _random_biases(lambda: tf.BigBirdPegasusForConditionalGeneration(
        tf.BigBirdPegasusConfig(**BART, attention_type="original_full", use_bias=True))),
}


def build(name: str, seed: int = 0) -> torch.nn.Module:
    """Build the tiny model ``name`` with random weights (norm gains/biases perturbed)."""
    torch.manual_seed(seed)
    model = BUILDERS[name]().eval()
    with torch.no_grad():  # default init has γ=1, β=0: perturb so norm arithmetic is exercised
        for mod_name, p in model.named_parameters():
            if "norm" in mod_name.lower() or "ln" in mod_name.lower():
                p.add_(0.2 * torch.randn_like(p))
    return model
