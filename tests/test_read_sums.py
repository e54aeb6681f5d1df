"""Read attribution's shares summed in token chunks (``reads.read_sums``), against float64.

The scan never makes ``h [token, map, d_model]`` (each map's folded product) or a float32 copy
of a 16-bit buffer whole: both are made per token chunk. The sums must not depend on that:
here against the same shares computed whole in float64, for a bf16 and a float32 buffer, a
token count the chunks do not divide, padding weighted out, and no token at all.
"""

from __future__ import annotations

import pytest
import torch

from residual_stream.streaming.reads import read_sums

REL = 2e-6  # float32 products of ~64 terms, float64 sums


def _case(tokens: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    n_src, d, k = 5, 12, 4
    c = torch.randn(tokens, n_src, d, generator=g).to(dtype)
    maps = []
    for cols, n in [(slice(0, 3), 3), (slice(3, 5), 2)]:  # two channels: q-like and k-like
        y = torch.randn(tokens, n, k, generator=g)
        folded = torch.randn(n, d, k, generator=g)
        maps.append((cols, y, folded))
    den = torch.rand(tokens, 5, generator=g) + 0.5
    real = torch.rand(tokens, generator=g) > 0.3
    return c, maps, den, real


def _reference(c, maps, den, real):
    h = torch.cat([torch.einsum("tmk,mdk->tmd", y.double(), f.double()) for _, y, f in maps], 1)
    share = torch.einsum("tid,tmd->tim", c.double(), h) / den.double()[:, None]
    share = share * real.double()[:, None, None]
    return share.sum(0), share.abs().sum(0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("tokens", [37, 8, 1])
def test_chunked_read_sums_equal_the_whole_shares_in_float64(tokens, dtype):
    c, maps, den, real = _case(tokens, dtype)
    sums, abs_sums = read_sums(c, maps, den, real)
    ref, ref_abs = _reference(c, maps, den, real)
    assert sums.dtype == abs_sums.dtype == torch.float64
    scale = float(ref_abs.abs().max().clamp_min(1e-12))
    assert float((sums - ref).abs().max()) <= REL * scale
    assert float((abs_sums - ref_abs).abs().max()) <= REL * scale


def test_no_token_gives_zero_sums_of_the_right_shape():
    c, maps, den, real = _case(0, torch.bfloat16)
    sums, abs_sums = read_sums(c, maps, den, real)
    assert sums.shape == abs_sums.shape == (5, 5) and not sums.any() and not abs_sums.any()


def test_padding_is_weighted_out_not_counted():
    """A token that ``real`` leaves out changes nothing, however large its shares."""
    c, maps, den, real = _case(20, torch.float32, seed=1)
    real[3] = False
    before = read_sums(c, maps, den, real)
    c[3] *= 1e6
    after = read_sums(c, maps, den, real)
    assert torch.equal(before[0], after[0]) and torch.equal(before[1], after[1])
