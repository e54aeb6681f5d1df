"""Analyses: hand-computed examples, conservation identities, and float64 references."""

import math

import pytest
import torch
from conftest import TEXTS
from tiny_hf import build

import residual_stream as rs
from residual_stream.analyses.subspaces import Subspace, mean_direction, orthogonal_split
from residual_stream.errors import InputError, NotAvailableError
from residual_stream.inputs import ByteTokenizer

ATOL = 1e-5


def perturbed(norm="layernorm", placement="pre", **kw):
    # Xavier init: writes of unit scale, so every contribution matters in these checks
    model = rs.twin(norm=norm, placement=placement, n_layers=3, d_model=32, n_heads=4, seed=2,
                    bias=norm == "layernorm", init="xavier", **kw)
    with torch.no_grad():
        for name, p in model.module.named_parameters():
            if ".ln_" in name or name.startswith("ln_"):
                p.add_(0.3 * torch.randn_like(p))
            if "embed" in name:
                p.mul_(20)  # embeddings comparable to the writes, so shares are not degenerate
    return model


# --- subspaces: hand-computed -------------------------------------------------------------

def test_subspace_fraction_2d_by_hand():
    e1 = Subspace.from_vectors("e1", torch.tensor([[2.0], [0.0]]))  # spans x
    assert e1.fraction(torch.tensor([3.0, 4.0])).item() == pytest.approx(9 / 25)
    assert mean_direction(2).fraction(torch.tensor([1.0, -1.0])).item() == pytest.approx(0.0)


def test_orthogonal_split_3d_by_hand():
    # w = (1, 1, 1); first span{e1}, then span{e1, e2} keeps only e2, rest is e3
    w = torch.tensor([1.0, 1.0, 1.0])
    a = Subspace.from_vectors("a", torch.tensor([[1.0], [0.0], [0.0]]))
    b = Subspace.from_vectors("b", torch.tensor([[1.0, 1.0], [0.0, 1.0], [0.0, 0.0]]))
    names, f = orthogonal_split(w, [a, b])
    assert names == ("a", "b", "rest")
    torch.testing.assert_close(f, torch.tensor([1 / 3, 1 / 3, 1 / 3]))
    # an empty subspace (the PCA of a one-token text: SmolLM2 adds no BOS) takes nothing; it
    # raised "max(): Expected reduction dim" on the Writes page
    empty = Subspace("pca3@L0", torch.zeros(3, 0))
    names, f = orthogonal_split(w, [empty, a, empty, b])
    assert names == ("pca3@L0", "a", "pca3@L0", "b", "rest")
    torch.testing.assert_close(f, torch.tensor([0, 1 / 3, 0, 1 / 3, 1 / 3]))


def test_write_subspaces_fractions_are_fractions():
    tr = rs.trace(perturbed(), TEXTS)
    probe = torch.randn(3, 32)
    ws = rs.write_subspaces(tr, writes=["L0H1", "L1.attn", "L2.mlp"], basis=probe)
    assert ws.subspaces[-1] == "basis" and ((ws.named >= 0) & (ws.named <= 1 + ATOL)).all()
    # every later reader of the model reads through a norm: carried writes are read there
    later = ~ws.read_fraction.isnan()
    assert later.any() and (ws.read_strength[later] <= 1 + ATOL).all()
    # L0's MLP reads the full d_model but through a LayerNorm, which centers: its read subspace
    # is everything but the mean direction
    in_mlp = ws.read_fraction[0, ws.readers.index("L0.mlp.in")]
    assert in_mlp.item() == pytest.approx(1 - ws.named[0, 0].item(), abs=1e-4)
    assert math.isnan(ws.read_fraction[2, ws.readers.index("L0H0.q")])  # L2.mlp is later
    # the stacked split of one write sums to 1 at every token
    from residual_stream.analyses.subspaces import write_vector
    subs = [mean_direction(32), Subspace.from_vectors("probe", probe.T)]
    _, f = orthogonal_split(write_vector(tr, "L1.attn"), subs)
    torch.testing.assert_close(f.sum(-1), torch.ones(f.shape[:-1]))


def test_pca_of_fewer_tokens_than_k_keeps_only_directions_the_stream_spans():
    """``n`` tokens, centred, span at most ``n − 1`` directions: the PCA keeps those (its
    columns orthonormal and spanning the centred stream; reference: float64 projections),
    not an arbitrary rounding-noise direction that would count as held energy (a random
    write's fraction was 0.154 for 5 tokens in 32 dimensions, against 4/32 = 0.125)."""
    from residual_stream.analyses.subspaces import pca_subspace
    from residual_stream.analyses.tokens import real

    model = perturbed()
    for text, n in (("abcd", 5), ("a", 2)):  # BOS + the text's bytes
        tr = rs.trace(model, text)
        basis = pca_subspace(tr, k=16).basis.double()
        assert basis.shape == (32, n - 1)
        torch.testing.assert_close(basis.T @ basis, torch.eye(n - 1, dtype=torch.float64),
                                   atol=1e-6, rtol=0)
        x = real(tr.stream(3), tr.attention_mask).double()
        x = x - x.mean(0)
        assert (x - x @ basis @ basis.T).norm() <= 1e-5 * x.norm()  # it spans the stream
        w = torch.randn(20000, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
        held = float(((w @ basis).square().sum(-1) / w.square().sum(-1)).mean())
        assert held == pytest.approx((n - 1) / 32, rel=0.03)  # Monte Carlo: ±1 % at 20k draws


@pytest.mark.parametrize("k", [5, 40])  # a tall map (d > k) and a wide one (d < k)
def test_read_measures_against_a_float64_svd(k):
    """One product with the left singular vectors gives both read measures: checked against
    ``‖w P‖²/‖w‖²`` and ``‖w M‖/(σ_max ‖w‖)`` from a float64 SVD, with a rank-deficient map,
    a repeated one, padding left out and token chunks smaller than the tokens."""
    from residual_stream.analyses import subspace_measures as S

    g = torch.Generator().manual_seed(0)
    d, tokens = 12, 9
    M = torch.randn(3, d, k, generator=g)
    M[1, :, 1] = M[1, :, 0] * 2.0                      # rank deficient
    M[2] = M[0]                                         # a repeated map
    x = torch.randn(tokens, 4, d, generator=g)          # (token, write, d)
    x[3, 2] = 0.0                                       # a zero write: fraction 0, not NaN
    weight = torch.ones(tokens, dtype=torch.bool)
    weight[[1, 7]] = False                              # padding
    slots = torch.tensor([3, 0, 2])
    frac, strength = S.read_sums(x, M, slots, weight)
    chunked = S.CHUNK_ELEMENTS
    try:
        S.CHUNK_ELEMENTS = 2 * 3 * 3 * min(d, k)        # two tokens per chunk
        frac2, strength2 = S.read_sums(x, M, slots, weight)
    finally:
        S.CHUNK_ELEMENTS = chunked
    U, sv, _ = torch.linalg.svd(M.double(), full_matrices=False)
    P = [u[:, s > 1e-6 * s.max()] for u, s in zip(U, sv, strict=True)]
    w = x[weight][:, slots].double()                    # (real token, write, d)
    energy = w.pow(2).sum(-1).clamp_min(1e-30)
    ref_frac = torch.stack([(w @ p).pow(2).sum(-1) / energy for p in P], -1).sum(0)
    ref_strength = torch.stack([(w @ m.double()).norm(dim=-1) / (s.max() * energy.sqrt())
                                for m, s in zip(M, sv, strict=True)], -1).sum(0)
    for got in (frac, frac2):
        torch.testing.assert_close(got, ref_frac, atol=1e-5, rtol=1e-5)
    for got in (strength, strength2):
        torch.testing.assert_close(got, ref_strength, atol=1e-5, rtol=1e-5)


# d = 12 and the heads' total width D = 48: 5 tokens take the direct route (T·d·D = 2,880
# multiply-adds against T·d² + d²·D = 7,632), 40 tokens the Gram route (23,040 against 12,672)
@pytest.mark.parametrize("tokens", [5, 40])
def test_write_fractions_against_float64_projections(tokens):
    from residual_stream.analyses import subspace_measures as S

    g = torch.Generator().manual_seed(1)
    d = 12
    x = torch.randn(tokens, d, generator=g) * torch.rand(tokens, 1, generator=g) * 10
    x[2] = 0.0                                          # a zero write counts 0
    weight = torch.ones(tokens, dtype=torch.bool)
    weight[-1] = False                                  # padding
    subs = [mean_direction(d), Subspace.from_vectors("probe", torch.randn(d, 3, generator=g))]
    heads = S._bases(torch.randn(8, d, 6, generator=g))[0]           # 8 heads' write bases
    named, per_head = S.write_sums(x, subs, heads, weight)
    w = x[weight].double()
    energy = w.pow(2).sum(-1).clamp_min(1e-30)
    ref_named = torch.stack([(w @ s.basis.double()).pow(2).sum(-1) / energy for s in subs]).sum(-1)
    ref_heads = torch.stack([(w @ q.double()).pow(2).sum(-1) / energy for q in heads]).sum(-1)
    torch.testing.assert_close(named, ref_named, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(per_head, ref_heads, atol=1e-5, rtol=1e-5)
    stored = heads.permute(1, 0, 2).contiguous().permute(1, 0, 2)  # as head_write_bases lays out
    torch.testing.assert_close(S.write_sums(x, subs, stored, weight)[1], ref_heads, atol=1e-5,
                               rtol=1e-5)


# --- norm growth ------------------------------------------------------------------------

def test_norm_growth_against_float64_loops():
    tr = rs.trace(perturbed(placement="post"), TEXTS)
    g = rs.norm_growth(tr)
    m = tr.attention_mask.bool()
    for L in range(4):
        x = tr.stream(L).double()
        norms = [x[b, t].norm() for b, t in m.nonzero() if t > 0]
        assert g.mean[L].item() == pytest.approx(float(sum(norms) / len(norms)), rel=1e-5)
        ones = [x[b, t].sum() ** 2 / (32 * x[b, t].pow(2).sum()) for b, t in m.nonzero()]
        assert g.ones_share[L].item() == pytest.approx(float(sum(ones) / len(ones)), abs=1e-6)
        assert g.first_token[L].item() == pytest.approx(float(x[:, 0].norm(dim=-1).mean()), rel=1e-5)
    assert set(g.norm_inputs.norm) == {f"L{L}.ln_resid_{k}" for L in range(3) for k in ("attn", "mlp")}
    assert g.growth[1].item() == pytest.approx((g.mean[2] / g.mean[1]).item())
    # each norm's input as its module receives it (a hook of our own on the next pass), in float64
    seen, model = {}, tr.model
    hooks = [model.module.get_submodule(model.anatomy.norms[name].module_path).register_forward_hook(
        lambda mod, args, out, name=name: seen.__setitem__(name, (args[0].detach().double(), mod.eps)))
        for name in g.norm_inputs.norm]
    try:
        rs.trace(model, TEXTS)
    finally:
        for h in hooks:
            h.remove()
    for row in g.norm_inputs.itertuples():
        x, eps = seen[row.norm]
        assert row.kind == "layernorm"
        assert row.input_norm == pytest.approx(float(x.norm(dim=-1)[m].mean()), rel=1e-5)
        assert row.scale == pytest.approx(float((x.var(-1, unbiased=False) + eps).sqrt()[m].mean()), rel=1e-5)


def test_norm_growth_names_a_multipliers_kind_and_its_scale_of_one():
    """Granite's constant multipliers stand where norms do (on the embeddings and on every
    write): their rows say ``"multiplier"``, and the scale they divide by is exactly 1; the
    final RMSNorm's row says ``"rmsnorm"``, its scale not 1."""
    g = rs.norm_growth(rs.trace(rs.load(build("granite"), tokenizer=ByteTokenizer()), TEXTS))
    frame = g.norm_inputs.set_index("norm")
    constant = frame[frame.kind == "multiplier"]
    writes = {f"L{L}.ln_{k}_out" for L in range(3) for k in ("attn", "mlp")}
    assert set(constant.index) == {"ln_embed"} | writes
    assert (constant.scale == 1.0).all() and (constant.input_norm > 0).all()
    rms = frame[frame.kind == "rmsnorm"]  # pre-norm: only the final norm stands on the stream
    assert list(rms.index) == ["ln_final"] and abs(rms.scale.iloc[0] - 1) > 1e-3


def test_norm_growth_fit_recovers_a_known_rate():
    from residual_stream.analyses.growth import _fit
    mean = torch.tensor([1.0] + [2.0 * 1.5 ** L for L in range(1, 8)])
    rate, r2 = _fit(mean)
    assert rate == pytest.approx(math.log(1.5)) and r2 == pytest.approx(1.0)


def test_massive_activation_is_found_where_planted():
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=2, d_model=32, seed=0)
    with torch.no_grad():
        model.module.embed.weight[ord("Z"), 7] = 5000.0
    tr = rs.trace(model, "aZa")
    hits = rs.norm_growth(tr).massive
    assert len(hits) and set(hits.dim) == {7} and set(hits.token) == {"Z"}
    assert set(hits.point) == {0, 1, 2}  # pre-norm: it is never normalized away
    with torch.no_grad():  # now a 5000 among 31 other coordinates near 10: the token's median
        model.module.embed.weight[ord("Z")] += 10.0  # is ~10 (500×), the point's is far lower
    tr = rs.trace(model, "aaaaZaaaa")
    assert rs.norm_growth(tr).massive.empty
    point = rs.norm_growth(tr, massive_reference="point").massive
    assert set(point.dim) == {7} and set(point.token) == {"Z"}


# --- survival -----------------------------------------------------------------------------

@pytest.mark.parametrize("placement", ["pre", "post", "sandwich", "deepnorm", "parallel"])
def test_survival_shares_sum_to_one(placement):
    s = rs.survival(rs.trace(perturbed(placement=placement), TEXTS))
    torch.testing.assert_close(s.share.nansum(0), torch.ones(s.share.shape[1]), atol=1e-4, rtol=0)


def test_survival_is_identity_in_pre_norm_and_shrinks_through_post_norm():
    pre = rs.survival(rs.trace(perturbed(placement="pre"), TEXTS))
    ret = pre.retention[~pre.retention.isnan() & (pre.born_norm[:, None] > 0)]
    torch.testing.assert_close(ret, torch.ones_like(ret))
    tr = rs.trace(perturbed(placement="post"), TEXTS)
    post = rs.survival(tr)
    # by hand: the embedding at point 1 is the embedding passed through 3 frozen LayerNorms
    e = tr.captured.embeds["embed"].double()
    for name in ("L0.ln_resid_attn", "L0.ln_resid_mlp"):
        e = tr.anatomy.norms[name].apply_linear(e, tr.norm_scale(name).double())
    m = tr.attention_mask.bool()
    expected = e.norm(dim=-1)[m].mean()  # point 1 = after both of block 0's LayerNorms
    assert post.norm[post.sources.index("embed"), 1].item() == pytest.approx(float(expected), rel=1e-5)
    assert not torch.allclose(post.retention[0, 1:], torch.ones(3))


# --- read attribution ---------------------------------------------------------------------

def test_read_attribution_sums_to_one_and_matches_the_framework():
    hf = build("llama")
    model = rs.load(hf, tokenizer=ByteTokenizer())
    captured = {}
    handle = hf.model.layers[2].self_attn.q_proj.register_forward_hook(
        lambda m, a, y: captured.setdefault("q", y.detach()))
    tr = rs.trace(model, TEXTS)
    handle.remove()
    ra = rs.read_attribution(tr, granularity="head", per_token=True)
    torch.testing.assert_close(ra.share.sum(1), torch.ones(len(ra.readers)), atol=1e-4, rtol=0)
    # reconstruct L2's queries from the per-source terms and compare with the framework's q_proj
    parts = tr.decompose_read("L2.attn")
    spec = model.anatomy.norms["L2.ln_attn_in"]
    L = spec.apply_linear(parts.values, tr.norm_scale("L2.ln_attn_in"))
    W_Q = model.weights(2).W_Q
    terms = torch.einsum("sbpd,hdk->sbphk", L, W_Q)
    q = captured["q"].view(*terms.shape[1:3], 4, -1)
    m = tr.attention_mask.bool()
    assert (terms.sum(0) - q)[m].abs().max() < 1e-5
    # and each source's share is its projection onto the real query
    h, reader = 1, "L2H1.q"
    r = ra.readers.index(reader)
    for i, label in enumerate(parts.labels):
        expected = (terms[i, :, :, h] * q[:, :, h]).sum(-1) / q[:, :, h].pow(2).sum(-1)
        got = ra.per_token[r, ra.sources.index(label)]
        assert (got - expected)[m].abs().max() < 1e-4, label


@pytest.mark.parametrize("name, dense", [("qwen2_moe_dense", 1), ("glm4_moe", 0), ("exaone_moe", 0)])
def test_the_dense_mlp_of_a_model_of_experts_has_its_maps(name, dense):
    """Qwen2-MoE's ``mlp_only_layers`` and GLM-4-MoE's first blocks are dense MLPs: they have
    read and write maps (gate, up and down, checked against the modules' own weights), so
    composition scores their pairs, while the MLPs of experts have none. Before, every MLP of
    such a model was map-less (and a dense block after an MLP of experts lost its gate)."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    mlp = model.module.model.layers[dense].mlp
    w = model.weights(dense)
    torch.testing.assert_close(w.W_in, mlp.up_proj.weight.T.float())
    torch.testing.assert_close(w.W_gate, mlp.gate_proj.weight.T.float())
    torch.testing.assert_close(w.W_out, mlp.down_proj.weight.T.float())
    experts = [L for L in range(model.anatomy.n_layers) if L != dense]
    assert all(model.weights(L).W_in is None for L in experts)
    frame = rs.composition(model).to_frame()
    named = set(frame.writer) | set(frame.reader)
    assert f"L{dense}.mlp" in named and not any(f"L{L}.mlp" in named for L in experts)


def test_an_mlp_of_experts_reads_its_whole_input():
    """A mixture-of-experts MLP (Mixtral) has no single read map: the router and every expert
    read its whole normed input, so its one reader ``L1.mlp.in`` is that input. Reference, by
    hand in float64: each source's part of it (through the frozen RMSNorm) projected on it.
    Composition has no MLP pair to score there (no single map), heads' pairs stay."""
    model = rs.load(build("mixtral"), tokenizer=ByteTokenizer())
    tr = rs.trace(model, TEXTS)
    ra = rs.read_attribution(tr, granularity="head", per_token=True)
    assert [r for r in ra.readers if ".mlp" in r] == [f"L{L}.mlp.in" for L in range(3)]
    parts = tr.decompose_read("L1.mlp")
    spec = model.anatomy.norms["L1.ln_mlp_in"]
    terms = spec.apply_linear(parts.values.double(), tr.norm_scale("L1.ln_mlp_in").double())
    u, m = tr.read_input("L1.mlp").double(), tr.attention_mask.bool()
    assert (terms.sum(0) - u)[m].abs().max() < 1e-5 * u[m].abs().max()  # the parts make the input
    r = ra.readers.index("L1.mlp.in")
    for i, label in enumerate(parts.labels):
        expected = (terms[i] * u).sum(-1) / u.pow(2).sum(-1)
        assert (ra.per_token[r, ra.sources.index(label)] - expected)[m].abs().max() < 1e-5, label
    comp = rs.composition(model)
    assert comp.max_score("in") is None and comp.max_score("mlp_k") is None
    assert comp.max_score("k") is not None


def test_read_attribution_matrices():
    ra = rs.read_attribution(rs.trace(perturbed(placement="post"), TEXTS))
    comp = ra.matrix("component")
    torch.testing.assert_close(torch.tensor(comp.sum(axis=1).values, dtype=torch.float32),
                               torch.ones(len(comp)), atol=1e-4, rtol=0)
    layer = ra.matrix("layer", channel="k")
    assert list(layer.index) == ["L0", "L1", "L2"] and layer.loc["L0", "L2"] == 0


# --- composition ---------------------------------------------------------------------------

def test_composition_against_explicit_matrices():
    """Every head's input LayerNorm folded in, a writer's as a reader's (TransformerLens's
    ``fold_ln``): ``C diag(γ) W`` from the twin's own norm weights, in float64."""
    model = perturbed(norm="layernorm", placement="pre")
    comp = rs.composition(model)
    w0, w2 = model.weights(0), model.weights(2)
    C = torch.eye(32, dtype=torch.float64) - 1 / 32

    def CG(norm):
        spec = model.anatomy.norms[norm]
        return C @ torch.diag(spec.gain(spec.weight).double())

    OV = CG("L0.ln_attn_in") @ w0.W_V[1].double() @ w0.W_O[1].double()
    QK = CG("L2.ln_attn_in") @ w2.W_Q[3].double() @ (CG("L2.ln_attn_in") @ w2.W_K[3].double()).T
    expected = torch.linalg.matrix_norm(OV @ QK.T) / (torch.linalg.matrix_norm(OV)
                                                      * torch.linalg.matrix_norm(QK))
    k = comp.head_to_head[1, comp.heads.index("L0H1"), comp.heads.index("L2H3")]
    assert k.item() == pytest.approx(float(expected), rel=1e-4)
    assert comp.head_to_head[:, comp.heads.index("L2H3"), comp.heads.index("L0H1")].eq(0).all()
    assert 0 < comp.baseline["k"] < 1
    assert len(comp.to_frame().query("kind == 'in'")) == 4 * (3 + 2 + 1)  # L0→L0,L1,L2 …
    mlp = model.weights(1).W_in.double()  # an MLP reads its own block's heads (sequential)
    C1G = C @ torch.diag(model.anatomy.norms["L1.ln_mlp_in"].gain(
        model.anatomy.norms["L1.ln_mlp_in"].weight).double())
    OV1 = CG("L1.ln_attn_in") @ model.weights(1).W_V[2].double() @ model.weights(1).W_O[2].double()
    expected = torch.linalg.matrix_norm(OV1 @ C1G @ mlp) / (
        torch.linalg.matrix_norm(OV1) * torch.linalg.matrix_norm(C1G @ mlp))
    got = comp.head_to_mlp[comp.heads.index("L1H2"), comp.mlps.index("L1.mlp")]
    assert got.item() == pytest.approx(float(expected), rel=1e-4)
    frame = comp.to_frame().query("writer == 'L1H2' and reader == 'L1.mlp'")
    assert frame.score.tolist() == pytest.approx([float(expected)], rel=1e-4)


def test_in_a_parallel_block_neither_composition_nor_ablation_pairs_an_mlp_with_its_own_heads():
    """GPT-NeoX with ``use_parallel_residual``: the MLP reads the block's input, before its
    attention's write is added, so that pair scores 0 and is no pair of the frame or the
    ablation's correlation; the same weights without parallel residual pair them (reference:
    the program's order of ``Read`` and ``Add``)."""
    from tiny_hf import build

    for name, paired in (("gpt_neox_parallel", False), ("gpt_neox_sequential", True)):
        model = rs.load(build(name), tokenizer=ByteTokenizer())
        comp = rs.composition(model)
        same = comp.head_to_mlp[[comp.heads.index(f"L1H{h}") for h in range(model.anatomy.n_heads)],
                                comp.mlps.index("L1.mlp")]
        assert bool((same > 0).all()) == paired and bool((same == 0).all()) != paired
        pairs = set(zip(*comp.to_frame().query("kind == 'in'")[["writer", "reader"]].values.T,
                        strict=True))
        assert (("L1H0", "L1.mlp") in pairs) == paired and ("L0H0", "L1.mlp") in pairs
        check = rs.ablation_check(rs.trace(model, TEXTS[:2]), writes=["L0.attn", "L1.attn"])
        frame = check.to_frame()
        assert (("L1.attn", "L1.mlp") in set(zip(frame.write, frame.reader, strict=True))) == paired
        assert ("L0.attn", "L1.attn") in set(zip(frame.write, frame.reader, strict=True))


QK_NORM_COS_TOL = 1e-5  # 1 − cosine between float32 vectors of 16 entries computed two ways


@pytest.mark.parametrize("name", ["qwen3", "olmo2", "olmo3", "gemma3_text", "apertus", "exaone4", "glm4_moe",
                                  "exaone_moe", "hunyuan_v1_dense", "llama", "kolibri1", "flint", "dots1",
                                  "flex_olmo", "minimax_m2"])
def test_attention_read_maps_reproduce_the_frameworks_queries_and_keys(name):
    """``attention_read_maps`` against the framework's own queries and keys, after Qwen3's
    per-head, OLMo 2's all-heads and Gemma 3's ``1 + γ`` query/key RMSNorms (Llama has
    none: its projections): from the stream entering the block, ``x @ q[h]`` is parallel
    to head ``h``'s query with a positive factor per token (the frozen scales). Without the
    query/key norms' gains (perturbed away from 1 by ``build``) it is not, so composition
    would score a different bilinear form than the one the model attends with. Hunyuan's
    norms follow the rotary embedding, so its queries are compared at position 0, where that
    embedding is the identity."""
    from residual_stream.analyses.composition import attention_read_maps

    model = rs.load(build(name), tokenizer=ByteTokenizer())
    a, L = model.anatomy, 1
    attn = model.module.model.layers[L].self_attn
    names = tuple(p.split(".")[-1] for p in a.modules.qk_norms or ("q_proj", "k_proj"))
    assert (a.modules.qk_norms is not None) == (name != "llama")
    seen = {}
    hooks = [getattr(attn, n).register_forward_hook(
        lambda mod, args, out, n=n: seen.__setitem__(n, out.detach())) for n in names]
    try:
        tr = rs.trace(model, TEXTS[:2])
    finally:
        for h in hooks:
            h.remove()
    x, w = tr.stream(L), model.weights(L)
    maps = attention_read_maps(model, L)
    mask = tr.attention_mask.bool()
    if name == "hunyuan_v1_dense":  # (after the rotary embedding: at position 0 alone)
        mask[:, 1:] = False
    for kind, n, groups in (("q", names[0], a.n_heads), ("k", names[1], a.n_kv_heads)):
        actual = seen[n]
        if actual.ndim == 4 and actual.shape[1:3] == (groups, x.shape[1]):  # Gemma 3: heads first
            actual = actual.transpose(1, 2)
        actual = actual.reshape(*x.shape[:2], groups, a.d_head)
        actual = actual.repeat_interleave(a.n_heads // groups, 2)         # (b, p, head, d_head)
        for W, exact in ((maps["qk".index(kind)], True), (getattr(w, f"W_{kind.upper()}"), False)):
            if not exact:
                W = model.anatomy.norms[f"L{L}.ln_attn_in"].fold_into(W) \
                    if f"L{L}.ln_attn_in" in model.anatomy.norms else W
            pred = torch.einsum("bpd,hdk->bphk", x, W)
            cos = torch.nn.functional.cosine_similarity(pred, actual, dim=-1)[mask]
            if exact or name == "llama":
                assert (1 - cos).abs().max() <= QK_NORM_COS_TOL, (kind, exact)
            else:
                assert (1 - cos).max() > 100 * QK_NORM_COS_TOL, kind  # the gains matter


def _by_head(out: torch.Tensor, batch_pos: tuple[int, int], heads: int, d_head: int) -> torch.Tensor:
    """A query/key module's output as ``(batch, pos, head, d_head)``, whatever its layout."""
    if out.ndim == 4 and out.shape[1:3] == (heads, batch_pos[1]):  # Gemma 3: heads first
        out = out.transpose(1, 2)
    return out.reshape(*batch_pos, heads, d_head)


READ_QK_ATOL = 1e-4  # a token's share, float32 model against float64 from its own outputs


@pytest.mark.parametrize("name", ["qwen3", "olmo2", "olmo3", "gemma3_text", "apertus", "exaone4", "glm4_moe",
                                  "kolibri1", "flint", "dots1", "flex_olmo"])
def test_read_attribution_of_a_query_is_of_the_query_the_model_attends_with(name):
    """With a query norm after ``W_Q`` (Qwen3 per head, OLMo 2 over all heads, Gemma 3's
    ``1 + γ``), a source's share of a head's query is its projection onto the *normed* query
    the framework computes: source ``i`` adds ``t_i = L(c_i) W_Q`` to the raw query ``q``
    (checked against ``q_proj``), and the norm, its scale frozen, scales each coordinate by
    ``n_k / q_k`` (``n``: the norm's output), so the share is ``Σ_k t_ik n_k² / q_k / ‖n‖²``
    in float64. The raw query's shares (no gains) differ."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    a, L, h = model.anatomy, 1, 1
    attn = model.module.model.layers[L].self_attn
    seen = {}
    hooks = [getattr(attn, n).register_forward_hook(
        lambda mod, args, out, n=n: seen.__setitem__(n, out.detach())) for n in ("q_proj", "q_norm")]
    try:
        tr = rs.trace(model, TEXTS[:2])
    finally:
        for hook in hooks:
            hook.remove()
    ra = rs.read_attribution(tr, granularity="head", per_token=True)
    parts = tr.decompose_read(f"L{L}.attn")
    norm = f"L{L}.ln_attn_in"
    values = parts.values if norm not in a.norms else \
        a.norms[norm].apply_linear(parts.values, tr.norm_scale(norm))
    terms = torch.einsum("sbpd,dk->sbpk", values.double(), model.weights(L).W_Q[h].double())
    bp = tuple(tr.attention_mask.shape)
    q = _by_head(seen["q_proj"], bp, a.n_heads, a.d_head)[:, :, h].double()
    n = _by_head(seen["q_norm"], bp, a.n_heads, a.d_head)[:, :, h].double()
    m = tr.attention_mask.bool()
    assert (terms.sum(0) - q)[m].abs().max() < 1e-4                 # the raw query, rebuilt
    r, raw_off = ra.readers.index(f"L{L}H{h}.q"), 0.0
    for i, label in enumerate(parts.labels):
        expected = (terms[i] * n.pow(2) / q).sum(-1) / n.pow(2).sum(-1)
        got = ra.per_token[r, ra.sources.index(label)].double()
        assert (got - expected)[m].abs().max() < READ_QK_ATOL, label
        raw = (terms[i] * q).sum(-1) / q.pow(2).sum(-1)
        raw_off = max(raw_off, float((got - raw)[m].abs().max()))
    assert raw_off > 10 * READ_QK_ATOL  # the gains change the shares


# --- lens and direct logit attribution ------------------------------------------------------

def test_logit_lens_is_the_model_at_the_last_point_and_the_norm_elsewhere():
    model = perturbed(norm="rmsnorm", placement="pre")
    tr = rs.trace(model, TEXTS)
    lens = rs.logit_lens(tr)
    m = tr.attention_mask.bool()
    assert lens.kl[-1][m].abs().max() < 1e-5 and lens.top1_agree[-1][m].all()
    x = tr.stream(1).double()
    spec = model.anatomy.norms["ln_final"]
    by_hand = (spec.apply(x) @ model.unembed().W_U.double()).log_softmax(-1)
    final = tr.logits.double().log_softmax(-1)
    kl = (final.exp() * (final - by_hand)).sum(-1)
    assert (lens.kl[1] - kl)[m].abs().max() < 1e-4


def test_dla_sums_to_the_logit_and_refuses_nonlinear_heads():
    model = perturbed(placement="post")
    tr = rs.trace(model, TEXTS)
    dla = rs.direct_logit_attribution(tr, target="next")
    got = tr.logits.gather(-1, dla.targets[..., None])[..., 0]
    assert (dla.total() - got)[tr.attention_mask.bool()].abs().max() < 1e-4
    for r, n in enumerate(tr.attention_mask.sum(-1).tolist()):  # reference: each row by hand
        want = tr.tokens[r, 1:n].tolist() + [int(tr.logits[r, n - 1].argmax())]  # never a pad
        assert dla.targets[r, :n].tolist() == want
    assert len(set(tr.attention_mask.sum(-1).tolist())) > 1  # rows of several lengths
    each = dla.to_frame("each")  # per contribution and real token: it sums to the model's logit
    per_token = each.groupby(["batch", "pos"]).logit.sum()
    m = tr.attention_mask.bool()
    rows, pos = m.nonzero(as_tuple=True)
    want = got[rows, pos] - dla.bias[rows, pos]
    assert (torch.tensor(per_token.loc[list(zip(rows.tolist(), pos.tolist(), strict=True))].values)
            - want).abs().max() < 1e-4
    assert len(each) == len(dla.labels) * int(m.sum())
    first = each[each.label == dla.labels[0]]
    assert list(first.token) == [t for row in tr.str_tokens for t in row]
    assert list(first.target) == dla.targets[rows, pos].tolist() and "baseline" not in each
    diff = rs.direct_logit_attribution(tr, target="next", baseline=tr.tokens).to_frame("each")
    assert list(diff[diff.label == dla.labels[0]].baseline) == tr.tokens[rows, pos].tolist()
    answers = [7, 65]  # one id per row, at every position: each row's own logit difference
    per_row = rs.direct_logit_attribution(tr, target=answers, baseline=66)
    want = tr.logits[:, :, answers].diagonal(dim1=0, dim2=2).T - tr.logits[:, :, 66]  # [batch, pos]
    assert (per_row.total() - want)[m].abs().max() < 1e-4
    assert per_row.targets[:, 0].tolist() == answers and bool((per_row.baselines == 66).all())
    last = tr.attention_mask.sum(-1) - 1  # each row's last real token, by hand
    by_hand = torch.stack([dla.values[:, r, int(last[r])] for r in range(len(last))], 1).mean(1)
    torch.testing.assert_close(torch.tensor(dla.to_frame("last").logit.values), by_hand)
    assert not torch.allclose(by_hand, torch.tensor(dla.to_frame().logit.values), atol=1e-3)
    torch.testing.assert_close(torch.tensor(dla.to_frame().logit.values),
                               torch.tensor(each.groupby("label", sort=False).logit.mean().values,
                                            dtype=torch.float32))
    bert = rs.load(build("bert_mlm"), tokenizer=ByteTokenizer())
    with pytest.raises(NotAvailableError, match="linear unembedding"):
        rs.direct_logit_attribution(rs.trace(bert, "hello"))
    no_head = rs.load(build("bert"), tokenizer=ByteTokenizer())
    with pytest.raises(NotAvailableError, match="no LM head"):
        rs.logit_lens(rs.trace(no_head, "hello"))


def test_a_head_transform_gives_detached_logits_for_tensors_made_outside_inference_mode():
    """BERT's MLM head transform ran with autograd on for an ordinary tensor (a trace built by
    hand, a user's own states): logits required grad and the lens summary's ``numpy()``
    raised. Reference: the HF head (``cls``) on the same final-normed states, under no_grad."""
    bert = rs.load(build("bert_mlm"), tokenizer=ByteTokenizer())
    h = torch.randn(2, 3, bert.anatomy.d_model)
    logits = bert.unembed().logits(h)
    assert not logits.requires_grad
    with torch.no_grad():
        want = bert.module.cls(h)
    torch.testing.assert_close(logits, want, rtol=1e-5, atol=1e-5)


# --- mixing -----------------------------------------------------------------------------------

def test_mixing_ratio_by_hand_for_one_layer():
    model = perturbed(norm="layernorm", placement="post", attn_only=True)
    tr = rs.trace(model, ["abc"], patterns=True)
    mix = rs.mixing_ratio(tr)
    A, u = tr.patterns[0][0].double(), tr.read_input("L0.attn")[0].double()
    x = tr.decompose_read("L0.attn").total()[0].double()
    w = model.weights(0)
    spec, s = model.anatomy.norms["L0.ln_resid_attn"], tr.norm_scale("L0.ln_resid_attn")[0].double()
    P = A.shape[-1]
    for i in range(P):
        terms = [sum(A[h, i, j] * u[j] @ w.W_V[h].double() @ w.W_O[h].double() for h in range(4))
                 for j in range(P)]
        ctx = spec.apply_linear(sum(terms[j] for j in range(P) if j != i) + 0 * x[i], s[i])
        own = spec.apply_linear(terms[i] + x[i], s[i])
        expected = ctx.norm() / (ctx.norm() + own.norm())
        assert mix.norm_res_ln[0, 0, i].item() == pytest.approx(float(expected), abs=1e-5)
        assert mix.weight_res[0, 0, i].item() == pytest.approx(float((1 - A[:, i, i].mean()) / 2))
    assert mix.norm_res_ln[0, 0, 0].item() == pytest.approx(0.0, abs=1e-6)  # causal: no context


def test_mixing_needs_patterns():
    with pytest.raises(NotAvailableError, match="patterns=True"):
        rs.mixing_ratio(rs.trace(perturbed(), "hi"))


# --- ablation --------------------------------------------------------------------------------

def test_mean_ablating_a_constant_write_changes_nothing():
    model = perturbed(norm="layernorm", placement="pre")
    with torch.no_grad():  # L0's MLP now writes the same vector at every token
        model.module.blocks[0].mlp.fc_out.weight.zero_()
        model.module.blocks[0].mlp.fc_out.bias.normal_()
    tr = rs.trace(model, TEXTS)
    mean = rs.ablation_check(tr, writes=["L0.mlp", "L1.attn"], mode="mean")
    row = mean.effect[0][~mean.effect[0].isnan()]
    assert row.abs().max() < 1e-5 and abs(mean.logit_kl[0]) < 1e-6
    assert mean.effect[1][~mean.effect[1].isnan()].max() > 1e-3
    zero = rs.ablation_check(tr, writes=["L0.mlp"], mode="zero")
    assert zero.effect[0][~zero.effect[0].isnan()].max() > 1e-3
    assert -1 <= mean.spearman <= 1
    assert len(mean.to_frame()) == 5 + 2  # L0.mlp → 5 later readers, L1.attn → 2



ABLATION_TOL = {"rel": 1e-3, "abs": 1e-6}  # float32 passes of a tiny model: hook against weight surgery


def _surgery(model, write, mode, trace):
    """An independent ablation: a copy of the HF model with ``write`` removed from its weights.

    A head through its columns of the output projection (and, for ``mode="mean"``, its mean
    write, taken from a hook of the test's own, folded into the projection's bias); a whole
    MLP or attention by zeroing its output projection.
    """
    import copy

    def proj(m, L):  # Llama's and Gemma's o_proj, NeoX's dense, OPT's out_proj (Linear,
        if hasattr(m, "model") and hasattr(m.model, "decoder"):  # [d_model, H·d_head]),
            return m.model.decoder.layers[L].self_attn.out_proj  # GPT-2's c_proj (Conv1D, transposed)
        if hasattr(m, "model"):
            return m.model.layers[L].self_attn.o_proj
        if hasattr(m, "gpt_neox"):
            return m.gpt_neox.layers[L].attention.dense
        return m.transformer.h[L].attn.c_proj

    module = copy.deepcopy(model.module)
    L, rest = write[1:].split("H") if "H" in write else write[1:].split(".")
    L = int(L)
    if rest in ("mlp", "attn"):
        seen = []  # a whole attention's mean write: its projection's output, by a hook of ours
        handle = proj(model.module, L).register_forward_hook(lambda m, args, out: seen.append(out.detach()))
        with torch.no_grad():
            model.module(input_ids=trace.tokens, attention_mask=trace.attention_mask)
        handle.remove()
        with torch.no_grad():
            if rest == "mlp":  # Llama's down_proj; OPT's fc2 (on flat tokens, with a bias)
                base = module.model
                block = base.decoder.layers[L] if hasattr(base, "decoder") else base.layers[L]
                weights = (block.fc2.weight, block.fc2.bias) if hasattr(block, "fc2") else (
                    block.post_feedforward_layernorm_1.weight, block.post_feedforward_layernorm_2.weight) \
                    if hasattr(block, "experts") else (block.mlp.down_proj.weight,)  # Gemma 4's: both gains
            for w in (weights if rest == "mlp" else (proj(module, L).weight, proj(module, L).bias)):
                w.zero_()
            if mode == "mean":
                assert rest == "attn"
                proj(module, L).bias += seen[0][trace.attention_mask.bool()].double().mean(0).float()
        return module
    h, k = int(rest), model.anatomy.d_head
    seen = []
    handle = proj(model.module, L).register_forward_pre_hook(lambda m, args: seen.append(args[0].detach()))
    with torch.no_grad():
        model.module(input_ids=trace.tokens, attention_mask=trace.attention_mask)
    handle.remove()
    z, target = seen[0][..., h * k:(h + 1) * k].double(), proj(module, L)
    linear = not hasattr(module, "transformer")
    with torch.no_grad():
        W = (target.weight[:, h * k:(h + 1) * k].T if linear else target.weight[h * k:(h + 1) * k]).double()
        (target.weight[:, h * k:(h + 1) * k] if linear else target.weight[h * k:(h + 1) * k]).zero_()
        if mode == "mean":
            target.bias += (z[trace.attention_mask.bool()].mean(0) @ W).float()
    return module


@pytest.mark.parametrize(("name", "write", "mode"), [("llama", "L1H2", "zero"), ("llama", "L1.mlp", "zero"),
                                                     ("gpt2", "L0H1", "mean"), ("gpt2", "L1H0", "reference"),
                                                     ("gpt2", "L0.attn", "zero"), ("gemma2", "L1H1", "zero"),
                                                     ("gpt2", "L1.attn", "reference"),
                                                     ("gpt_neox_parallel", "L0H1", "mean"),
                                                     ("opt", "L1.mlp", "zero"), ("opt", "L0H1", "mean"),
                                                     ("gemma4_moe", "L1.mlp", "zero")])
def test_ablation_of_a_head_or_an_mlp_matches_weight_surgery(name, write, mode):
    """One head (or a whole MLP) ablated by the hook against the same ablation made in the
    weights of a copy of the model: the later reads' changes (the same block's MLP reading the
    ablated attention's write included), and the output's changes: KL
    over real tokens and at each row's last token (float64 from the copy's logits), the
    clean top token's logit, and the next-token loss as Hugging Face computes it
    (``labels=``, pads ignored). ``"reference"``: mean-ablation with the means of another
    trace's tokens (a head's ``z``, an attention's output, by hooks of the test's own)."""
    module = build(name)
    with torch.no_grad():  # writes large enough that every change is far above rounding
        for n, w in module.named_parameters():
            if n.endswith(("o_proj.weight", "down_proj.weight", "c_proj.weight", "attention.dense.weight")):
                w.mul_(25)
    model = rs.load(module, tokenizer=ByteTokenizer())
    trace = rs.trace(model, TEXTS)
    reference = rs.trace(model, ["Other prompts give other means.", "zq"]) if mode == "reference" else None
    mode = "mean" if reference else mode
    last = trace.attention_mask.sum(1) - 1

    def diff(logits):  # a logit difference at each row's last real token
        return (logits[torch.arange(len(last)), last, 5] - logits[torch.arange(len(last)), last, 9]).mean()

    check = rs.ablation_check(trace, writes=[write], mode=mode, reference=reference, metric=diff)
    ablated = _surgery(model, write, mode, reference or trace)
    assert check.reference == (None if reference is None else tuple(reference.tokens.shape))
    if reference:  # not the trace's own means: those give another result
        own = rs.ablation_check(trace, writes=[write], mode=mode, reads=False).outputs().iloc[0]
        assert abs(own.logit_kl - check.outputs().logit_kl[0]) > 1e-3 * check.outputs().logit_kl[0]
    mask = trace.attention_mask
    labels = trace.tokens.masked_fill(mask == 0, -100)
    with torch.no_grad():
        clean = model.module(input_ids=trace.tokens, attention_mask=mask, labels=labels)
        out = ablated(input_ids=trace.tokens, attention_mask=mask, labels=labels)
    p, q = (torch.log_softmax(o.logits.double(), -1) for o in (clean, out))
    kl = (p.exp() * (p - q)).sum(-1)
    last = mask.sum(1) - 1
    top = clean.logits.argmax(-1, keepdim=True)
    dtop = (out.logits.gather(-1, top) - clean.logits.gather(-1, top))[..., 0].double()
    row = check.outputs().iloc[0]
    assert row.logit_kl == pytest.approx(float(kl[mask.bool()].mean()), **ABLATION_TOL)
    assert row.last_kl == pytest.approx(float(kl[torch.arange(len(last)), last].mean()), **ABLATION_TOL)
    assert row.top_logit_change == pytest.approx(float(dtop[mask.bool()].mean()), **ABLATION_TOL)
    assert row.loss_change == pytest.approx(float(out.loss - clean.loss), **ABLATION_TOL)
    assert check.metric_clean == pytest.approx(float(diff(clean.logits.double())), abs=1e-4)
    want = float(diff(out.logits.double()) - diff(clean.logits.double()))
    assert row.metric_change == pytest.approx(want, abs=1e-4) and abs(want) > 1e-3
    assert row.logit_kl > 1e-4 and row.last_kl != pytest.approx(row.logit_kl, rel=1e-3)
    alone = rs.ablation_check(trace, writes=[write], mode=mode, reads=False, reference=reference,
                              metric=diff)
    assert alone.outputs().iloc[0, 1:].tolist() == pytest.approx(row.iloc[1:].tolist(), rel=1e-6)
    assert bool(alone.effect.isnan().all() and alone.linear.isnan().all()) and len(alone.to_frame()) == 0
    other = rs.trace(rs.load(ablated, tokenizer=ByteTokenizer()), TEXTS)
    frame = check.to_frame()
    assert len(frame) > 0
    for reader, effect in zip(frame.reader, frame.effect, strict=True):
        before, after = trace.read_input(reader), other.read_input(reader)
        ratio = ((after - before).norm(dim=-1) / before.norm(dim=-1))[mask.bool()].mean()
        assert effect == pytest.approx(float(ratio), **ABLATION_TOL)


@pytest.mark.parametrize(("name", "write"), [("llama", "L1H2"), ("gpt2", "L0.attn"), ("llama", "L0.mlp")])
def test_patching_a_write_from_another_run_matches_hooks_of_our_own(name, write):
    """Activation patching (``mode="patch"``): the write at every position taken from a run of
    other texts of the same token shape. Reference: the Hugging Face module run twice with
    hooks of the test's own, recording the other run's projection input (a head's slice of
    ``z``) or output (a whole attention or MLP) and writing it into the clean run; the metric
    and KL computed in float64 from its logits."""
    module = build(name)
    with torch.no_grad():
        for n, w in module.named_parameters():
            if n.endswith(("o_proj.weight", "down_proj.weight", "c_proj.weight")):
                w.mul_(25)
    model = rs.load(module, tokenizer=ByteTokenizer())
    trace = rs.trace(model, TEXTS)
    other = rs.trace(model, [t[::-1] for t in TEXTS])  # same lengths, other tokens
    last = trace.attention_mask.sum(1) - 1

    def diff(logits):
        return (logits[torch.arange(len(last)), last, 101] - logits[torch.arange(len(last)), last, 32]).mean()

    check = rs.ablation_check(trace, writes=[write], mode="patch", reference=other, metric=diff,
                              reads=False)
    L, rest = write[1:].split("H") if "H" in write else write[1:].split(".")
    layer = module.model.layers[int(L)] if name == "llama" else module.transformer.h[int(L)]
    target = layer.mlp.down_proj if rest == "mlp" else layer.self_attn.o_proj if name == "llama" \
        else layer.attn.c_proj
    k, seen = model.anatomy.d_head, []
    head = slice(int(rest) * k, (int(rest) + 1) * k) if rest.isdigit() else None

    def record(m, args, out):
        seen.append(args[0].detach().clone() if head else out.detach().clone())

    def patch(m, args, out):
        if head is None:
            return seen[0]
        z = args[0].clone()
        z[..., head] = seen[0][..., head]
        return torch.nn.functional.linear(z, m.weight, m.bias)  # Llama's o_proj, a Linear

    mask = trace.attention_mask
    with torch.no_grad():
        handle = target.register_forward_hook(record)
        module(input_ids=other.tokens, attention_mask=other.attention_mask)
        handle.remove()
        clean = module(input_ids=trace.tokens, attention_mask=mask).logits.double()
        handle = target.register_forward_hook(patch)
        patched = module(input_ids=trace.tokens, attention_mask=mask).logits.double()
        handle.remove()
    at = torch.zeros_like(mask, dtype=torch.bool)  # each row's last real token only
    at[torch.arange(len(last)), last] = True

    def patch_last(m, args, out):
        if head is None:
            return torch.where(at[..., None], seen[0], out)
        z = args[0].clone()
        z[..., head] = torch.where(at[..., None], seen[0][..., head], z[..., head])
        return torch.nn.functional.linear(z, m.weight, m.bias)

    with torch.no_grad():
        handle = target.register_forward_hook(patch_last)
        patched_last = module(input_ids=trace.tokens, attention_mask=mask).logits.double()
        handle.remove()
        theirs = module(input_ids=other.tokens, attention_mask=other.attention_mask).logits.double()
    p, q = clean.log_softmax(-1), patched.log_softmax(-1)
    kl = (p.exp() * (p - q)).sum(-1)[mask.bool()].mean()
    row = check.outputs().iloc[0]
    assert row.logit_kl == pytest.approx(float(kl), **ABLATION_TOL) and row.logit_kl > 1e-3
    assert row.metric_change == pytest.approx(float(diff(patched) - diff(clean)), **ABLATION_TOL)
    assert check.metric_reference == pytest.approx(float(diff(theirs)), **ABLATION_TOL)
    assert row.metric_share == pytest.approx(
        float((diff(patched) - diff(clean)) / (diff(theirs) - diff(clean))), **ABLATION_TOL)
    for positions in (-1, [-1], at):  # the last token only: an index from the end, or a mask
        only = rs.ablation_check(trace, writes=[write], mode="patch", reference=other, metric=diff,
                                 reads=False, positions=positions)
        assert only.outputs().metric_change[0] == pytest.approx(
            float(diff(patched_last) - diff(clean)), **ABLATION_TOL)
        assert torch.equal(only.positions, at)
    assert abs(float(diff(patched_last) - diff(patched))) > 1e-3  # other positions mattered
    mean = rs.ablation_check(trace, writes=[write], mode="mean", reference=other, reads=False)
    assert abs(mean.logit_kl[0] - row.logit_kl) > 1e-3 * row.logit_kl  # patching is not the mean


def test_a_metric_that_edits_its_logits_leaves_the_trace_as_it_was():
    """A metric is the user's code: one that writes into the logits it is given must not
    change ``trace.logits``, which every later analysis reads."""
    tr = rs.trace(perturbed(), TEXTS)
    before = tr.logits.clone()

    def rude(logits):
        logits.zero_()
        return 1.0

    check = rs.ablation_check(tr, writes=["L0.mlp"], reads=False, metric=rude)
    assert torch.equal(tr.logits, before) and check.metric_clean == 1.0 and check.logit_kl[0] > 0


def test_a_heads_linear_share_is_its_own():
    """A head's ``linear`` is its head-granularity read share (readers' channels averaged), a
    whole attention's that of the summed write; the attention's heads together move later
    reads, and each head alone moves them less than all of them."""
    model = perturbed()
    trace = rs.trace(model, TEXTS)
    H = model.anatomy.n_heads
    check = rs.ablation_check(trace, writes=["L0.attn", *[f"L0H{h}" for h in range(H)]], mode="zero")
    shares = rs.read_attribution(trace, granularity="head").to_frame()
    j = check.readers.index("L1.mlp")
    for h in range(H):
        mine = shares[(shares.source == f"L0H{h}") & shares.reader.str.startswith("L1.mlp.")]
        assert float(check.linear[1 + h, j]) == pytest.approx(mine.abs_share.mean(), rel=1e-5)
    whole = rs.read_attribution(trace).matrix("component", absolute=True).at["L1.mlp", "L0.attn"]
    assert float(check.linear[0, j]) == pytest.approx(float(whole), rel=1e-5)
    assert bool((check.effect[1:, j] < check.effect[0, j]).all())

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_unembed_subspace_is_the_top_singular_space_of_the_folded_unembedding(dtype, monkeypatch):
    """Built slice by slice from the head's own weight (100-column slices of 257), it spans the
    top-k left singular vectors of an SVD of the whole folded matrix in float64."""
    from tiny_hf import build

    from residual_stream.analyses.subspaces import unembed_subspace
    from residual_stream.inputs import ByteTokenizer

    m = rs.load(build("llama").to(dtype), tokenizer=ByteTokenizer())
    monkeypatch.setattr("residual_stream.analyses.subspaces.VOCAB_SLICE", 100)
    k = 8
    got = unembed_subspace(m, k).basis.double()
    spec = m.anatomy.norms["ln_final"]
    W = m.module.lm_head.weight.detach().T.float()                     # [d_model, vocab]
    M = (W * (spec.weight.float() + spec.weight_offset)[:, None]).double()  # RMSNorm: no centering
    U = torch.linalg.svd(M, full_matrices=False).U[:, :k]
    assert got.shape == U.shape
    assert float((got @ got.T - U @ U.T).abs().max()) < 1e-6  # the same projector


def test_composition_top_matches_the_frame_and_refuses_what_the_model_lacks():
    """``top`` returned an empty frame for a reader the model lacks ("L9H9") or a kind it
    does not read by ("K"), which reads as "no composition". Reference: ``to_frame`` filtered
    and sorted by hand, for every kind of reader."""
    from residual_stream.errors import InputError, UnknownNameError

    comp = rs.composition(perturbed())
    frame = comp.to_frame()
    for reader, kind in (("L2H1", "k"), ("L2H1", "q"), ("L1H0", "v"), ("L2H1", "mlp_k"),
                         ("L2.mlp", "in"), ("L0H0", "k")):
        want = frame[(frame.reader == reader) & (frame.kind == kind)]
        want = want.sort_values("score", ascending=False, kind="stable").head(4)
        got = comp.top(reader, kind, n=4)
        # L0H0 sees no head; L2H1 sees the MLPs of L0 and L1 only
        assert len(want) == (0 if reader == "L0H0" else 2 if kind == "mlp_k" else 4), (reader, kind)
        assert got.writer.tolist() == want.writer.tolist(), (reader, kind)
        assert got.score.tolist() == pytest.approx(want.score.tolist())
        assert set(got.baseline) <= set(want.baseline) and set(got.kind) <= {kind}
    assert comp.top("L2.mlp", n=4).kind.tolist() == ["in"] * 4  # an MLP's default kind
    assert comp.top("L2H1").equals(comp.top("L2H1", "k"))
    with pytest.raises(UnknownNameError, match="no reader 'L9H9': the readers are heads L0H0…L2H3"):
        comp.top("L9H9")
    with pytest.raises(InputError, match="the kind of L2H1's read must be one of"):
        comp.top("L2H1", "K")
    with pytest.raises(InputError, match="the kind of L2.mlp's read must be one of \\['in'\\]"):
        comp.top("L2.mlp", "k")
    attn_only = rs.composition(perturbed(norm="layernorm", placement="post", attn_only=True))
    assert len(attn_only.top("L1H0", "k")) > 0
    with pytest.raises(InputError, match="L1H0 reads no MLP writes: the model has no MLPs"):
        attn_only.top("L1H0", "mlp_k")


def test_logit_lens_frame_holds_every_real_token_at_every_point():
    """``LogitLens.to_frame`` looped over points × tokens with four scalar reads each (0.75 s
    at 8×128 on SmolLM2); now gathered at once. Reference: the same rows read one by one."""
    tr = rs.trace(perturbed(), ["abc de", "a much longer text here", "x"])
    lens = rs.logit_lens(tr)
    frame = lens.to_frame()
    real = tr.attention_mask.bool()
    assert len(frame) == lens.kl.shape[0] * int(real.sum())
    for row in frame.sample(40, random_state=0).itertuples():
        p, b, t = row.point, row.batch, row.pos
        assert real[b, t]
        assert row.kl == pytest.approx(float(lens.kl[p, b, t]))
        assert row.top1_agree == bool(lens.top1_agree[p, b, t])
        assert row.final_token_rank == int(lens.final_token_rank[p, b, t])
        assert row.top_token == lens.top_tokens[p][b][t]
        assert row.top_prob == pytest.approx(float(lens.top_probs[p, b, t, 0]))
    assert frame[["point", "batch", "pos"]].duplicated().sum() == 0


# --- head scores -----------------------------------------------------------------------------

def test_head_scores_by_hand():
    """Each score against a float64 loop over the model's own attention patterns (traced
    again from the returned tokens), the losses against ``cross_entropy`` on the module's
    logits, and the tokens: BOS first, then ``length`` random non-special ids, repeated."""
    import numpy as np

    from residual_stream.errors import InputError

    unchecked = getattr(rs.head_scores, "__wrapped__", rs.head_scores)  # past the type checks
    model = perturbed()
    n = 7
    s = rs.head_scores(model, length=n, rows=3, seed=4)
    assert s.start == 1 and bool((s.tokens[:, 0] == 256).all())
    assert "\n" not in repr(s) and f"3 rows of {n} random tokens" in repr(s) and len(repr(s)) < 300
    assert torch.equal(s.tokens[:, 1:1 + n], s.tokens[:, 1 + n:]) and int(s.tokens[:, 1:].max()) < 256
    patterns = rs.trace(model, s.tokens, patterns=True).patterns
    T = 1 + 2 * n
    for L, A in enumerate(patterns):
        A = A.double()
        for h in range(model.anatomy.n_heads):
            prev = [A[r, h, q, q - 1] for r in range(3) for q in range(2, T)]
            dup = [A[r, h, q, q - n] for r in range(3) for q in range(1 + n, T)]
            ind = [A[r, h, q, q - n + 1] for r in range(3) for q in range(1 + n, T)]
            for got, want in ((s.previous_token, prev), (s.duplicate_token, dup), (s.induction, ind)):
                assert float(got[L, h]) == pytest.approx(float(sum(want) / len(want)), abs=1e-6)
    with torch.no_grad():
        logits = model.module(s.tokens).logits.double()
    nll = torch.nn.functional.cross_entropy(logits[:, :-1].transpose(1, 2), s.tokens[:, 1:],
                                            reduction="none")  # position q predicts token q + 1
    assert s.loss_first == pytest.approx(float(nll[:, 1:n].mean()), abs=1e-5)       # tokens 2..n
    assert s.loss_repeat == pytest.approx(float(nll[:, n + 1:].mean()), abs=1e-5)   # repeat's 2..n
    assert list(s.top("previous_token", n=2).previous_token) == sorted(
        s.previous_token.flatten().tolist(), reverse=True)[:2]
    with pytest.raises(InputError, match=r"129 positions, over .* context of 128: use length ≤ 63"):
        rs.head_scores(perturbed(n_ctx=128), length=64)
    for bad in ({"length": 1}, {"length": 2}, {"length": True}, {"rows": 0}, {"rows": True}, {"seed": None},
                {"seed": 1.5}, {"seed": 2**70}, {"length": 10**12}):
        with pytest.raises(InputError, match="length ≥ 3|use length ≤"):
            unchecked(model, **bad)  # refused before anything is drawn or allocated
    assert unchecked(model, length=np.int64(3), rows=1).tokens.shape == (1, 7)
    short = perturbed(n_ctx=20)  # the default length is what fits: (20 − 1) // 2
    assert rs.head_scores(short).tokens.shape == (4, 1 + 2 * 9)


def test_head_scores_draw_a_trained_twins_tokens_from_the_bytes_it_saw_repeated():
    """A bundled twin's probe draws from its recipe's alphabet (twin.json's ``mix.alphabet``),
    not all 256 bytes: on those it predicts the repeat, as its recorded in-context check says
    (there on 8–32-byte segments in text: 9.25 → 0.33 nats). Drawn from every byte it scored
    11.3 → 9.5 and its top induction head 0.35."""
    import json

    from residual_stream.registry import REGISTRY

    model = rs.load("twin-pre-rms")
    recipe = json.loads((REGISTRY["twin-pre-rms"].location() / "twin.json").read_text())["recipe"]
    lo, hi = recipe["mix"]["alphabet"]
    s = rs.head_scores(model)
    drawn = s.tokens[:, s.start:]
    assert int(drawn.min()) >= lo and int(drawn.max()) < hi
    assert len(drawn.unique()) > 0.75 * (hi - lo)  # 200 draws: the whole alphabet, not a corner
    assert s.loss_repeat < 0.3 * s.loss_first  # measured 9.27 → 1.93
    assert float(s.induction.max()) > 0.5
    untrained = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2)
    assert int(rs.head_scores(untrained, rows=16).tokens[:, 1:].max()) > 127  # any byte


class _EndOnly(ByteTokenizer):
    """A byte tokenizer that appends an EOS (257) instead of putting a BOS in front."""

    eos_token_id, all_special_ids = 257, [256, 257]

    def __call__(self, text, add_special_tokens=True, **kw):
        if isinstance(text, list):
            return {"input_ids": [self(t, add_special_tokens)["input_ids"] for t in text]}
        ids = list(text.encode())
        return {"input_ids": ids + [257] if add_special_tokens else ids}


def test_head_scores_put_only_a_leading_special_token_first():
    """BOS (Llama-style, the byte tokenizer), CLS (BERT) or nothing; never an EOS that the
    tokenizer appends; special tokens are never drawn. A masked LM has no next-token loss."""
    import transformers as tf

    cfg = tf.GPT2Config(vocab_size=258, n_embd=32, n_layer=2, n_head=4, n_positions=64)
    eos = rs.load(tf.GPT2LMHeadModel(cfg), tokenizer=_EndOnly())
    s = rs.head_scores(eos, length=20, rows=8)
    assert s.start == 0 and s.tokens.shape == (8, 40) and int(s.tokens.max()) < 256
    mlm = rs.load(build("bert_mlm"), tokenizer=ByteTokenizer())
    s = rs.head_scores(mlm, length=5)
    assert s.start == 1 and bool((s.tokens[:, 0] == 256).all()) and math.isnan(s.loss_first)
    check = rs.ablation_check(rs.trace(mlm, TEXTS), writes=["L0.mlp"])
    assert math.isnan(check.loss_change[0]) and check.logit_kl[0] > 0
    assert check.metric is None and "metric" not in check.outputs()
    no_head = rs.load(build("bert"), tokenizer=ByteTokenizer())
    with pytest.raises(NotAvailableError, match="metric reads logits; .*no LM head"):
        rs.ablation_check(rs.trace(no_head, TEXTS), writes=["L0.mlp"], metric=lambda x: x.mean())


def test_head_spaces_of_a_sandwich_model_are_the_writes_as_added():
    """Gemma 2 puts a norm on the attention's output before adding it: head ``h`` adds
    ``(z_h W_O[h]) ⊙ (1 + γ) / s``, so its write space is the row space of ``W_O[h] diag(1 + γ)``
    (reference: an SVD of the HF module's own ``o_proj`` and ``post_attention_layernorm``
    weights). Head 1's write as added, measured in head 0's space, against that space; and
    against ``W_O``'s own rows it would differ (the gains are not all equal)."""
    from residual_stream.analyses.subspaces import write_vector

    model = rs.load(build("gemma2"), tokenizer=ByteTokenizer())
    tr = rs.trace(model, TEXTS)
    ws = rs.write_subspaces(tr, writes=["L0H1"])
    layer = model.module.model.layers[0]
    k = model.anatomy.d_head
    rows = layer.self_attn.o_proj.weight.detach().double()[:, :k].T     # head 0: [d_head, d]
    gain = 1 + layer.post_attention_layernorm.weight.detach().double()

    def fraction(R):
        U = torch.linalg.svd(R.T, full_matrices=False).U
        w = write_vector(tr, "L0H1")[tr.attention_mask.bool()].double()
        return float(((w @ U).pow(2).sum(-1) / w.pow(2).sum(-1)).mean())

    got = float(ws.head_overlap[0, ws.heads.index("L0H0")])
    assert got == pytest.approx(fraction(rows * gain), abs=1e-5)
    assert abs(got - fraction(rows)) > 1e-3


def test_composition_of_a_sandwich_model_takes_writes_as_added():
    """Gemma 2: head ``i`` adds ``x diag(1 + γ_in^i) W_OV^i diag(1 + γ_out)`` (its input and
    output norms' gains, scales frozen), and head ``j`` reads through ``diag(1 + γ_in) W_Q`` /
    ``W_K``; K-composition from explicit float64 matrices of the HF module's norm weights, and
    it differs from the score without the output gain."""
    model = rs.load(build("gemma2"), tokenizer=ByteTokenizer())
    comp = rs.composition(model)
    w0, w1 = model.weights(0), model.weights(1)
    hf = model.module.model.layers
    g_out = 1 + hf[0].post_attention_layernorm.weight.detach().double()
    g_in = (1 + hf[1].input_layernorm.weight.detach().double())[:, None]
    QK = (g_in * w1.W_Q[0].double()) @ (g_in * w1.W_K[0].double()).T

    def k_score(OV):
        return float(torch.linalg.matrix_norm(OV @ QK.T)
                     / (torch.linalg.matrix_norm(OV) * torch.linalg.matrix_norm(QK)))

    g_in0 = (1 + hf[0].input_layernorm.weight.detach().double())[:, None]
    OV = g_in0 * w0.W_V[1].double() @ w0.W_O[1].double()
    got = comp.head_to_head[1, comp.heads.index("L0H1"), comp.heads.index("L1H0")].item()
    assert got == pytest.approx(k_score(OV * g_out), rel=1e-4)
    assert abs(got - k_score(OV)) > 1e-3 * got


def test_composition_of_a_post_norm_model_follows_the_write_through_the_layernorms():
    """BERT: a write reaches a later reader through every LayerNorm between them, each
    ``C diag(γ)`` with its scale frozen (a positive factor the ratio cancels). Reference in
    float64 from the HF module's own weights (``query``/``key``/``value``/``output.dense``
    columns of each head, ``intermediate``/``output`` dense, each LayerNorm's γ): head → head
    by Q, K and V two blocks on (four LayerNorms), head → its own block's MLP (one), MLP →
    the next block's head (one). ``through_norms=False`` gives the weights alone, and the fold
    is what the test sees: the two differ by more than the tolerance."""
    model = rs.load(build("bert"), tokenizer=ByteTokenizer())
    hf = model.module.encoder.layer
    d, n = model.anatomy.d_model, model.anatomy.n_heads
    k = d // n

    def f64(t):
        return t.detach().double()

    def head(L, h):
        att, cols = hf[L].attention, slice(h * k, (h + 1) * k)
        W = {x: f64(getattr(att.self, x).weight).T[:, cols] for x in ("query", "key", "value")}
        OV = W["value"] @ f64(att.output.dense.weight).T[cols]
        return OV, W["query"] @ W["key"].T

    def M(ln):  # the LayerNorm's linear part on a row vector, up to 1/s: (c - mean c) ⊙ γ
        return (torch.eye(d, dtype=torch.float64) - 1 / d) @ torch.diag(f64(ln.weight))

    def score(write, read, P):
        fro = torch.linalg.matrix_norm
        return float(fro(write @ P @ read) / (fro(write @ P) * fro(read)))

    identity = torch.eye(d, dtype=torch.float64)
    after_attn, after_mlp = ([M(layer.attention.output.LayerNorm) for layer in hf],
                             [M(layer.output.LayerNorm) for layer in hf])
    two_blocks = after_attn[0] @ after_mlp[0] @ after_attn[1] @ after_mlp[1]
    OV, _ = head(0, 1)
    OV_j, QK = head(2, 3)
    W_in = f64(hf[1].intermediate.dense.weight).T
    W_out = f64(hf[0].output.dense.weight).T
    _, QK_1 = head(1, 0)
    OV_12, _ = head(1, 2)
    cases = [  # (field, index, write, read, P)
        ("head_to_head", (0, "L0H1", "L2H3"), OV, QK, two_blocks),
        ("head_to_head", (1, "L0H1", "L2H3"), OV, QK.T, two_blocks),
        ("head_to_head", (2, "L0H1", "L2H3"), OV, OV_j, two_blocks),
        ("head_to_mlp", ("L1H2", "L1.mlp"), OV_12, W_in, after_attn[1]),
        ("mlp_to_head", (0, "L0.mlp", "L1H0"), W_out, QK_1, after_mlp[0]),
    ]
    folded, weights = rs.composition(model), rs.composition(model, through_norms=False)
    assert folded.through_norms and not weights.through_norms

    def at(comp, field, index):
        *kind, writer, reader = index
        names = {"head_to_head": (comp.heads, comp.heads), "head_to_mlp": (comp.heads, comp.mlps),
                 "mlp_to_head": (comp.mlps, comp.heads)}[field]
        return float(getattr(comp, field)[(*kind, names[0].index(writer), names[1].index(reader))])

    for field, index, write, read, P in cases:
        expected = score(write, read, P)
        assert at(folded, field, index) == pytest.approx(expected, rel=1e-4)
        assert at(weights, field, index) == pytest.approx(score(write, read, identity), rel=1e-4)
        assert abs(expected - score(write, read, identity)) > 1e-3 * expected


def test_max_score_is_over_the_pairs_that_count_and_none_without_any():
    """Two layers: the largest score of the frame's rows of each kind. One layer: no head
    reads another's write, so None, not the 0 that the unseen pairs hold."""
    comp = rs.composition(perturbed(norm="layernorm", placement="post"))
    frame = comp.to_frame()
    for kind in ("q", "k", "v", "in", "mlp_v"):
        assert comp.max_score(kind) == pytest.approx(float(frame[frame.kind == kind].score.max()), abs=0)
    one = rs.composition(rs.twin(norm="layernorm", placement="post", n_layers=1, d_model=32))
    assert one.max_score("k") is None and one.max_score("in") is not None  # its MLP reads its heads


def test_a_write_that_reaches_no_reader_composes_with_nothing():
    """A head whose output is 0 scores 0 with every reader, as does, in a post-norm model, a
    head writing only along ``1``, which the LayerNorm after it removes whole (0/0 was NaN,
    read as "unseen" by ``matrix``); the weights alone still score the latter."""
    model = rs.twin(norm="layernorm", placement="post", n_layers=2, d_model=32)
    o = model.module.blocks[0].attn.o_proj.weight  # [d_model, n_heads · d_head]
    k = o.shape[1] // model.anatomy.n_heads
    with torch.no_grad():
        o[:, 0:k] = 0                           # head 0 writes nothing
        o[:, k:2 * k] = o[0:1, k:2 * k]         # head 1 writes the same value to every coordinate
    folded, weights = rs.composition(model), rs.composition(model, through_norms=False)
    later = [folded.heads.index(f"L1H{h}") for h in range(model.anatomy.n_heads)]
    for comp in (folded, weights):
        assert comp.head_to_head[:, 0, later].eq(0).all() and comp.head_to_mlp[0].eq(0).all()
    assert folded.head_to_head[:, 1, later].eq(0).all() and not folded.head_to_head.isnan().any()
    assert weights.head_to_head[:, 1, later].gt(0.01).all()
    assert folded.matrix("k", "head").loc["L1H0", "L0H1"] == 0


def test_composition_matrix_is_the_frame_as_a_grid_and_its_layer_maxima():
    """``matrix`` against ``to_frame`` pivoted by hand: each seen pair's score in its cell,
    NaN where the reader does not see the writer; ``level="layer"`` the largest score of
    each pair of layers, computed by a loop over the frame's rows. The figure shows it with
    the baseline in its title; a kind the result lacks is refused."""
    from residual_stream.plotting import composition_figure

    comp = rs.composition(perturbed(norm="layernorm", placement="post"))
    frame = comp.to_frame()
    for kind in ("q", "k", "v", "mlp_k", "in"):
        rows = frame[frame.kind == kind]
        grid = comp.matrix(kind, "head")
        assert int(grid.notna().sum().sum()) == len(rows) > 0
        for r in rows.itertuples():
            assert grid.loc[r.reader, r.writer] == pytest.approx(r.score, abs=0)
        layers = comp.matrix(kind)
        best: dict = {}
        for r in rows.itertuples():
            key = (r.reader.split(".")[0].split("H")[0], r.writer.split(".")[0].split("H")[0])
            best[key] = max(best.get(key, -1.0), r.score)
        assert int(layers.notna().sum().sum()) == len(best)
        for (reader, writer), score in best.items():
            assert layers.loc[reader, writer] == pytest.approx(score, abs=0)
    fig = composition_figure(comp, "k")
    assert fig.layout.title.text.startswith("K composition, largest per layer pair (writes as they reach")
    assert f"random baseline {comp.baseline['k']:.3f}" in fig.layout.title.text
    with pytest.raises(InputError, match="kind"):
        comp.matrix("o")
    with pytest.raises(InputError, match="level"):
        comp.matrix("k", "block")


@pytest.mark.parametrize("name", ["llama", "gpt_neox_parallel", "gemma2", "olmo2"])
def test_composition_through_norms_changes_nothing_without_norms_between_writer_and_reader(name):
    """Pre-norm, parallel and sandwich models normalize the whole stream only after the last
    block: the scores with and without ``through_norms`` are the same numbers."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    folded, weights = rs.composition(model), rs.composition(model, through_norms=False)
    for field in ("head_to_head", "head_to_mlp", "mlp_to_head"):
        assert torch.equal(getattr(folded, field), getattr(weights, field))


def test_composition_of_a_deepnorm_model_ignores_alpha_and_folds_its_layernorms():
    """DeepNorm ``N(α x + F(x))``: α scales a write before the LayerNorm, a positive factor
    the ratio cancels; the LayerNorms fold as in a post-norm model. Reference: float64 maps
    from the twin's weights and its norms' γ, K-composition of L0H1 into L2H3."""
    model = rs.twin(norm="layernorm", placement="deepnorm", n_layers=3, d_model=32)
    comp = rs.composition(model)
    w0, w2, d = model.weights(0), model.weights(2), model.anatomy.d_model

    def M(name):
        spec = model.anatomy.norms[name]
        return (torch.eye(d, dtype=torch.float64) - 1 / d) @ torch.diag(spec.gain(spec.weight).double())

    P = M("L0.ln_resid_attn") @ M("L0.ln_resid_mlp") @ M("L1.ln_resid_attn") @ M("L1.ln_resid_mlp")
    OV = w0.W_V[1].double() @ w0.W_O[1].double()
    QK = w2.W_Q[3].double() @ w2.W_K[3].double().T
    fro = torch.linalg.matrix_norm
    expected = float(fro(OV @ P @ QK.T) / (fro(OV @ P) * fro(QK)))
    got = comp.head_to_head[1, comp.heads.index("L0H1"), comp.heads.index("L2H3")].item()
    assert got == pytest.approx(expected, rel=1e-4)
    assert abs(got - float(fro(OV @ QK.T) / (fro(OV) * fro(QK)))) > 1e-3 * got


def test_the_unembedding_subspace_needs_a_head_that_reads_the_stream_linearly():
    """GPT-2's head reads the final-normed stream through ``W_U``: its top directions are a
    subspace; BERT's MLM head first applies a dense layer, GELU and a LayerNorm, so ``W_U``'s
    directions are not the stream's and the subspace is left out."""
    names = {}
    for name in ("gpt2", "bert_mlm"):
        model = rs.load(build(name), tokenizer=ByteTokenizer())
        names[name] = rs.write_subspaces(rs.trace(model, TEXTS), unembed_k=4, readers=False).subspaces
    assert "unembed_top4" in names["gpt2"] and not any("unembed" in s for s in names["bert_mlm"])
    assert set(names["bert_mlm"]) == set(names["gpt2"]) - {"unembed_top4"}


def test_an_ablation_that_changes_nothing_measures_nothing_in_bf16():
    """A head whose output columns are zero, zero-ablated, leaves the bf16 forward pass as it
    was: every read's change and the KL are 0, not the rounding between a float32 rebuild of
    the clean reads and the model's own bf16 outputs (5e-4 before the clean pass was
    captured the same way as the ablated ones)."""
    module = build("llama").to(torch.bfloat16)
    k = module.config.hidden_size // module.config.num_attention_heads
    with torch.no_grad():
        module.model.layers[0].self_attn.o_proj.weight[:, 2 * k:3 * k] = 0
    model = rs.load(module, tokenizer=ByteTokenizer())
    check = rs.ablation_check(rs.trace(model, TEXTS), writes=["L0H2", "L0H1"], mode="zero")
    assert float(check.effect[0].nan_to_num().abs().max()) == 0 and float(check.logit_kl[0]) == 0
    assert float(check.effect[1].nan_to_num().max()) > 1e-3  # a head that writes does change them


def test_dla_frames_sum_to_the_logit_difference_with_a_head_bias():
    """An LM head with a bias (GPT-2's head given one, filled at random): every view of the
    frame has a ``b_U`` row, so its rows sum to the model's own logit difference (reference:
    the logits), at each position and at each row's last token."""
    module = build("gpt2")
    module.lm_head = torch.nn.Linear(module.lm_head.in_features, module.lm_head.out_features, bias=True)
    with torch.no_grad():
        module.lm_head.weight.copy_(module.transformer.wte.weight)
        module.lm_head.bias.normal_()
    model = rs.load(module, tokenizer=ByteTokenizer())
    tr = rs.trace(model, TEXTS)
    dla = rs.direct_logit_attribution(tr, target=[97, 98], baseline=99)
    want = tr.logits[:, :, [97, 98]].diagonal(dim1=0, dim2=2).T - tr.logits[:, :, 99]
    m = tr.attention_mask.bool()
    each = dla.to_frame("each")
    assert each.label.iloc[-1] == "b_U" and each[each.label == "b_U"].kind.iloc[0] == "unembed_bias"
    sums = each.groupby(["batch", "pos"], sort=True).logit.sum()
    rows, pos = m.nonzero(as_tuple=True)
    got = torch.tensor(sums.loc[list(zip(rows.tolist(), pos.tolist(), strict=True))].values)
    assert (got - want[rows, pos].double()).abs().max() < 1e-4
    last = m.sum(1) - 1
    assert dla.to_frame("last").logit.sum() == pytest.approx(
        float(want[torch.arange(2), last].mean()), abs=1e-4)
    plain = rs.trace(rs.load(build("gpt2"), tokenizer=ByteTokenizer()), TEXTS)  # no head bias
    assert "b_U" not in set(rs.direct_logit_attribution(plain).to_frame().label)


@pytest.mark.parametrize("name", ["cohere", "granite", "aya_vision", "llava_next_granite"])
def test_dla_of_a_model_that_scales_its_logits_sums_to_its_logit_difference(name):
    """Cohere multiplies its logits by ``logit_scale`` (0.25 here), Granite divides them by
    ``logits_scaling`` (2.5): each term is scaled with them, so the terms sum to the model's
    own logit difference (reference: the trace's logits, the framework's), not to a multiple.
    Aya Vision's and Granite Vision's heads over those text models scale nothing."""
    model = rs.load(build(name), tokenizer=ByteTokenizer())
    tr = rs.trace(model, TEXTS)
    dla = rs.direct_logit_attribution(tr, target="next", baseline=7)
    m = tr.attention_mask.bool()
    want = tr.logits.gather(-1, dla.targets[..., None])[..., 0] - tr.logits[..., 7]
    assert (dla.total() - want)[m].abs().max() < 1e-5
    assert (want[m].abs().max()) > 1e-2  # a difference to get right


def test_dla_of_a_soft_capped_model_sums_to_the_logit_before_the_cap():
    """Gemma 2 soft-caps its logits, ``c · tanh(logit / c)``; with ``c = 0.5`` the cap bends
    these logits. DLA attributes the logit (difference) before the cap. Reference: the same
    Hugging Face module run with its cap switched off. ``top``: by hand from the values."""
    module = build("gemma2")
    module.config.final_logit_softcapping = 0.5
    model = rs.load(module, tokenizer=ByteTokenizer())
    tr = rs.trace(model, TEXTS)
    dla = rs.direct_logit_attribution(tr, target="next", baseline=7)
    m = tr.attention_mask.bool()
    module.config.final_logit_softcapping = None
    try:
        with torch.no_grad():
            uncapped = module(input_ids=tr.tokens, attention_mask=tr.attention_mask).logits.float()
    finally:
        module.config.final_logit_softcapping = 0.5
    capped = 0.5 * torch.tanh(uncapped / 0.5)
    assert (capped - tr.logits)[m].abs().max() < 1e-5          # the trace's logits are capped
    assert (capped - uncapped)[m].abs().max() > 0.1             # and the cap bends them
    want = uncapped.gather(-1, dla.targets[..., None])[..., 0] - uncapped[..., 7]
    assert (dla.total() - want)[m].abs().max() < 1e-4
    assert dla.softcap == 0.5
    top = dla.top(3, "each")  # the three largest terms over contributions and real tokens
    v = dla.values.masked_fill(~m, 0).abs().flatten()
    c, b, p = (torch.tensor(v.topk(3).indices.tolist()) // s % n for s, n in (
        (m.numel(), len(dla.labels)), (m.shape[1], m.shape[0]), (1, m.shape[1])))
    assert list(top.label) == [dla.labels[i] for i in c] and list(top.batch) == b.tolist() \
        and list(top.pos) == p.tolist()
    torch.testing.assert_close(torch.tensor(top.logit.values), dla.values[c, b, p])
    assert dla.top(2).label.tolist() == dla.to_frame().assign(a=lambda f: f.logit.abs()) \
        .sort_values("a", ascending=False).label.head(2).tolist()


def test_results_print_as_one_line_of_shapes():
    """A result printed in a notebook names each field by its shape or size (a lens of a real
    model dumped 31 × batch × pos numbers per field): one line, no tensor values, and every
    tensor field's shape as the tensor has it."""
    import dataclasses

    model = perturbed()
    tr = rs.trace(model, TEXTS, patterns=True)
    results = [rs.logit_lens(tr), rs.direct_logit_attribution(tr), rs.norm_growth(tr), rs.survival(tr),
               rs.read_attribution(tr), rs.composition(model), rs.write_subspaces(tr),
               rs.mixing_ratio(tr), rs.ablation_check(tr, writes=["L0.mlp"], reads=False)]
    for result in results:
        text = repr(result)
        assert "\n" not in text and "tensor(" not in text and len(text) < 700, text
        assert text.startswith(type(result).__name__ + "(")
        for f in dataclasses.fields(result):
            value = getattr(result, f.name)
            if isinstance(value, torch.Tensor) and value.ndim:
                assert f"{f.name}=[{', '.join(map(str, value.shape))}]" in text, (f.name, text)
    lens = results[0]
    assert f"top_tokens=({len(lens.top_tokens)} items)" in repr(lens)
    assert "labels=(" + str(len(results[1].labels)) + ": 'embed'," in repr(results[1])


def test_latent_attention_says_what_heads_read_is_not_there_and_keeps_the_rest():
    """DeepSeek's multi-head latent attention reads the stream through low-rank maps with an
    RMSNorm between them: no linear W_Q, W_K, W_V exist. Every analysis of what heads read
    refuses by name (composition, read attribution, mixing ratios, the readers' spaces,
    patching one head's query); the writes' analyses run, and each head's write from W_O is
    the captured z times W_O (the framework's attention output, summed over heads); growth and
    the heads' write spaces are checked by hand."""
    model = rs.load(build("deepseek_v3"), tokenizer=ByteTokenizer())
    trace = rs.trace(model, TEXTS)
    refused = [lambda: rs.composition(model), lambda: rs.read_attribution(trace),
               lambda: rs.mixing_ratio(rs.trace(model, TEXTS, patterns=True)),
               lambda: rs.write_subspaces(trace, readers=True),
               lambda: rs.path_patch(trace, trace, lambda logits: logits[:, -1, 0].mean(),
                                     senders=["L0H1"], receivers="L1H2.q")]
    for call in refused:
        with pytest.raises(NotAvailableError, match="multi-head latent attention.*stay exact"):
            call()
    w, mask = model.weights(1), trace.attention_mask
    z = trace.captured.z[1].unflatten(-1, (model.anatomy.n_heads, -1))
    by_heads = torch.einsum("bphk,hkd->bpd", z, w.W_O) + (0 if w.b_O is None else w.b_O)
    with torch.no_grad():  # the framework's own output projection, on the captured z
        out = trace.model.module.model.layers[1].self_attn.o_proj(trace.captured.z[1].clone())
    assert torch.allclose(by_heads[mask.bool()], out[mask.bool()], atol=1e-5)
    real = mask.bool().clone()
    real[:, 0] = False  # growth leaves each row's first token out
    growth = rs.norm_growth(trace).mean
    for L in range(model.anatomy.n_layers + 1):
        want = trace.stream(L).double().norm(dim=-1)[real].mean()
        assert growth[L].item() == pytest.approx(float(want), rel=1e-5)
    # the heads' write spaces come from W_O: L1H2's write's share in L0H1's, by hand in float64
    writes = rs.write_subspaces(trace, readers=False, writes=["L1H2"])
    x = (z[..., 2, :].double() @ w.W_O[2].double())[mask.bool()]
    Q = torch.linalg.qr(model.weights(0).W_O[1].double().T)[0]  # [d_model, d_head], orthonormal
    share = ((x @ Q).pow(2).sum(-1) / x.pow(2).sum(-1)).mean()
    assert float(writes.head_overlap[0, writes.heads.index("L0H1")]) == pytest.approx(float(share), rel=1e-4)

