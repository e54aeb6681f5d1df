"""Frozen norms: hand-computed 2-D examples, agreement with torch's modules, invariances."""

import math

import pytest
import torch
from conftest import ATOL_F64, RTOL_F64

from residual_stream.norms import NormSpec


def spec(kind, weight=None, bias=None, offset=0.0, eps=0.0):
    return NormSpec("n", kind, eps, weight, bias, offset)


def test_layernorm_2d_by_hand():
    # x = (3, 1): mean 2, var 1, s = 1 -> centered (1, -1); γ = (2, 1), β = (0.5, 0)
    x = torch.tensor([[3.0, 1.0]], dtype=torch.float64)
    n = spec("layernorm", torch.tensor([2.0, 1.0], dtype=torch.float64),
             torch.tensor([0.5, 0.0], dtype=torch.float64))
    assert n.scale(x).item() == pytest.approx(1.0)
    torch.testing.assert_close(n.apply(x), torch.tensor([[2.5, -1.0]], dtype=torch.float64))


def test_rmsnorm_2d_by_hand_with_gemma_offset():
    # x = (3, 4): mean square 12.5, s = sqrt(12.5); gain 1 + γ = (1, 2)
    x = torch.tensor([[3.0, 4.0]], dtype=torch.float64)
    n = spec("rmsnorm", torch.tensor([0.0, 1.0], dtype=torch.float64), offset=1.0)
    s = math.sqrt(12.5)
    torch.testing.assert_close(n.apply(x), torch.tensor([[3 / s, 8 / s]], dtype=torch.float64))


def test_a_multiplier_is_a_norm_whose_scale_is_one():
    # Granite's x * 0.25: scale 1 on any input, N(x) = 0.25 x, its read map 0.25 W; no module
    x = torch.tensor([[3.0, -4.0], [100.0, 0.5]], dtype=torch.float64)
    n = spec("multiplier", torch.full((2,), 0.25, dtype=torch.float64))
    assert n.constant and not spec("rmsnorm").constant
    torch.testing.assert_close(n.scale(x), torch.ones(2, dtype=torch.float64))
    torch.testing.assert_close(n.apply(x), 0.25 * x)
    W = torch.tensor([[1.0, 2.0], [3.0, 4.0]], dtype=torch.float64)
    torch.testing.assert_close(n.fold_into(W), 0.25 * W)


def test_frozen_norm_is_affine_in_contributions():
    # N(a + b) == L(a) + L(b) + β with the scale of a + b frozen: the decomposition's premise
    torch.manual_seed(0)
    a, b = torch.randn(2, 5, 8, dtype=torch.float64)
    for kind in ("layernorm", "rmsnorm"):
        n = spec(kind, torch.randn(8, dtype=torch.float64), torch.randn(8, dtype=torch.float64)
                 if kind == "layernorm" else None, eps=1e-5)
        s = n.scale(a + b)
        parts = n.apply_linear(a, s) + n.apply_linear(b, s)
        if n.bias is not None:
            parts = parts + n.bias
        torch.testing.assert_close(parts, n.apply(a + b), atol=ATOL_F64, rtol=RTOL_F64)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_adjoint_and_in_place_forms_of_the_linear_part(kind):
    """<L(c) W, y> == <c, y (C diag(γ) W)ᵀ>/s on a stack of contributions (the adjoint read
    attribution uses: ``fold_into`` is ``Lᵀ`` up to ``1/s``); ``apply_linear_`` == ``apply_linear``."""
    torch.manual_seed(1)
    c = torch.randn(3, 2, 5, 8, dtype=torch.float64)        # (contribution, batch, pos, d)
    W = torch.randn(8, 6, dtype=torch.float64)              # a read map after the norm
    y = torch.randn(2, 5, 6, dtype=torch.float64)
    n = spec(kind, torch.randn(8, dtype=torch.float64), offset=1.0 if kind == "rmsnorm" else 0.0)
    s = torch.rand(2, 5, dtype=torch.float64) + 0.5
    lhs = ((n.apply_linear(c, s) @ W) * y).sum(-1)
    rhs = (c * (y @ n.fold_into(W).T)).sum(-1) / s
    torch.testing.assert_close(lhs, rhs, atol=ATOL_F64, rtol=RTOL_F64)
    # by hand, one token of a 2-D RMSNorm with gain (1, 2) and s = 2: L c = (c₀/2, c₁)
    hand = spec("rmsnorm", torch.tensor([0.0, 1.0], dtype=torch.float64), offset=1.0)
    eye = torch.eye(2, dtype=torch.float64)
    torch.testing.assert_close(torch.tensor([[4.0, 3.0]], dtype=torch.float64) @ hand.fold_into(eye).T / 2,
                               torch.tensor([[2.0, 3.0]], dtype=torch.float64))
    tokens_major = c.permute(1, 2, 0, 3).clone()              # (batch, pos, contribution, d)
    n.apply_linear_(tokens_major, s.unsqueeze(-1))
    torch.testing.assert_close(tokens_major, n.apply_linear(c, s).permute(1, 2, 0, 3),
                               atol=0, rtol=0)


@pytest.mark.parametrize("kind", ["layernorm", "rmsnorm"])
def test_matches_torch_modules(kind):
    torch.manual_seed(0)
    x = torch.randn(3, 7, 16, dtype=torch.float64)
    mod = (torch.nn.LayerNorm(16, eps=1e-5) if kind == "layernorm"
           else torch.nn.RMSNorm(16, eps=1e-5)).double()
    with torch.no_grad():
        mod.weight.normal_()
        if kind == "layernorm":
            mod.bias.normal_()
    n = spec(kind, mod.weight.detach(), getattr(mod, "bias", None), eps=1e-5)
    torch.testing.assert_close(n.apply(x), mod(x).detach(), atol=ATOL_F64, rtol=RTOL_F64)


def test_invariances():
    # LayerNorm: invariant to re-centering and re-scaling; RMSNorm: re-scaling only
    torch.manual_seed(1)
    x = torch.randn(4, 32, dtype=torch.float64)
    ln, rms = spec("layernorm"), spec("rmsnorm")
    shifted, scaled = x + 3.7, x * 5.0
    torch.testing.assert_close(ln.apply(shifted), ln.apply(x), atol=ATOL_F64, rtol=RTOL_F64)
    torch.testing.assert_close(ln.apply(scaled), ln.apply(x), atol=ATOL_F64, rtol=RTOL_F64)
    torch.testing.assert_close(rms.apply(scaled), rms.apply(x), atol=ATOL_F64, rtol=RTOL_F64)
    assert (rms.apply(shifted) - rms.apply(x)).abs().max() > 0.1  # RMSNorm keeps the mean


def test_bad_kind_is_refused():
    with pytest.raises(ValueError, match="kind must be one of"):
        spec("batchnorm")


def _module_reference(module: torch.nn.Module, offset: float) -> dict:
    """What ``Anatomy.norms_frame`` must say of ``module``, read off the framework's module itself."""
    weight = module.weight.detach().double() + offset
    bias = getattr(module, "bias", None)
    eps = next(getattr(module, a) for a in ("eps", "variance_epsilon") if hasattr(module, a))
    return {"eps": float(eps), "gain_mean": float(weight.mean()), "gain_min": float(weight.min()),
            "gain_max": float(weight.max()),
            "bias_norm": 0.0 if bias is None else float(bias.detach().double().norm())}


@pytest.mark.parametrize(("name", "offset", "first", "kind"), [
    ("smollm2-135m", 0.0, "L0.ln_attn_in", "rmsnorm"),  # pre-RMSNorm: 2 a block and the final one
    ("minilm-l6", 0.0, "ln_embed", "layernorm"),  # post-LayerNorm (BERT) with biases, ε 1e-12
    ("gemma2", 1.0, "L0.ln_attn_in", "rmsnorm"),  # sandwich: 4 a block, gains 1 + γ
])
def test_the_norms_table_reads_each_module_s_eps_gain_and_bias(name, offset, first, kind):
    """``Anatomy.norms_frame`` (the ``anatomy`` command's table) against each norm module's own
    ε, γ (+ Gemma's offset) and β, in the order the stream program meets them."""
    from tiny_hf import BUILDERS, build

    import residual_stream as rs
    from residual_stream.inputs import ByteTokenizer

    model = rs.load(build(name), tokenizer=ByteTokenizer()) if name in BUILDERS else rs.load(name)
    frame = model.anatomy.norms_frame()
    assert len(frame) == len(model.anatomy.norms) and frame["norm"].iloc[0] == first
    assert set(frame["kind"]) == {kind} and (frame["offset"] == offset).all()
    if kind == "rmsnorm":
        assert frame["norm"].iloc[-1] == "ln_final"
    for row in frame.to_dict("records"):
        want = _module_reference(model.module.get_submodule(row["module"]), offset)
        got = {k: row[k] for k in want}
        assert got == pytest.approx(want, rel=1e-12, abs=1e-12), row["norm"]


def test_the_anatomy_command_prints_the_norms_table(capsys):
    import residual_stream as rs
    from residual_stream.cli import main

    assert main(["anatomy", "twin-post-ln"]) == 0
    out = capsys.readouterr().out
    table = out.split("norms (gain: γ + offset; bias_norm: ‖β‖):\n")[1].split("\n\n")[0].splitlines()
    assert table[0].split() == ["norm", "kind", "eps", "offset", "gain_mean", "gain_min", "gain_max",
                                "bias_norm", "module"]
    assert len(table) == 1 + 2 * 4 and all(" layernorm " in line for line in table[1:])  # post-LN: no final
    frame = rs.load("twin-post-ln").anatomy.norms_frame()  # what it prints, row by row, to 4 digits
    assert [line.split()[0] for line in table[1:]] == list(frame["norm"])
    shown = [float(line.split()[4]) for line in table[1:]]
    assert shown == pytest.approx(list(frame["gain_mean"]), rel=1e-3)
