"""Read and write maps: rebuild each block's attention and MLP from ``model.weights(L)`` and
the input ``trace.read_input`` says the component reads, and compare with what the
framework computed (captured ``z`` and MLP output). Attention patterns come from the
framework itself (eager attention, ``output_attentions``), so Q/K are checked where the
model has no rotary embedding and V everywhere."""

import math

import pytest
import torch
from conftest import TEXTS, max_rel_error
from tiny_hf import build
from transformers.activations import ACT2FN

import residual_stream as rs
from residual_stream.inputs import ByteTokenizer
from residual_stream.twins import twin

REL = 1e-4
NO_ROTARY = {"gpt2", "bert", "twin"}


def patterns(model, trace):
    """Attention patterns from the framework (eager), or recomputed for the twin."""
    if model.anatomy.architecture == "rs-twin":
        return None
    model.module.set_attn_implementation("eager")  # our private tiny copy
    with torch.no_grad():
        out = model.module(input_ids=trace.tokens, attention_mask=trace.attention_mask,
                           output_attentions=True)
    return out.attentions


def act(model, name):
    if model.anatomy.architecture == "rs-twin":
        return torch.nn.functional.silu if name == "swiglu" else torch.nn.functional.gelu
    cfg = model.module.config
    keys = ("activation_function", "hidden_activation", "hidden_act")
    return ACT2FN[next(getattr(cfg, k) for k in keys if getattr(cfg, k, None))]


@pytest.mark.parametrize("name", ["llama", "gpt2", "gpt_neox_parallel", "bert", "gemma2",
                                  "twin"])
def test_weights_rebuild_attention_and_mlp(name):
    model = (twin(norm="layernorm", placement="post", bias=True) if name == "twin"
             else rs.load(build(name), tokenizer=ByteTokenizer()))
    trace = rs.trace(model, TEXTS)
    pats = patterns(model, trace)
    mask = trace.attention_mask
    for L in range(model.anatomy.n_layers):
        w = model.weights(L)
        u = trace.read_input(f"L{L}.attn")
        v = torch.einsum("bpd,hdk->bhpk", u, w.W_V) + (0 if w.b_V is None else w.b_V[:, None])
        q = torch.einsum("bpd,hdk->bhpk", u, w.W_Q) + (0 if w.b_Q is None else w.b_Q[:, None])
        k = torch.einsum("bpd,hdk->bhpk", u, w.W_K) + (0 if w.b_K is None else w.b_K[:, None])
        causal = model.anatomy.architecture != "bert"
        if pats is not None:
            A = pats[L].float()
        else:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            P = scores.shape[-1]
            scores = scores.masked_fill(torch.ones(P, P).triu(1).bool(), float("-inf"))
            A = scores.softmax(-1)
        if model.anatomy.architecture in NO_ROTARY and pats is not None:
            scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
            P = scores.shape[-1]
            blocked = ~mask.bool()[:, None, None, :]
            if causal:
                blocked = blocked | torch.ones(P, P).triu(1).bool()
            mine = scores.masked_fill(blocked, float("-inf")).softmax(-1)
            real = mask.bool()[:, None, :, None].expand_as(A)
            assert (mine - A)[real].abs().max() < 1e-5, f"Q/K pattern, layer {L}"
        z = (A @ v).transpose(1, 2).flatten(2)  # (batch, pos, head·d_head)
        assert max_rel_error(z, trace.captured.z[L], mask) <= REL, f"z, layer {L}"
        x = trace.read_input(f"L{L}.mlp")
        pre = x @ w.W_in + (0 if w.b_in is None else w.b_in)
        f = act(model, model.module.config.mlp if name == "twin" else "")
        h = f(x @ w.W_gate) * pre if w.W_gate is not None else f(pre)
        out = h @ w.W_out + (0 if w.b_out is None else w.b_out)
        assert max_rel_error(out, trace.mlp_write(L), mask) <= REL, f"mlp, layer {L}"


def test_grouped_query_heads_share_keys():
    model = rs.load(build("llama"), tokenizer=ByteTokenizer())  # 4 heads, 2 kv heads
    w = model.weights(0)
    torch.testing.assert_close(w.W_K[0], w.W_K[1])
    torch.testing.assert_close(w.W_V[2], w.W_V[3])
    assert not torch.equal(w.W_K[1], w.W_K[2])


def test_weights_layer_out_of_range():
    with pytest.raises(IndexError, match="0..2"):
        twin(n_layers=3).weights(3)
