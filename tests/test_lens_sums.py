"""The scan's logit-lens reductions at a real vocabulary's size, against float64.

The lean lens (``streaming.lens``) reduces each point's logits ``z`` against the final
distribution ``p`` without the analysis's ``[token, d_vocab]`` log-softmax per point:
``KL = Σ p log p − Σ p z' + logsumexp(z') Σ p`` with ``z' = z − max z``. The tiny models
of the other tests have 256 logits; here 49,152 (SmolLM2's vocabulary), where a sum that
adds its terms one by one (a BLAS dot) loses the terms below its running total's rounding:
the scan's KL was off by up to 1.5e-2 nats per point on SmolLM2 before the sums were
pairwise. The reference is the same quantities in float64 from the same inputs (float32, and the
final logits also in bf16, as a bf16 model's lean pass hands them over).
"""

from __future__ import annotations

import pytest
import torch

from residual_stream.streaming.lens import (
    _final_terms,
    _final_terms_sliced,
    _point_terms,
    _point_terms_in_place,
)

V, ROWS = 49_152, 48
KL_F64_ATOL, KL_F64_REL = 1e-5, 2e-6  # per token: float32 sums over 49,152 logits of size ~30


def _logits(seed: int) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Final logits and points' logits at SmolLM2's scale: spread ~4, peaks ~+25, offsets."""
    g = torch.Generator().manual_seed(seed)
    final = 4 * torch.randn(ROWS, V, generator=g)
    final[torch.arange(ROWS), torch.randint(0, V, (ROWS,), generator=g)] += 25
    points = [final + 30,                                          # same distribution, shifted
              final + 0.5 * torch.randn(ROWS, V, generator=g),     # close to it
              6 * torch.randn(ROWS, V, generator=g) - 10]          # unrelated (an early point)
    points[2][:, 7] = points[2].amax(-1)                             # a tie at the maximum
    return final, points


@pytest.mark.parametrize("terms", [_point_terms, _point_terms_in_place],
                         ids=["compiled_form", "eager_in_place"])
def test_point_terms_give_kl_rank_and_agreement_of_float64(terms, monkeypatch):
    """Both forms (the one compiled on a GPU, the eager in-place one) against float64, with
    the eager row sums in uneven vocabulary slices."""
    monkeypatch.setattr("residual_stream.weights.VOCAB_SLICE", 5000)  # 10 slices, the last partial
    final, points = _logits(0)
    top, lse_f, plogp, mass = _final_terms_sliced(final)  # as LensSums.logits computes them
    f64 = final.double().log_softmax(-1)
    for z in points:
        truth = (f64.exp() * (f64 - z.double().log_softmax(-1))).sum(-1)
        best, rank, pz, lse = terms(z.clone(), final, lse_f, top)
        kl = plogp - pz + lse * mass
        assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()
        assert torch.equal(best, z.argmax(-1))                     # first index of a tie, as argmax
        assert torch.equal(rank.long(), (z > z.gather(-1, top[:, None])).sum(-1))
    assert torch.equal(_point_terms(points[2].clone(), final, lse_f, top)[0], torch.full((ROWS,), 7))
    bf16 = final.bfloat16()  # the model's own logits in bf16: p from them, as the lens reads them
    _, lse_b, plogp_b, mass_b = _final_terms_sliced(bf16)
    z = points[1]
    b64 = bf16.double().log_softmax(-1)
    truth = (b64.exp() * (b64 - z.double().log_softmax(-1))).sum(-1)
    _, _, pz, lse = terms(z.clone(), bf16, lse_b, top)
    kl = plogp_b - pz + lse * mass_b
    assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()


@pytest.mark.parametrize("terms", [_final_terms, _final_terms_sliced],
                         ids=["compiled_form", "eager_sliced"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_final_terms_are_float64s_and_sum_pairwise(terms, dtype, monkeypatch):
    """Top token, ``logsumexp``, ``Σ p log p`` (49,152 terms, most far below the total's
    rounding: a running sum loses them) and ``Σ p`` of the final logits, against float64 of
    the same values, with the eager sums in uneven vocabulary slices and a tie at the top."""
    monkeypatch.setattr("residual_stream.weights.VOCAB_SLICE", 5000)
    final, _ = _logits(1)
    final[:, 11] = final.amax(-1)                                    # a tie: the first index wins
    final = final.to(dtype)
    f64 = final.double()
    lse64 = torch.logsumexp(f64, -1)
    logp64 = f64 - lse64[:, None]
    top, lse, plogp, mass = terms(final)
    assert torch.equal(top, f64.argmax(-1))
    assert (lse.double() - lse64).abs().max() <= 1e-6 * lse64.abs().max()
    truth = (logp64.exp() * logp64).sum(-1)
    assert (plogp.double() - truth).abs().max() <= 1e-6 * truth.abs().max()
    assert ((mass.double() - 1).abs() <= 4e-6).all()
    assert lse.dtype == plogp.dtype == mass.dtype == torch.float32


def test_final_terms_keep_an_infinite_maximum_as_logsumexp_does():
    """A row whose maximum is not finite: ``logsumexp`` is that maximum, as ``torch``'s is."""
    f = torch.zeros(3, 10)
    f[0, 2] = float("inf")
    f[1] = float("-inf")
    _, lse, _, _ = _final_terms_sliced(f)
    assert torch.equal(lse, torch.logsumexp(f, -1))


def test_the_analysis_kl_is_float64s_at_a_real_vocabulary():
    """``analyses.lens.logit_lens``'s arithmetic (log-probabilities from ``logsumexp``, the
    elementwise ``p (log p − log q)`` summed) against float64 on the same rows: the single-
    trace reference the scan is tested against holds the same tolerance."""
    from residual_stream.analyses.lens import kl_rows, log_probs

    final, points = _logits(2)
    f64 = final.double().log_softmax(-1)
    logp = log_probs(final)
    assert ((logp.exp().sum(-1) - 1).abs() <= 4e-6).all()
    for z in points:
        truth = (f64.exp() * (f64 - z.double().log_softmax(-1))).sum(-1)
        kl = kl_rows(logp, log_probs(z))
        assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()


def _masked(seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Final and point logits with a ``-inf`` vocabulary block in both (a masked vocabulary),
    the point's also ``-inf`` at tokens the final gives no probability; and the finite columns."""
    final, points = _logits(seed)
    z = points[1].clone()
    dead = torch.zeros(V, dtype=torch.bool)
    dead[1000:1500] = True
    final[:, dead] = float("-inf")
    z[:, dead] = float("-inf")
    z[:, 2000] = float("-inf")  # only the point: the final gives it probability, so KL is infinite
    return final, z, ~dead


@pytest.mark.parametrize("terms", [_point_terms, _point_terms_in_place],
                         ids=["compiled_form", "eager_in_place"])
@pytest.mark.parametrize("final_of", [_final_terms, _final_terms_sliced],
                         ids=["final_compiled", "final_sliced"])
def test_minus_infinite_logits_add_nothing_where_the_final_gives_no_probability(
        terms, final_of, monkeypatch):
    """A ``-inf`` final logit is a token of probability 0: ``0 · log 0`` and ``0 · (-inf)`` count
    as 0 (they were NaN), so the KL is float64's over the finite columns; a point that gives
    ``-inf`` where the final gives probability has an infinite KL, not NaN."""
    monkeypatch.setattr("residual_stream.weights.VOCAB_SLICE", 5000)
    final, z, live = _masked(3)
    top, lse_f, plogp, mass = final_of(final)
    f64 = final[:, live].double().log_softmax(-1)
    assert (plogp.double() - (f64.exp() * f64).sum(-1)).abs().max() <= 1e-6 * plogp.abs().max()
    fine = z.clone()
    fine[:, 2000] = 0.0
    for point, finite in ((fine, True), (z, False)):
        _, _, pz, lse = terms(point.clone(), final, lse_f, top)
        kl = plogp - pz + lse * mass
        if finite:
            truth = (f64.exp() * (f64 - point[:, live].double().log_softmax(-1))).sum(-1)
            assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()
        else:
            assert torch.equal(kl, torch.full_like(kl, float("inf")))
    fine[9, 4] = float("nan")  # a NaN logit is not a token of no probability: its row stays NaN
    _, _, pz, lse = terms(fine.clone(), final, lse_f, top)
    kl = plogp - pz + lse * mass
    assert kl[9].isnan() and kl.isfinite().sum() == ROWS - 1
    final[5, 3] = float("nan")  # in the final logits too
    top, lse_f, plogp, mass = final_of(final)
    _, _, pz, lse = terms(fine.clone(), final, lse_f, top)
    kl = plogp - pz + lse * mass
    assert kl[5].isnan() and kl[9].isnan() and kl.isfinite().sum() == ROWS - 2


def test_the_analysis_kl_counts_no_probability_as_nothing():
    """``kl_rows`` (``logit_lens`` and ablation's meter): float64's over the finite columns
    with a ``-inf`` block on both sides, infinite where only ``q`` has ``-inf``, never NaN."""
    from residual_stream.analyses.lens import kl_rows, log_probs

    final, z, live = _masked(4)
    fine = z.clone()
    fine[:, 2000] = 0.0
    f64 = final[:, live].double().log_softmax(-1)
    truth = (f64.exp() * (f64 - fine[:, live].double().log_softmax(-1))).sum(-1)
    kl = kl_rows(log_probs(final), log_probs(fine))
    assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()
    assert torch.equal(kl_rows(log_probs(final), log_probs(z)), torch.full((ROWS,), float("inf")))
    self_kl = kl_rows(log_probs(final), log_probs(final))
    assert torch.equal(self_kl, torch.zeros(ROWS))
    final[5, 3] = float("nan")  # a NaN logit is not a token of no probability: its row stays NaN
    kl = kl_rows(log_probs(final), log_probs(fine))
    assert kl[5].isnan() and kl.isfinite().sum() == ROWS - 1
