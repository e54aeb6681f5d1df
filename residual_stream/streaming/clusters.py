"""The lens's text clusters: each text's KL sum and token count, exact over batches.

``LensStats.result``'s ``kl_se_texts`` clusters the reduced tokens by text (tokens of one
text are correlated). A text's rows may lie in several batches (a long text's last row, in
a length-sorted scan, usually does), so a batch's sums per text are only parts: ``OpenTexts``
adds them up per text until the text's segment ends (``close``; texts never span two
segments, ``corpus.Corpus.segments``, but for a text longer than a segment, cut into parts:
each part is then a cluster of its own), then folds each whole text into four sums:
``Σ_t S_t²``, ``Σ_t S_t n_t``, ``Σ_t n_t²`` and the number of texts ``T`` with a reduced token
(``S_t`` a text's KL sum per point, ``n_t`` its reduced tokens). So the open texts are at
most one segment's, and the result is the same for every batching, order and process count.
"""

from __future__ import annotations

import torch
from torch import Tensor

KEYS = ("text_kl_sq", "text_kl_n", "text_n_sq", "texts")  # the folded sums, in the accumulator


class OpenTexts:
    """Per text of the current segment: its KL sum per point and its reduced tokens (CPU).

    Each batch's rows are kept as they come (``add``: a copy of ``[point, row]`` numbers) and
    added up per text only when asked (``compact``): at the segment's end, for a saved state
    or a result. So a batch costs the same however many texts the segment has open.
    """

    def __init__(self) -> None:
        self.parts: list[tuple[Tensor, Tensor, Tensor]] = []  # (text ids, KL sums, tokens)

    @property
    def empty(self) -> bool:
        """Whether no text is open."""
        return not self.parts

    def add(self, texts: Tensor, kl: Tensor, n: Tensor) -> None:
        """Add rows' sums: row ``r`` is of text ``texts[r]``, its KL sum ``kl[:, r]``, tokens ``n[r]``.

        Copies: a replay refills the tensors it hands over (``sampling.StaticBatch``).
        """
        self.parts.append(tuple(t.to("cpu", dtype, copy=True) for t, dtype in
                                ((texts, torch.long), (kl, torch.float64), (n, torch.float64))))

    def compact(self) -> tuple[Tensor, Tensor, Tensor]:
        """``(text ids [text], KL sums [point, text], tokens [text])``, one column per open text."""
        ids = torch.cat([p[0] for p in self.parts])
        kl = torch.cat([p[1] for p in self.parts], 1)
        n = torch.cat([p[2] for p in self.parts])
        ids, inverse = torch.unique(ids, return_inverse=True)
        kl = torch.zeros(kl.shape[0], len(ids), dtype=torch.float64).index_add_(1, inverse, kl)
        n = torch.zeros(len(ids), dtype=torch.float64).index_add_(0, inverse, n)
        self.parts = [(ids, kl, n)]
        return ids, kl, n

    def folded(self) -> dict[str, Tensor]:
        """The open texts' contributions to ``KEYS`` (texts without a reduced token left out)."""
        _, kl, n = self.compact()
        kl, n = kl[:, n > 0], n[n > 0]
        return {"text_kl_sq": kl.square().sum(-1), "text_kl_n": (kl * n).sum(-1),
                "text_n_sq": n.square().sum(), "texts": torch.tensor(len(n))}

    def close(self, acc) -> None:
        """The segment ended: fold every open text into ``acc``'s sums and forget them."""
        if self.parts:
            for key, value in self.folded().items():
                acc.add(key, value)
        self.parts = []

    def totals(self, sums: dict[str, Tensor]) -> dict[str, Tensor]:
        """``KEYS`` over the closed texts (``sums``) and the open ones, float64 on the CPU."""
        parts = [sums, self.folded() if self.parts else {}]
        zero = torch.tensor(0.0, dtype=torch.float64)
        return {k: sum((p[k].cpu().double() for p in parts if k in p), zero) for k in KEYS}

    def merge(self, other: OpenTexts) -> None:
        """Add ``other``'s open texts (parts of the same texts add up)."""
        self.parts += other.parts

    def state(self) -> dict[str, Tensor]:
        """What ``load`` restores (a saved scan state may end inside a segment)."""
        if not self.parts:
            return {}
        ids, kl, n = self.compact()
        return {"ids": ids.clone(), "kl": kl.clone(), "n": n.clone()}

    def load(self, state: dict[str, Tensor]) -> None:
        """Restore ``state()``."""
        self.parts = [(state["ids"].clone(), state["kl"].clone(), state["n"].clone())] if state else []
