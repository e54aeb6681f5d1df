"""Read and write maps: rebuild each block's attention and MLP from ``model.weights(L)`` and
the input ``trace.read_input`` says the component reads, and compare with what the
framework computed (captured ``z`` and MLP output). Attention patterns come from the
framework itself (eager attention, ``output_attentions``), so Q/K are checked where the
model has no rotary embedding and V everywhere (times each row's sink scale in Granite SWA, computed
from the weights, the sinks and each row's diagonal score)."""

import math

import pytest
import torch
from conftest import TEXTS, max_rel_error
from tiny_hf import BUILDERS, build
from transformers.activations import ACT2FN
from transformers.models.falcon.modeling_falcon import build_alibi_tensor

import residual_stream as rs
from residual_stream.hookio import by_token
from residual_stream.inputs import ByteTokenizer
from residual_stream.twins import twin

REL = 1e-4
NO_ROTARY = {"gpt2", "gpt_bigcode", "bert", "roberta", "distilbert", "gpt_neo", "twin"}
SCORE_SCALE = {"gpt_neo": 1.0}  # GPT-Neo does not divide its scores by sqrt(d_head)
# activations that the config does not name (BLOOM's tanh GELU, MPT's and ESM's exact one, in their code)
ACTIVATIONS = {"bloom": "gelu_pytorch_tanh", "mpt": "gelu", "esm": "gelu",
               "openai-gpt": "gelu_new"}  # (GPT-1's afn "gelu" is its gelu_new)
# xIELU: each layer's activation has parameters of its own
LEARNED_ACTIVATIONS = {"apertus", "apertus1p5_text"}
# attention sinks applied after the softmax, as sigmoid(logsumexp(scores) − sink) on each
# head's output: the patterns the framework returns leave it out (``sink_scale``)
SINK_SCALED = {"granite_swa", "granitemoe_swa"}


def sink_scale(model, L, q, k, A):
    """Granite SWA's scale of each (batch, head, token) row, sigmoid(logsumexp(scores) − sink),
    from the weights: a row's logsumexp is any of its scores minus the log of its weight, and
    the diagonal one, q_i·k_i, is the same with or without the rotary embedding (one angle)."""
    attn = model.module.get_submodule(f"{model.anatomy.modules.layers[L]}.self_attn")
    diagonal = (q * k).sum(-1) * attn.scaling  # (batch, head, pos)
    lse = diagonal - A.diagonal(dim1=-2, dim2=-1).log()
    return torch.sigmoid(lse - attn.sinks.detach()[:, None])


def patterns(model, trace):
    """Attention patterns from the framework (eager), or recomputed (the twin, Falcon with ALiBi)."""
    if model.anatomy.architecture == "rs-twin" or model.anatomy.patterns_note:
        return None
    if type(model.module)._can_set_attn_implementation():  # our private tiny copy
        model.module.set_attn_implementation("eager")
    else:  # Falcon: transformers does not switch it; its attention reads the config
        model.module.config._attn_implementation = "eager"
    with torch.no_grad():
        out = model.module(input_ids=trace.tokens, attention_mask=trace.attention_mask,
                           output_attentions=True)
    return out.attentions


def act(model, name):
    if model.anatomy.architecture == "rs-twin":
        return torch.nn.functional.silu if name == "swiglu" else torch.nn.functional.gelu
    cfg = model.module.config.get_text_config()  # (a multimodal container: its text model's)
    if model.anatomy.architecture in ACTIVATIONS:
        return ACT2FN[ACTIVATIONS[model.anatomy.architecture]]
    keys = ("activation_function", "hidden_activation", "hidden_act", "activation", "dense_act_fn")
    return ACT2FN[next(getattr(cfg, k) for k in keys if getattr(cfg, k, None))]


TWINS = {"twin": dict(norm="layernorm", placement="post", bias=True),
         "twin_swiglu": dict(norm="rmsnorm", placement="pre", bias=True, mlp="swiglu")}


def llama_with_mlp_bias() -> rs.Model:
    """Llama with ``mlp_bias``: its gate projection has a bias too (perturbed away from 0)."""
    hf = build("llama_mlp_bias")
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.mlp.gate_proj.bias.normal_()
    return rs.load(hf, tokenizer=ByteTokenizer())


# every family built in code (fused [q | k | v] with 2 and 1 key/value heads and a fused
# [gate | up] in Phi-3 and GPTBigCode; one LayerNorm read by both sublayers in GPT-J, Phi and
# parallel StableLM; MLPs of experts, which have no single map), and two twins
@pytest.mark.parametrize("name", [*BUILDERS, *TWINS])
def test_weights_rebuild_attention_and_mlp(name):
    model = (twin(**TWINS[name]) if name in TWINS else llama_with_mlp_bias()
             if name == "llama_mlp_bias" else rs.load(build(name), tokenizer=ByteTokenizer()))
    trace = rs.trace(model, TEXTS)
    pats = patterns(model, trace)
    mask = trace.attention_mask
    for L in range(model.anatomy.n_layers):
        w = model.weights(L)
        if model.anatomy.modules.qkv_layout == "latent":  # no linear reads: said, not guessed
            with pytest.raises(rs.errors.NotAvailableError, match="multi-head latent attention"):
                w.attention_reads()
            assert w.W_Q is None and w.W_K is None and w.W_V is None and w.W_O is not None
        else:
            _assert_attention(model, trace, pats, w, L)
        x = trace.read_input(f"L{L}.mlp")
        if w.W_in is None:  # experts: no single map; the framework's MLP, run on what it reads
            assert w.W_out is None and w.W_gate is None and model.anatomy.routing is not None
            if model.anatomy.modules.mlp_out_input:  # Gemma 4: a dense MLP and experts, no one module
                out = gemma4_experts_block(model.module.get_submodule(model.anatomy.modules.layers[L]), x)
                assert max_rel_error(out, trace.mlp_write(L), mask) <= REL, f"mlp, layer {L}"
                continue
            mlp = model.module.get_submodule(model.anatomy.modules.mlp_out[L])
            with torch.no_grad():
                out = mlp(x)
            out = out[0] if isinstance(out, tuple) else out  # gpt-oss, Llama 4: (write, router scores)
            out = by_token(out, mask.shape)  # Llama 4's experts: flattened tokens [batch·pos, d]
            assert max_rel_error(out, trace.mlp_write(L), mask) <= REL, f"mlp, layer {L}"
            continue
        pre = x @ w.W_in + (0 if w.b_in is None else w.b_in)
        f = act(model, model.module.config.mlp if name in TWINS else "")
        if model.anatomy.architecture in LEARNED_ACTIVATIONS:  # each layer's own, with its parameters
            own = model.module.get_submodule(f"{model.anatomy.modules.layers[L]}.mlp.act_fn")
            f = lambda t, own=own: own(t).detach()  # noqa: E731 (its parameters need no gradient)
        gate = None if w.W_gate is None else x @ w.W_gate + (0 if w.b_gate is None else w.b_gate)
        h = f(gate) * pre if gate is not None else f(pre)
        out = h @ w.W_out + (0 if w.b_out is None else w.b_out)
        assert max_rel_error(out, trace.mlp_write(L), mask) <= REL, f"mlp, layer {L}"


def gemma4_experts_block(block, x):
    """Gemma 4's MLP sublayer of a block of experts, written out from its modules on the stream
    ``x`` it reads: the dense MLP through its norms, the router and the experts through theirs,
    summed; the write, before ``post_feedforward_layernorm``."""
    with torch.no_grad():
        dense = block.post_feedforward_layernorm_1(block.mlp(block.pre_feedforward_layernorm(x)))
        flat = x.reshape(-1, x.shape[-1])
        _, weights, chosen = block.router(flat)
        experts = block.experts(block.pre_feedforward_layernorm_2(flat), chosen, weights)
        return dense + block.post_feedforward_layernorm_2(experts.reshape(x.shape))


def _assert_attention(model, trace, pats, w, L):
    """Block ``L``'s attention from its maps: each head's values (and, without a rotary
    embedding, its pattern) from ``W_Q``, ``W_K``, ``W_V`` on what it reads, against the
    captured ``z``."""
    mask = trace.attention_mask
    u = trace.read_input(f"L{L}.attn")
    v = torch.einsum("bpd,hdk->bhpk", u, w.W_V) + (0 if w.b_V is None else w.b_V[:, None])
    if w.v_norm_eps is not None:  # Gemma 4: each head's values through an RMSNorm without a gain
        v = v / (v.pow(2).mean(-1, keepdim=True) + w.v_norm_eps).sqrt()
    q = torch.einsum("bpd,hdk->bhpk", u, w.W_Q) + (0 if w.b_Q is None else w.b_Q[:, None])
    k = torch.einsum("bpd,hdk->bhpk", u, w.W_K) + (0 if w.b_K is None else w.b_K[:, None])
    causal = model.anatomy.causal
    if pats is not None:
        A = pats[L].float()
    else:
        scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])
        if model.anatomy.patterns_note:  # Falcon with ALiBi: its bias, from transformers' own function
            alibi = build_alibi_tensor(mask, model.anatomy.n_heads, torch.float32)
            scores = scores + alibi.view(*q.shape[:2], 1, -1) / math.sqrt(q.shape[-1])
        P = scores.shape[-1]
        blocked = ~mask.bool()[:, None, None, :]  # padding keys, and later keys where the model is causal
        if causal:
            blocked = blocked | torch.ones(P, P).triu(1).bool()
        A = scores.masked_fill(blocked, float("-inf")).softmax(-1)
    if model.anatomy.architecture in NO_ROTARY and pats is not None:
        arch = model.anatomy.architecture
        scores = q @ k.transpose(-1, -2) * SCORE_SCALE.get(arch, 1 / math.sqrt(q.shape[-1]))
        P = scores.shape[-1]
        blocked = ~mask.bool()[:, None, None, :]
        if causal:
            blocked = blocked | torch.ones(P, P).triu(1).bool()
        if arch == "gpt_neo" and model.module.config.attention_layers[L] == "local":
            blocked = blocked | torch.ones(P, P).tril(-model.module.config.window_size).bool()
        mine = scores.masked_fill(blocked, float("-inf")).softmax(-1)
        real = mask.bool()[:, None, :, None].expand_as(A)
        assert (mine - A)[real].abs().max() < 1e-5, f"Q/K pattern, layer {L}"
    z = (A @ v).transpose(1, 2)  # (batch, pos, head, d_head)
    if model.anatomy.architecture in SINK_SCALED:  # each head's output times its row's scale
        z = sink_scale(model, L, q, k, A).transpose(1, 2)[..., None] * z
    z = z.flatten(2)
    assert max_rel_error(z, trace.captured.z[L], mask) <= REL, f"z, layer {L}"


def test_grouped_query_heads_share_keys():
    model = rs.load(build("llama"), tokenizer=ByteTokenizer())  # 4 heads, 2 kv heads
    w = model.weights(0)
    torch.testing.assert_close(w.W_K[0], w.W_K[1])
    torch.testing.assert_close(w.W_V[2], w.W_V[3])
    assert not torch.equal(w.W_K[1], w.W_K[2])


def test_weights_layer_out_of_range():
    with pytest.raises(IndexError, match="0..2"):
        twin(n_layers=3).weights(3)


def test_the_gate_bias_is_a_source_of_the_gate_read():
    """Llama with ``mlp_bias``: the gate's read ``y = u W_gate + b_gate`` (reference: the
    framework's own ``gate_proj`` output, hooked) splits into sources whose shares sum to 1,
    the bias's share being ``<b_gate, y> / ‖y‖²`` per token. Before, ``b_gate`` was dropped:
    the shares were of ``u W_gate``, not the pre-activation the model gates with."""
    model = llama_with_mlp_bias()
    seen = []
    hook = model.module.model.layers[1].mlp.gate_proj.register_forward_hook(
        lambda mod, args, out: seen.append(out.detach()))
    try:
        tr = rs.trace(model, TEXTS)
    finally:
        hook.remove()
    ra = rs.read_attribution(tr, per_token=True)
    r, s = ra.readers.index("L1.mlp.gate"), ra.sources.index("read_map.bias")
    y, b, m = seen[0].double(), model.weights(1).b_gate.double(), tr.attention_mask.bool()
    want = (y @ b) / y.square().sum(-1)
    assert (ra.per_token[r, s].double() - want)[m].abs().max() <= 1e-4 * want[m].abs().max()
    assert (ra.per_token[r].sum(0).double() - 1)[m].abs().max() <= 1e-4


@pytest.mark.parametrize("n_heads", [4, 6, 8, 12])
def test_codegen_shards_split_as_transformers_slices_them(n_heads):
    """CodeGen's fused projection is 4 shards of ``[q | v | k]``, each a quarter of the width, so
    with 6 heads (d_head 16, shards 24 wide) a head straddles two shards (helper 43: the split
    assumed whole heads per shard and raised). Reference: transformers' own slicing, on the
    column indices themselves (its ``view(..., 4, 3·local)`` and ``split(local)`` into query,
    value, key), against ``qkv_columns``; and ``model.weights(0)`` of such a model."""
    import transformers as tf

    from residual_stream.weights import qkv_columns

    d_model = 96
    d_head, local = d_model // n_heads, d_model // 4
    cols = torch.arange(3 * d_model).view(4, 3 * local)
    query, value, key = cols.split(local, dim=-1)
    want = [t.reshape(-1) for t in (query, key, value)]
    got = qkv_columns("shards4", n_heads, n_heads, d_head)
    assert all(torch.equal(g, w) for g, w in zip(got, want, strict=True))
    torch.manual_seed(0)
    module = tf.CodeGenForCausalLM(tf.CodeGenConfig(vocab_size=257, n_embd=d_model, n_layer=1, n_head=n_heads,
                                                    n_positions=64, rotary_dim=4))
    w = rs.load(module, tokenizer=ByteTokenizer()).weights(0)
    W = module.transformer.h[0].attn.qkv_proj.weight.detach().T  # [d_model, 3·d_model]
    for mine, cols_of in ((w.W_Q, want[0]), (w.W_K, want[1]), (w.W_V, want[2])):
        assert torch.equal(mine, W[:, cols_of].unflatten(-1, (n_heads, d_head)).permute(1, 0, 2))


def test_llama4_scales_its_queries_by_position_where_it_has_no_rotary_embedding():
    """What the Llama 4 load warning says, checked: in a block without rotary embedding the
    model's pattern is the softmax of ``W_Q``/``W_K``'s scores with each query's row times
    1 + a·log(1 + ⌊(p + 1) / f⌋), against the framework's eager patterns (without the factor
    they differ); in its other blocks a key in another chunk of ``attention_chunk_size``
    positions gets no weight."""
    with pytest.warns(UserWarning, match=r"multiplied by 1 \+ 0.5·log\(1 \+ ⌊\(position \+ 1\) / 4⌋\)"):
        model = rs.load(build("llama4_text"), tokenizer=ByteTokenizer())
    cfg = model.module.config
    trace = rs.trace(model, TEXTS)
    pats, mask = patterns(model, trace), trace.attention_mask
    L = cfg.no_rope_layers.index(0)
    w, u = model.weights(L), trace.read_input(f"L{L}.attn")
    q, k = (torch.einsum("bpd,hdk->bhpk", u, W) for W in (w.W_Q, w.W_K))
    P = u.shape[1]
    factor = 1 + cfg.attn_scale * torch.log1p(torch.floor((torch.arange(P) + 1.0) / cfg.floor_scale))
    blocked = ~mask.bool()[:, None, None, :] | torch.ones(P, P).triu(1).bool()
    real = mask.bool()[:, None, :, None].expand_as(pats[L])
    for scale, close in ((factor[:, None], True), (1.0, False)):
        scores = scale * (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        error = float((scores.masked_fill(blocked, float("-inf")).softmax(-1) - pats[L])[real].abs().max())
        assert (error < 1e-5) == close, (scale, error)
    chunk = cfg.attention_chunk_size
    other_chunk = (torch.arange(P)[:, None] // chunk) != (torch.arange(P)[None, :] // chunk)
    other_chunk = other_chunk & mask.bool()[:, None, :, None]  # from real queries (padding's are uniform)
    assert other_chunk.any() and all(float(pats[i].masked_fill(~other_chunk, 0).abs().max()) == 0.0
                                     for i in range(cfg.num_hidden_layers) if cfg.no_rope_layers[i])
    assert float(pats[L].masked_fill(~other_chunk, 0).max()) > 0  # (the block without rotary: all keys)
