"""A two-layer attention-only twin trained here, in seconds, on repeated random segments.

Layer 0's head 0 is planted as a previous-token head (positions are one-hot in 48 of the
128 stream dimensions; its queries read position t and its keys position s+1) and layer 0
is frozen; layer 1 and the unembedding learn. Segments of random length after a random
prefix leave induction as the only way to predict the repeat, so a layer-1 head becomes an
induction head, and it can only get "which token came before" from the planted head. The
analyses must find that circuit from the outside: the induction head's top K-composition
edge and its top K read-attribution edge both come from the previous-token head.
"""

import pytest
import torch

import residual_stream as rs

V, N_CTX, D, H = 32, 48, 128, 2
CHANCE = float(torch.log(torch.tensor(V)))


def batch(g: torch.Generator, n: int):
    seg_len = int(torch.randint(6, 16, (1,), generator=g))
    pre = int(torch.randint(0, 12, (1,), generator=g))
    seg = torch.randint(0, V, (n, seg_len), generator=g)
    prefix = torch.randint(0, V, (n, pre), generator=g)
    return torch.cat([prefix, seg, seg], 1), pre + seg_len, seg_len


def plant_previous_token_head(net, g):
    with torch.no_grad():
        net.pos_embed.weight.zero_()
        net.pos_embed.weight[:, :N_CTX] = torch.eye(N_CTX)
        net.embed.weight.zero_()
        net.embed.weight[:, N_CTX:] = torch.randn(V, D - N_CTX, generator=g)
        attn, dh = net.blocks[0].attn, D // H
        attn.q_proj.weight[:dh].zero_()
        attn.k_proj.weight[:dh].zero_()
        attn.q_proj.weight[:N_CTX, :N_CTX] = 8.0 * torch.eye(N_CTX)   # head 0 queries: position t
        for j in range(N_CTX - 1):
            attn.k_proj.weight[j + 1, j] = 8.0                        # head 0 keys: position s + 1
    for p in [*net.embed.parameters(), *net.pos_embed.parameters(),
              *net.blocks[0].parameters()]:
        p.requires_grad_(False)


@pytest.fixture(scope="module")
def trained():
    model = rs.twin(norm="none", placement="pre", n_layers=2, d_model=D, n_heads=H, seed=0,
                    attn_only=True, d_vocab=V, n_ctx=N_CTX, init="xavier")
    net, g = model.module, torch.Generator().manual_seed(0)
    plant_previous_token_head(net, g)
    opt = torch.optim.Adam([p for p in net.parameters() if p.requires_grad], lr=3e-3)
    net.train()
    for _ in range(300):
        x, start, _ = batch(g, 64)
        logits = net(x).logits[:, start:-1]
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, start + 1:].reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
    net.eval()
    x, start, seg_len = batch(g, 16)
    return model, x, start, seg_len


def test_training_learned_the_repeat(trained):
    model, x, start, _ = trained
    with torch.no_grad():
        logits = model.module(x).logits[:, start:-1]
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, V), x[:, start + 1:].reshape(-1))
    assert loss < 0.3 * CHANCE


def test_induction_head_composes_with_the_previous_token_head(trained):
    model, x, start, seg_len = trained
    tr = rs.trace(model, x, patterns=True)
    A0, A1 = tr.patterns
    prev = [A0[:, h].diagonal(-1, -2, -1).mean().item() for h in range(H)]
    induction = [A1[:, h, start:, start - seg_len + 1:].diagonal(0, -2, -1).mean().item()
                 for h in range(H)]
    assert prev[0] > 0.9 and prev[1] < 0.5
    head = max(range(H), key=lambda h: induction[h])
    assert induction[head] > 0.4
    top = rs.composition(model).top(f"L1H{head}", "k")
    assert top.writer[0] == "L0H0" and top.score[0] > top.baseline[0]
    reads = rs.read_attribution(tr, granularity="head").matrix("reader", channel="k")
    row = reads.loc[f"L1H{head}.k"].abs()
    assert row.idxmax() == "L0H0"
    assert row["L0H0"] > 2 * row["L0H1"]


def test_head_scores_find_the_planted_and_the_learned_heads(trained):
    """``rs.head_scores`` on its own repeated random tokens: the planted head is the
    previous-token head, the head that learned induction in layer 1 has the top induction
    score (the analysis finds the circuit from attention alone), and the model predicts the
    repeat (its loss far under chance) but not the first copy (about chance)."""
    model, *_ = trained
    scores = rs.head_scores(model, length=15, rows=16, seed=1)
    assert scores.start == 0 and scores.tokens.shape == (16, 30)  # no BOS in a 32-token vocabulary
    assert float(scores.previous_token[0, 0]) > 0.9 and float(scores.previous_token[0, 1]) < 0.5
    best = scores.top("induction", n=1).iloc[0]
    assert best.layer == 1 and best.induction > 0.4
    assert scores.loss_repeat < 0.3 * CHANCE < 0.8 * CHANCE < scores.loss_first
