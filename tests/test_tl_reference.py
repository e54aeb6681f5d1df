"""TransformerLens as an independent reference for the decomposition, the lens, direct
logit attribution and composition scores, on a tiny pre-RMSNorm Llama wrapped by its
``TransformerBridge`` in compatibility mode (a tokenizer is passed so nothing is fetched).

Compatibility mode folds the norms' γ into the following weights and centers the
unembedding; centering adds the same constant to every logit of a position, so logits are
compared through log-softmax, KL and logit *differences*, which do not see it. The bridge
runs eager attention, ours SDPA: ``TL_REL`` allows their documented drift.
"""

import copy

import pytest
import torch
import transformers as tf
from transformers import AutoTokenizer

import residual_stream as rs
from residual_stream.analyses.flow import component_label
from residual_stream.registry import REGISTRY
from residual_stream.tl_compat import boot_bridge

TL_REL = 1e-4     # decomposition, relative to the stream RMS
TL_KL_ATOL = 1e-4  # nats
TL_DLA_ATOL = 1e-4  # logit units
TL_COMPOSITION_ATOL = 1e-6  # scores in [0, 1], from the same weights in float32


@pytest.fixture(scope="module")
def pair():
    tok = AutoTokenizer.from_pretrained(REGISTRY["minilm-l6"].location())
    torch.manual_seed(0)
    cfg = tf.LlamaConfig(vocab_size=tok.vocab_size, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=128)
    hf = tf.LlamaForCausalLM(cfg).eval()
    with torch.no_grad():
        for name, p in hf.named_parameters():
            if "norm" in name:
                p.add_(0.3 * torch.randn_like(p))
    bridge = boot_bridge(copy.deepcopy(hf), tok, "tiny-llama")
    bridge.enable_compatibility_mode()
    model = rs.load(hf, tokenizer=tok)
    trace = rs.trace(model, ["the capital of france is paris", "residual streams grow"])
    with torch.no_grad():
        _, cache = bridge.run_with_cache(trace.tokens)
    return model, trace, bridge, cache


def by_component(parts):
    out = {}
    for label, v in zip(parts.labels, parts.values, strict=True):
        key = component_label(label)
        out[key] = out.get(key, 0) + v
    return out


def test_decomposition_matches_decompose_resid(pair):
    model, trace, bridge, cache = pair
    m = trace.attention_mask.bool()
    for layer in (1, 3):
        theirs, labels = cache.decompose_resid(layer=layer, return_labels=True)
        ours = by_component(trace.decompose(layer))
        names = {"embed": "embed", **{f"{L}_attn_out": f"L{L}.attn" for L in range(3)},
                 **{f"{L}_mlp_out": f"L{L}.mlp" for L in range(3)}}
        rms = trace.stream(layer)[m].pow(2).mean().sqrt()
        for label, t in zip(labels, theirs, strict=True):
            err = (ours[names[label]] - t)[m].abs().max() / rms
            assert err <= TL_REL, (layer, label, float(err))


def test_logit_lens_matches_accumulated_resid(pair):
    model, trace, bridge, cache = pair
    lens = rs.logit_lens(trace)
    acc = cache.accumulated_resid(apply_ln=True)                     # (point, batch, pos, d)
    their_logp = (acc @ bridge.W_U + bridge.b_U).log_softmax(-1)
    final = their_logp[-1]
    their_kl = (final.exp() * (final - their_logp)).sum(-1)
    m = trace.attention_mask.bool()
    assert (lens.kl - their_kl)[:, m].abs().max() <= TL_KL_ATOL
    assert torch.equal(lens.top_ids[..., 0][:, m], their_logp.argmax(-1)[:, m])


def test_direct_logit_attribution_matches_logit_attrs(pair):
    model, trace, bridge, cache = pair
    target = trace.logits.argmax(-1)
    baseline = torch.full_like(target, 1996)  # "the"
    dla = rs.direct_logit_attribution(trace, target=target, baseline=baseline)
    stack, labels = cache.decompose_resid(layer=3, return_labels=True)
    # logit_attrs applies the final norm's cached scale itself
    theirs = cache.logit_attrs(stack, tokens=target, incorrect_tokens=baseline)
    ours = {}
    for label, v in zip(dla.labels, dla.values, strict=True):
        key = component_label(label)
        ours[key] = ours.get(key, 0) + v
    names = {"embed": "embed", **{f"{L}_attn_out": f"L{L}.attn" for L in range(3)},
             **{f"{L}_mlp_out": f"L{L}.mlp" for L in range(3)}}
    m = trace.attention_mask.bool()
    for label, t in zip(labels, theirs, strict=True):
        assert (ours[names[label]] - t)[m].abs().max() <= TL_DLA_ATOL, label
    # and the terms add up to the model's own logit difference
    diff = trace.logits.gather(-1, target[..., None]) - trace.logits.gather(-1, baseline[..., None])
    assert (dla.total() - diff[..., 0])[m].abs().max() <= TL_DLA_ATOL


def test_composition_matches_all_composition_scores(pair):
    """Q/K/V composition of every head pair against the bridge's ``all_composition_scores``
    (its weights with every norm's γ folded in, a writer's ``W_V`` as a reader's), and the
    same pairs left out (a head reads only the heads of earlier layers)."""
    model, trace, bridge, cache = pair
    comp = rs.composition(model)
    a = model.anatomy
    for i, mode in enumerate("QKV"):
        theirs = bridge.all_composition_scores(mode).scores.detach()
        ours = comp.head_to_head[i].reshape(a.n_layers, a.n_heads, a.n_layers, a.n_heads)
        assert (ours - theirs).abs().max() <= TL_COMPOSITION_ATOL, mode
        assert bool((ours != 0).any()) and bool((theirs[ours == 0] == 0).all())
