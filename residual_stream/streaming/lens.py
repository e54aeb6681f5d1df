"""The logit lens over a corpus, reduced from the stream at every point and the final logits.

The lens compares each point's distribution with the model's final one, which only exists
once the forward pass ends; so ``LensSums`` keeps the stream at every point (``n_layers + 1``
vectors of ``d_model`` per token, in a 16-bit model's own dtype; a fraction of a trace) and,
when the logits arrive (in the model's dtype), reduces each point in chunks of tokens
(``CHUNKS`` per batch, each of ``MIN_CHUNK`` to ``MAX_CHUNK`` tokens: the launches per batch
stay few on small batches, the temporaries at most four ``[MAX_CHUNK, d_vocab]`` float32
tensors on large ones): one unembedding, one log-softmax, then KL to the final
distribution, top-1 agreement and the final top token's rank from that one tensor. The final
distribution's probabilities are computed once per chunk, not once per point; no
``[tokens, d_vocab]`` tensor larger than a chunk is held beside the model's own logits, and a
16-bit ``W_U`` is cast to float32 one vocabulary slice at a time (``Unembed.logits``), never
copied whole.

The arithmetic is ``analyses.lens.logit_lens``'s (the same log-softmax, the same difference
``log p − log q`` summed against ``p``; agreement and rank compared on the logits), computed in
place with at most four ``[chunk, d_vocab]`` tensors alive, so a scan reproduces it: KL and
agreement to float64 summation order, ranks exactly.
"""

from __future__ import annotations

import torch
from torch import Tensor

CHUNKS, MIN_CHUNK, MAX_CHUNK = 16, 64, 256  # chunks a batch, aimed at; tokens per chunk, bounds


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
        """Reduce every point against the model's own logits ``final [batch, pos, d_vocab]``."""
        points = [self.streams.pop(p).flatten(0, 1) for p in range(len(self.streams))]  # kept dtype
        final, real = final.flatten(0, 1), self.mask.flatten()  # padding is weighted out, not indexed
        kl = torch.zeros(len(points), dtype=torch.float64, device=final.device)
        agree = torch.zeros_like(kl)
        ranks = []
        chunk = min(MAX_CHUNK, max(MIN_CHUNK, -(-len(final) // CHUNKS)))
        for start in range(0, len(final), chunk):
            part = slice(start, start + chunk)
            f = final[part].float().log_softmax(-1)  # logits may come in the model's dtype
            pf, top, m = f.exp(), final[part].argmax(-1), real[part]
            chunk_ranks = []
            for i, x in enumerate(points):
                x = x[part].float()
                z = self.unembed.logits(x if self.final_norm is None else self.final_norm.apply(x))
                agree[i] += ((z.argmax(-1) == top) & m).double().sum()
                chunk_ranks.append(torch.count_nonzero(z > z.gather(-1, top[:, None]), dim=-1))
                gap = z.log_softmax(-1)
                del z
                gap.sub_(f).neg_()                                             # log p − log q
                gap = (pf.unsqueeze(1) @ gap.unsqueeze(-1)).flatten()          # Σ p (log p − log q)
                kl[i] += torch.where(m, gap, 0).double().sum()
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
