"""The logit lens over a corpus, reduced from the stream at every point and the final logits.

The lens compares each point's distribution with the model's final one, which only exists
once the forward pass ends; so ``LensSums`` keeps the stream at every point (``n_layers + 1``
vectors of ``d_model`` per token, in a 16-bit model's own dtype; a fraction of a trace) and,
when the logits arrive (in the model's dtype), reduces each point in chunks of tokens
(``CHUNKS`` per batch, each of ``MIN_CHUNK`` to ``MAX_CHUNK`` tokens: the launches per batch
stay few on small batches, the temporaries bounded on large ones). Per chunk the final
distribution gives ``p`` and ``Σ p log p`` once; per point one unembedding ``z`` gives top-1
agreement and the final top token's rank, then, with ``z' = z − max z`` taken in place in
``z`` (its last use), ``Σ p z'`` and ``logsumexp z'`` (``point_terms``), so that

    KL(p ‖ softmax z) = Σ p log p − Σ p z' + logsumexp(z') · Σ p

with two ``[chunk, d_vocab]`` float32 tensors alive (``p`` and ``z``) and a boolean one for
the rank. Every sum over the vocabulary is a pairwise reduction (``row_dot``), not a BLAS
dot. No ``[tokens, d_vocab]`` tensor larger than a chunk is held beside the model's own
logits, and a 16-bit ``W_U`` is cast to float32 one vocabulary slice at a time, each slice's
product written into its columns of ``z`` (``Unembed.logits``), never copied whole.

``analyses.lens.logit_lens`` sums ``p (log p − log q)`` elementwise; the two differ by
float32 rounding (each within ~1e-5 nats per token of float64 on SmolLM2's vocabulary,
``tests/test_lens_sums.py``; on the tests' tiny models within ``KL_ATOL`` of each other).
Agreement and rank compare the same logits, so they equal the analysis's exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .. import weights
from ..fusion import fused

CHUNKS, MIN_CHUNK, MAX_CHUNK = 8, 128, 512  # chunks a batch, aimed at; tokens per chunk, bounds


class LensSums:
    """One batch's lens sums: ``point`` keeps each stream, ``logits`` reduces, ``into`` adds."""

    needs_logits = True
    native_dtype = True  # a 16-bit stream is kept as it is; a float32 one is checked (``point``)

    def __init__(self, model, mask: Tensor) -> None:
        self.unembed = model.unembed(native=True)  # no float32 copy of W_U: cast per slice
        self.final_norm = model.anatomy.norms.get("ln_final")
        self.mask = mask.bool()
        self.d_vocab = model.anatomy.d_vocab
        self.keep_dtype = model.dtype if model.dtype in (torch.bfloat16, torch.float16) else None
        self.streams: dict[int, Tensor] = {}
        self.sums: dict[str, Tensor] = {}

    def point(self, point: int, x: Tensor) -> None:
        """Keep the stream entering block ``point``.

        A 16-bit model's stream is kept in its own dtype (half the memory): a lean pass hands
        it over as the model computed it (``native_dtype``); a float32 copy (a trace's) came
        from it, so nothing is lost, which is checked on the embedding point of each batch;
        a stream that does not round-trip is kept in float32.
        """
        if self.keep_dtype is not None and x.dtype != self.keep_dtype:
            kept = x.to(self.keep_dtype)
            if point == 0 and not torch.equal(kept.float(), x):
                self.keep_dtype = None  # the stream is wider than the weights: keep it as it is
            else:
                x = kept
        self.streams[point] = x

    def step(self, step, scales) -> None:
        """Nothing: the lens reads points only."""

    def logits(self, final: Tensor) -> None:
        """Reduce every point against the model's own logits ``final [batch, pos, d_vocab]``.

        Per chunk, the final distribution gives ``p`` and ``Σ p log p`` once; per point, the
        logits ``z`` give everything else through ``point_terms`` (module docstring).
        """
        points = [self.streams.pop(p).flatten(0, 1) for p in range(len(self.streams))]  # kept dtype
        final, real = final.flatten(0, 1), self.mask.flatten()  # padding is weighted out, not indexed
        kl = torch.zeros(len(points), dtype=torch.float64, device=final.device)
        agree = torch.zeros_like(kl)
        ranks = []
        chunk = min(MAX_CHUNK, max(MIN_CHUNK, -(-len(final) // CHUNKS)))
        for start in range(0, len(final), chunk):
            part = slice(start, start + chunk)
            logp = final[part].float().log_softmax(-1)  # logits may come in the model's dtype
            top, m = final[part].argmax(-1), real[part]
            p = logp.exp()
            plogp, mass = row_dot(p, logp), p.sum(-1)                          # Σ p log p, Σ p
            del logp
            chunk_ranks = []
            for i, x in enumerate(points):
                x = x[part].float()
                z = self.unembed.logits(x if self.final_norm is None else self.final_norm.apply(x))
                best, rank, pz, lse = point_terms(z, p, top)                   # z is spent
                del z
                agree[i] += ((best == top) & m).double().sum()
                chunk_ranks.append(rank)
                kl[i] += torch.where(m, plogp - pz + lse * mass, 0).double().sum()
            ranks.append(torch.stack(chunk_ranks))
        ranks = torch.cat(ranks, 1)[:, real]  # real tokens only: one device sync for the batch
        offset = torch.arange(len(points), device=ranks.device)[:, None] * self.d_vocab
        hist = torch.bincount((ranks + offset).flatten(), minlength=len(points) * self.d_vocab)
        self.sums = {"kl": kl, "top1": agree, "rank_hist": hist.view(len(points), self.d_vocab),
                     "n": real.sum()}

    def into(self, acc) -> None:
        """Add this batch's sums to ``acc`` (a ``LensStats``)."""
        for key, value in self.sums.items():
            acc.add(key, value)


def _row_dot(a: Tensor, b: Tensor) -> Tensor:
    """``(a * b).sum(-1)``, a float32 reduction: pairwise on the CPU, a tree on a GPU.

    Not a matrix product: a BLAS dot over a vocabulary adds its terms one by one into a
    running sum, and the terms below that sum's rounding are lost (up to 5e-3 nats per
    token on SmolLM2's 49,152 logits). One kernel on a GPU (``row_dot``).
    """
    return (a * b).sum(-1)


def _row_dot_sliced(a: Tensor, b: Tensor) -> Tensor:
    """``_row_dot`` ``VOCAB_SLICE`` columns at a time: no ``[rows, d_vocab]`` temporary."""
    out = torch.zeros(a.shape[:-1], dtype=a.dtype, device=a.device)
    step = weights.VOCAB_SLICE
    for start in range(0, a.shape[-1], step):
        cols = slice(start, start + step)
        out += (a[..., cols] * b[..., cols]).sum(-1)
    return out


row_dot = fused(_row_dot, eager=_row_dot_sliced)


def _point_terms(z: Tensor, p: Tensor, top: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """One point's terms from its logits ``z [n, d_vocab]`` (spent: overwritten eagerly).

    Against the final distribution ``p [n, d_vocab]`` and its top token ``top [n]``:
    ``z``'s top token, the rank of ``top`` in ``z`` (how many logits exceed its), and, with
    ``z' = z − max z``, ``Σ p z'`` and ``logsumexp z'``, so that ``KL(p ‖ softmax z) =
    Σ p log p − Σ p z' + logsumexp(z') Σ p`` (the maximum cancels; the shift keeps the
    terms small). Compiled into one pass over ``z`` on a GPU (``point_terms``); eagerly
    ``_point_terms_in_place``.
    """
    best = z.argmax(-1)
    rank = (z > z.gather(-1, top[:, None])).sum(-1, dtype=torch.int32)
    zmax = z.amax(-1, keepdim=True)
    zmax = torch.where(torch.isfinite(zmax), zmax, 0)
    shifted = z - zmax
    return best, rank, (p * shifted).sum(-1), shifted.exp().sum(-1).log()


def _point_terms_in_place(z: Tensor, p: Tensor, top: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``_point_terms`` in place in ``z``: a boolean and a ``VOCAB_SLICE``-column temporary."""
    best = z.argmax(-1)
    rank = (z > z.gather(-1, top[:, None])).sum(-1, dtype=torch.int32)  # not count_nonzero: int64 copy
    zmax = z.amax(-1, keepdim=True)
    shifted = z.sub_(torch.where(torch.isfinite(zmax), zmax, 0))
    pz = _row_dot_sliced(p, shifted)
    return best, rank, pz, shifted.exp_().sum(-1).log_()


point_terms = fused(_point_terms, eager=_point_terms_in_place)
