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

from residual_stream.streaming import lens
from residual_stream.streaming.lens import _point_terms, _point_terms_in_place, row_dot

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
    lse_f = torch.logsumexp(final, -1)                  # as LensSums.logits computes them
    logp = final - lse_f[:, None]
    p = logp.exp()
    plogp, mass = row_dot(p, logp), p.sum(-1)
    top = final.argmax(-1)
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
    lse_b = torch.logsumexp(bf16.float(), -1)
    p_b = (bf16.float() - lse_b[:, None]).exp()
    z = points[1]
    b64 = bf16.double().log_softmax(-1)
    truth = (b64.exp() * (b64 - z.double().log_softmax(-1))).sum(-1)
    _, _, pz, lse = terms(z.clone(), bf16, lse_b, top)
    kl = row_dot(p_b, bf16.float() - lse_b[:, None]) - pz + lse * p_b.sum(-1)
    assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()


def test_row_dot_is_pairwise_not_a_running_sum(monkeypatch):
    """``Σ p log p`` over 49,152 terms, most of them far below the total's rounding."""
    monkeypatch.setattr("residual_stream.weights.VOCAB_SLICE", 4096)
    final, _ = _logits(1)
    logp = final.log_softmax(-1)
    p = logp.exp()
    truth = (logp.double().exp() * logp.double()).sum(-1)
    assert (row_dot(p, logp).double() - truth).abs().max() <= 1e-6 * truth.abs().max()
    assert torch.equal(lens._row_dot_sliced(p, logp), row_dot(p, logp))  # eager on the CPU


def test_the_analysis_kl_is_float64s_at_a_real_vocabulary():
    """``analyses.lens.logit_lens``'s arithmetic (log-probabilities from ``logsumexp``, the
    elementwise ``p (log p − log q)`` summed) against float64 on the same rows: the single-
    trace reference the scan is tested against holds the same tolerance."""
    from residual_stream.analyses.lens import log_probs

    final, points = _logits(2)
    f64 = final.double().log_softmax(-1)
    logp = log_probs(final)
    assert ((logp.exp().sum(-1) - 1).abs() <= 4e-6).all()
    for z in points:
        truth = (f64.exp() * (f64 - z.double().log_softmax(-1))).sum(-1)
        kl = (logp.exp() * (logp - log_probs(z))).sum(-1)
        assert ((kl.double() - truth).abs() <= KL_F64_ATOL + KL_F64_REL * truth).all()
