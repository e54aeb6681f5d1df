"""The lens's text clusters: each text's KL sum and token count, exact over batches.

``LensStats.result``'s ``kl_se_texts`` clusters the reduced tokens by text (tokens of one
text are correlated). A text's rows may lie in several batches (a long text's last row, in
a length-sorted scan, usually does), so a batch's sums per text are only parts: ``OpenTexts``
adds them up per text until the text's segment ends (``close``; texts never span two
segments, ``corpus.Corpus.segments``), then folds each whole text into four sums:
``Σ_t S_t²``, ``Σ_t S_t n_t``, ``Σ_t n_t²`` and the number of texts ``T`` with a reduced token
(``S_t`` a text's KL sum per point, ``n_t`` its reduced tokens). So the open texts are at
most one segment's, and the result is the same for every batching, order and process count.
"""

from __future__ import annotations

import torch
from torch import Tensor

KEYS = ("text_kl_sq", "text_kl_n", "text_n_sq", "texts")  # the folded sums, in the accumulator


class OpenTexts:
    """Per text of the current segment: its KL sum per point and its reduced tokens (CPU)."""

    def __init__(self) -> None:
        self.ids = torch.zeros(0, dtype=torch.long)
        self.kl: Tensor | None = None  # [point, text], float64
        self.n = torch.zeros(0, dtype=torch.float64)

    def add(self, texts: Tensor, kl: Tensor, n: Tensor) -> None:
        """Add rows' sums: row ``r`` is of text ``texts[r]``, its KL sum ``kl[:, r]``, tokens ``n[r]``."""
        ids = torch.cat([self.ids, texts.cpu().long()])
        kl = kl.cpu().double() if self.kl is None else torch.cat([self.kl, kl.cpu().double()], 1)
        n = torch.cat([self.n, n.cpu().double()])
        self.ids, inverse = torch.unique(ids, return_inverse=True)
        self.kl = torch.zeros(kl.shape[0], len(self.ids), dtype=torch.float64).index_add_(1, inverse, kl)
        self.n = torch.zeros(len(self.ids), dtype=torch.float64).index_add_(0, inverse, n)

    def folded(self) -> dict[str, Tensor]:
        """The open texts' contributions to ``KEYS`` (texts without a reduced token left out)."""
        kl = torch.zeros(0, 0, dtype=torch.float64) if self.kl is None else self.kl[:, self.n > 0]
        n = self.n[self.n > 0]
        return {"text_kl_sq": kl.square().sum(-1), "text_kl_n": (kl * n).sum(-1),
                "text_n_sq": n.square().sum(), "texts": torch.tensor(len(n))}

    def close(self, acc) -> None:
        """The segment ended: fold every open text into ``acc``'s sums and forget them."""
        if self.kl is not None:
            for key, value in self.folded().items():
                acc.add(key, value)
        self.__init__()

    def totals(self, sums: dict[str, Tensor], points: int) -> dict[str, Tensor]:
        """``KEYS`` over the closed texts (``sums``) and the open ones, on the CPU."""
        zero = {"text_kl_sq": torch.zeros(points, dtype=torch.float64),
                "text_kl_n": torch.zeros(points, dtype=torch.float64),
                "text_n_sq": torch.tensor(0.0, dtype=torch.float64), "texts": torch.tensor(0)}
        open_ = self.folded() if self.kl is not None else zero
        return {k: sums[k].cpu() + open_[k] if k in sums else zero[k] + open_[k] for k in KEYS}

    def merge(self, other: OpenTexts) -> None:
        """Add ``other``'s open texts (parts of the same texts add up)."""
        if other.kl is not None:
            self.add(other.ids, other.kl, other.n)

    def state(self) -> dict[str, Tensor]:
        """What ``load`` restores (a saved scan state may end inside a segment)."""
        return {} if self.kl is None else {"ids": self.ids, "kl": self.kl, "n": self.n}

    def load(self, state: dict[str, Tensor]) -> None:
        """Restore ``state()``."""
        self.__init__()
        if state:
            self.ids, self.kl, self.n = state["ids"].clone(), state["kl"].clone(), state["n"].clone()
