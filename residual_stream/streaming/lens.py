"""The logit lens over a corpus, each point reduced against the final logits as it arrives.

The lens compares each point's distribution with the model's final one, which only exists
once the forward pass ends. Rather than keep the stream at every point until then
(``n_layers + 1`` vectors of ``d_model`` per token: a third of SmolLM2's logits, more than
all of them for a 7B Llama), ``LensSums`` takes the final logits first (``needs_logits``:
the lean pass runs one plain forward pass for them, then the pass itself without the
unembedding; a trace has them already) and reduces every point the moment it arrives. So
the scan holds the model's own logits and a few bounded temporaries, whatever the depth.
On a GPU both passes are captured in one CUDA graph per batch shape (``graphs``).

**Sampled tokens** (``LensStats(every=k)``, the spec ``lens:every=k``): about one real
token in ``k``, chosen by its place in the corpus (``sampling.sampled``), is reduced. Keeping those
tokens' points is ``1/k`` of the cost above (for SmolLM2 at ``k = 16``, 2 % of its logits),
so the points are kept and the logits come from the same pass, at its end
(``late_logits``): no second forward pass, and a ``1/k`` share of the unembeddings. The
means are then estimates; ``LensStats.result`` gives each point's standard error.

Given the logits, per token (``final_terms``): the final top token, ``logsumexp f`` (so
``p = exp(f − lse)``), ``Σ p log p`` and ``Σ p``, in token chunks (``CHUNKS`` per batch,
each of ``MIN_CHUNK`` to ``MAX_CHUNK`` tokens: few launches on small batches, bounded
temporaries on large ones). Per point and chunk, one unembedding ``z`` and ``point_terms``:
top-1 agreement, the final top token's rank, and with ``z' = z − max z`` (in place in
``z``, its last use) ``Σ p z'`` and ``logsumexp z'``, so that

    KL(p ‖ softmax z) = Σ p log p − Σ p z' + logsumexp(z') · Σ p

with one ``[chunk, d_vocab]`` float32 tensor alive (``z``) and a boolean one for the rank:
on a GPU both reductions are compiled, and eagerly ``p`` is recomputed from the logits (in
the model's dtype) one vocabulary slice at a time, as are the final terms. Every sum over
the vocabulary is a pairwise reduction, not a BLAS dot (whose running sum loses the terms
below its rounding). A token the final logits give no probability (a ``-inf`` logit) adds
nothing to ``Σ p log p`` or ``Σ p z'`` (``0 · log 0 = 0``), as in ``analyses.lens.kl_rows``.
A 16-bit ``W_U`` is cast to float32 one vocabulary slice at a time, each slice's product
written into its columns of ``z`` (``Unembed.logits``), never copied whole.

**TF32 products** (``LensStats(tf32=True)``, the spec ``lens:tf32=true``; 16-bit ``W_U`` only,
``check_tf32``): each final-normed chunk is rounded to TF32's 10 mantissa bits
(``tf32_round``) before its unembedding, and on a CUDA device the product runs on the tensor
cores (``tf32_products``), which round their inputs so and accumulate in float32; a bf16 or
fp16 ``W_U`` is exact in TF32. The same rounding on every device, so the same sums up to the
order of the products' additions. On SmolLM2 in bf16 (``benchmarks/lens_tf32.py``) it moves a
point's mean KL by at most 2.5e-5 of it (8.4e-5 at the last point, whose KL is 5e-4 nats;
3.7e-3 standard errors) and changes top-1 agreement at 2 of 31,744 token-points. On a GPU
float32 products run on the CUDA cores at a fraction of the tensor cores' rate.

``analyses.lens.logit_lens`` sums ``p (log p − log q)`` elementwise, with log-probabilities
from ``logsumexp`` as here (taken slice by slice eagerly); the two differ by float32
rounding (on SmolLM2, 3 texts, their mean KLs agree to 2.2e-7 relative but at the last
point, where the KL is 3e-7 nats; each is within ~1e-5 nats per token of float64,
``tests/test_lens_sums.py``; on the tests' tiny models within ``KL_ATOL``). Agreement and
rank compare the same logits, so they equal the analysis's exactly.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
from torch import Tensor

from .. import weights
from ..errors import InputError
from ..fusion import fused
from .sampling import TokenChoice

CHUNKS, MIN_CHUNK, MAX_CHUNK = 8, 128, 512  # chunks a batch, aimed at; tokens per chunk, bounds


class LensSums:
    """One batch's lens sums: ``logits`` and ``point`` in either order, then ``into`` adds.

    A point that arrives after the logits is reduced at once; one that arrives before them is
    kept (only its chosen tokens) until they come. ``tokens`` (``sampling.TokenChoice``)
    chooses the tokens reduced: every real one (padding weighted out rather than indexed;
    the logits are asked for first, ``needs_logits``) or a sample (the logits come at the
    end of the same pass, ``late_logits``).
    """

    native_dtype = True  # a 16-bit stream is unembedded from float32 copies of one chunk at a time

    def __init__(self, model, tokens: TokenChoice, texts: Tensor, tf32: bool = False) -> None:
        """``tokens``: those reduced; ``texts``: each row's text index (``[batch]``, on the device).

        KL is summed per row here; ``into`` hands the rows' sums to the accumulator's text
        clusters (``clusters.OpenTexts``), which add up the rows of each text. ``tf32``: the
        unembeddings' inputs rounded to TF32, their products on a GPU's tensor cores.
        """
        self.unembed = model.unembed(native=True)  # no float32 copy of W_U: cast per slice
        self.tf32 = tf32
        self.final_norm = model.anatomy.norms.get("ln_final")
        self.d_vocab = model.anatomy.d_vocab
        self.tokens, self.real = tokens, tokens.real
        self.needs_logits, self.late_logits = not self.tokens.sampled, self.tokens.sampled
        n = model.anatomy.n_layers + 1
        dev = tokens.real.device
        self.kl = torch.zeros(n, dtype=torch.float64, device=dev)
        self.kl_sq, self.agree = torch.zeros_like(self.kl), torch.zeros_like(self.kl)
        self.texts = texts.to(dev)
        self.row = tokens.rows()  # each reduced token's row
        self.kl_text = torch.zeros(n, len(texts), dtype=torch.float64, device=dev)  # per row
        self.replayed = False  # a replay's tensors are refilled, never dropped (``rebind``)
        self.ranks: list[Tensor | None] = [None] * n
        self.early: dict[int, Tensor] = {}  # points that came before the logits (their kept tokens)
        self.final: Tensor | None = None  # the logits, then per token (``logits``): the final
        self.chunk = MIN_CHUNK            # top token, logsumexp, Σ p log p and Σ p
        self.top = self.lse = self.plogp = self.mass = None

    def logits(self, final: Tensor, taken: bool = False) -> None:
        """Take the model's own logits ``[batch, pos, d_vocab]`` (any dtype); reduce kept points.

        ``taken``: they are the chosen tokens' alone, ``[1, token, d_vocab]`` (``chosen``).
        """
        self.final = final.flatten(0, 1) if taken else self.tokens.take(final)
        n = len(self.final)
        self.chunk = min(MAX_CHUNK, max(MIN_CHUNK, -(-n // CHUNKS)))
        self.top = torch.empty(n, dtype=torch.long, device=final.device)
        self.lse, self.plogp, self.mass = (torch.empty(n, device=final.device) for _ in range(3))
        for part in self._parts():
            self.top[part], self.lse[part], self.plogp[part], self.mass[part] = \
                final_terms(self.final[part])
        if self.early:  # points that came first: unembedded together, W_U read once per chunk
            kept = sorted(self.early)
            self._reduce(kept, torch.stack([self.early.pop(q) for q in kept]))

    def chosen(self) -> Tensor | None:
        """The flattened ``[batch × pos]`` places of the tokens reduced, when sampled; else None.

        A lean pass whose only late reducer this is has the model's head unembed these tokens
        alone, then hands their logits over with ``taken``.
        """
        return self.tokens.index if self.late_logits else None

    def _parts(self):
        return (slice(s, s + self.chunk) for s in range(0, len(self.final), self.chunk))

    def point(self, point: int, x: Tensor) -> None:
        """Reduce the stream entering block ``point`` against the final logits (or keep it)."""
        if self.final is None:
            if not self.tokens.sampled:
                raise RuntimeError("LensSums.logits (the final logits) must come before the "
                                   "points unless tokens are sampled")
            self.early[point] = self.tokens.take(x)  # a copy of the chosen tokens
            return
        self._reduce([point], self.tokens.take(x)[None])

    def _reduce(self, points: list[int], xs: Tensor) -> None:
        """Add the terms of ``points`` from their streams ``xs [len(points), token, d_model]``.

        In token chunks, each unembedded for every point at once (about ``self.chunk`` rows
        for one point, ``MAX_CHUNK`` for several: a few kept tokens at 31 points are one
        product, so ``W_U`` is read once, not once per point).
        """
        n_points, n = xs.shape[:2]
        step = max(1, (self.chunk if n_points == 1 else MAX_CHUNK) // n_points)
        ranks: list[list[Tensor]] = [[torch.zeros(0, dtype=torch.int32, device=xs.device)]
                                     for _ in points]
        for start in range(0, n, step):
            part = slice(start, start + step)
            h = xs[:, part].flatten(0, 1).float()
            h = h if self.final_norm is None else self.final_norm.apply(h)
            with tf32_products(h.device, self.tf32):
                z = self.unembed.logits(tf32_round(h) if self.tf32 else h)
            z = z.view(n_points, -1, z.shape[-1])
            real, top = self.real[part], self.top[part]
            for i, point in enumerate(points):
                best, rank, pz, lse = point_terms(z[i], self.final[part], self.lse[part], top)
                self.agree[point] += ((best == top) & real).double().sum()
                ranks[i].append(rank)
                kl = torch.where(real, self.plogp[part] - pz + lse * self.mass[part], 0).double()
                self.kl[point] += kl.sum()
                self.kl_sq[point] += kl.square().sum()
                self.kl_text[point].index_add_(0, self.row[part], kl)
            del z                                                              # spent
        for i, point in enumerate(points):
            self.ranks[point] = torch.cat(ranks[i])

    def step(self, step, scales) -> None:
        """Nothing: the lens reads points only."""

    def rebind(self, batch, width: int) -> None:
        """A replay refilled these sums (``streaming.graphs``): keep its tensors after ``into``."""
        self.replayed = True

    def overflowed(self) -> bool:
        """Never: nothing here has a fixed-size search (a full sample is caught before)."""
        return False

    def into(self, acc) -> None:
        """Add this batch's sums to ``acc`` (a ``LensStats``)."""
        if self.final is None or self.early:
            raise RuntimeError("LensSums.into before the logits came: nothing was reduced")
        ranks = torch.stack(self.ranks)  # [point, token]; a pad counts in a last bin, dropped
        points, bins = len(ranks), self.d_vocab + 1  # (no boolean index, no bincount: no sync)
        where = torch.where(self.real, ranks, self.d_vocab)
        where = where + torch.arange(points, device=ranks.device)[:, None] * bins
        hist = torch.zeros(points * bins, dtype=torch.long, device=ranks.device)
        hist.index_add_(0, where.flatten(), torch.ones_like(where.flatten()))
        hist = hist.view(points, bins)[:, :self.d_vocab]
        acc.add("kl", self.kl)
        acc.add("kl_sq", self.kl_sq)
        n_row = torch.zeros(self.kl_text.shape[1], dtype=torch.float64, device=self.kl.device)
        n_row.index_add_(0, self.row, self.real.double())  # each row's reduced tokens
        acc.open_texts.add(self.texts, self.kl_text, n_row)
        acc.add("top1", self.agree)
        acc.add("rank_hist", hist)
        acc.add("n", self.real.sum())
        if not self.replayed:  # the batch's logits: not held a moment longer than the sums need
            self.final = None


def _point_terms(z: Tensor, final: Tensor, lse: Tensor, top: Tensor
                 ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One point's terms from its logits ``z [n, d_vocab]`` (spent: overwritten eagerly).

    Against the final logits ``final [n, d_vocab]`` (any dtype), their ``logsumexp``
    ``lse [n]`` and top token ``top [n]``: ``z``'s top token, the rank of ``top`` in ``z``
    (how many logits exceed its), and, with ``p = exp(final − lse)`` and ``z' = z − max z``,
    ``Σ p z'`` and ``logsumexp z'``, so that ``KL(p ‖ softmax z) = Σ p log p − Σ p z' +
    logsumexp(z') Σ p`` (the maximum cancels; the shift keeps the terms small). Compiled
    into one pass over ``z`` and ``final`` on a GPU (``point_terms``); eagerly
    ``_point_terms_in_place``.
    """
    p = (final.float() - lse[:, None]).exp()
    best = z.argmax(-1)
    rank = (z > z.gather(-1, top[:, None])).sum(-1, dtype=torch.int32)
    zmax = z.amax(-1, keepdim=True)
    zmax = torch.where(torch.isfinite(zmax), zmax, 0)
    shifted = z - zmax
    return best, rank, torch.where(p == 0, 0, p * shifted).sum(-1), shifted.exp().sum(-1).log()


def _point_terms_in_place(z: Tensor, final: Tensor, lse: Tensor, top: Tensor
                          ) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``_point_terms`` in place in ``z``, beside a boolean temporary and a slice of ``p`` at a time.

    ``nansum`` drops the products ``0 · (-inf)`` (the compiled form's ``where``) at the cost of a
    plain sum (a mask and a fill doubled the loop's time); a NaN logit still makes the KL NaN,
    through ``Σ p`` or ``logsumexp z'``.
    """
    best = z.argmax(-1)
    rank = (z > z.gather(-1, top[:, None])).sum(-1, dtype=torch.int32)  # not count_nonzero: int64 copy
    zmax = z.amax(-1, keepdim=True)
    shifted = z.sub_(torch.where(torch.isfinite(zmax), zmax, 0))
    pz = torch.zeros_like(lse)
    for cols in weights.vocab_slices(z.shape[-1]):  # p = exp(final − lse), float32 (lse is), by slice
        pz += torch.sub(final[:, cols], lse[:, None]).exp_().mul_(shifted[:, cols]).nansum(-1)
    return best, rank, pz, shifted.exp_().sum(-1).log_()


point_terms = fused(_point_terms, eager=_point_terms_in_place)


def _final_terms(f: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Per row of the final logits ``f [n, d_vocab]`` (any dtype): what every point reads.

    The top token, ``lse = logsumexp f``, and with ``p = exp(f − lse)`` (float32) ``Σ p log p``
    and ``Σ p``. Compiled on a GPU into passes over ``f`` itself (``final_terms``); eagerly
    ``_final_terms_sliced``, neither holding a float32 copy of ``f``.
    """
    f = f.float()
    lse = torch.logsumexp(f, -1)
    logp = f - lse[:, None]
    p = logp.exp()
    return f.argmax(-1), lse, torch.where(p == 0, 0, p * logp).sum(-1), p.sum(-1)


def _final_terms_sliced(f: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``_final_terms`` ``VOCAB_SLICE`` columns at a time: float32 temporaries of one slice.

    ``logsumexp`` as ``torch.logsumexp`` computes it (the row's maximum, finite or 0, plus the
    log of the shifted exponentials' sum), its sum taken slice by slice; the top token is
    ``f``'s own ``argmax`` (a 16-bit value upcasts exactly, ties go to the first alike).
    """
    top, m = f.argmax(-1), f.amax(-1).float()
    m = torch.where(torch.isfinite(m), m, 0)
    total = torch.zeros_like(m)
    for cols in weights.vocab_slices(f.shape[-1]):
        total += torch.sub(f[:, cols], m[:, None]).exp_().sum(-1)  # float32: m is
    lse = total.log_().add_(m)
    plogp, mass = torch.zeros_like(m), torch.zeros_like(m)
    for cols in weights.vocab_slices(f.shape[-1]):
        logp = torch.sub(f[:, cols], lse[:, None])  # float32: lse is
        p = logp.exp()
        plogp += (p * logp).nansum(-1)  # 0 · (-inf) adds nothing, as in _point_terms_in_place
        mass += p.sum(-1)
    return top, lse, plogp, mass


final_terms = fused(_final_terms, eager=_final_terms_sliced)


def tf32_round(x: Tensor) -> Tensor:
    """``x`` (float32) rounded to TF32's 10 mantissa bits: to nearest, ties to even.

    Infinities and NaN are kept; a value that rounds past float32's largest becomes infinite,
    as in any rounding. A TF32 product of the result reads it exactly.
    """
    drop = 13  # float32's 23 mantissa bits less TF32's 10
    bits = x.contiguous().view(torch.int32)
    odd = (bits >> drop) & 1  # the kept last bit: a tie goes to the even neighbour
    rounded = ((bits + (1 << (drop - 1)) - 1 + odd) & ~((1 << drop) - 1)).view(torch.float32)
    return torch.where(torch.isfinite(x), rounded, x)


@contextmanager
def tf32_products(device: torch.device, on: bool = True):
    """Inside, CUDA float32 matrix products run on TF32 tensor cores (``on`` and a CUDA device).

    Sets PyTorch's process-wide ``torch.backends.cuda.matmul.fp32_precision`` and restores it
    on the way out (a float32 product another thread runs meanwhile runs in TF32 too);
    elsewhere (the CPU has no TF32) it changes nothing.
    """
    if not on or device.type != "cuda":
        yield
        return
    matmul = torch.backends.cuda.matmul
    before = matmul.fp32_precision
    matmul.fp32_precision = "tf32"
    try:
        yield
    finally:
        matmul.fp32_precision = before


def check_tf32(unembed) -> None:
    """Refuse TF32 products for an unembedding whose product they would round beyond ``h``.

    TF32 reads bf16 and fp16 ``W_U`` exactly; a float32 one it would round (the CPU, which
    has no TF32, would not), and a head transform's own products would run in TF32 unrounded.
    """
    if unembed.W_U.dtype not in (torch.bfloat16, torch.float16):
        raise InputError(f"lens:tf32 rounds the lens's unembedding inputs to TF32, which reads "
                         f"bf16 and fp16 weights exactly; this model's W_U is {unembed.W_U.dtype}, "
                         "which it would round: load the model in bfloat16 or float16, or leave "
                         "tf32 off")
    if unembed.transform is not None:
        raise InputError("lens:tf32 needs an unembedding that is one product; this model's head "
                         "applies a transform first (its own products): leave tf32 off")
