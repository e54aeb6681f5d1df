"""Statistics on sampled tokens: which tokens of a batch a reducer reads.

A statistic with ``every > 1`` (``lens:every=16``, ``read_attribution:every=16``,
``subspaces:every=16``) reduces about one real token in ``every``. A token is chosen by its
place in the corpus, ``splitmix64(text · 2³² + position in text) mod every == 0``
(``sampled``), never by its place in a batch: every batch size, segment size and number of
processes reduce the same tokens, and so does one trace of every row. The means are then
estimates over the chosen tokens; the statistics report how many tokens they are over.

``TokenChoice`` is what a reducer holds: every real token (padding weighted out by
``real``, nothing indexed) or the chosen ones (indexed: ``take`` gathers them, a copy of
``1/every`` of the tensor, and ``real`` is all true).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError


def check_every(name: str, every: int) -> int:
    """``every`` if it is at least 1, else ``InputError`` naming the statistic."""
    if every < 1:
        raise InputError(f"{name}: every (one token in every …) must be at least 1, not {every}")
    return every


def sampled(batch, every: int) -> Tensor:
    """The real tokens of ``batch`` a statistic with ``every`` reduces: about one in ``every``.

    ``[batch, pos]`` bool on the CPU. Token ``j`` of row ``r`` is position ``text_start[r] + j``
    of text ``text_index[r]`` (rows are right-padded); it is chosen when ``splitmix64(text ·
    2³² + position)`` is a multiple of ``every``.
    """
    mask = batch.attention_mask.bool().cpu()
    if every == 1:
        return mask
    text = np.asarray(batch.text_index, dtype=np.uint64)[:, None]
    pos = (np.asarray(batch.text_start, dtype=np.uint64)[:, None]
           + np.arange(mask.shape[1], dtype=np.uint64)[None, :])
    chosen = _splitmix64((text << np.uint64(32)) + pos) % np.uint64(every) == 0
    return mask & torch.from_numpy(chosen)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on ``uint64`` arrays (wrapping arithmetic)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class TokenChoice:
    """The tokens a reducer reads of a batch whose attention mask is ``mask``.

    ``keep`` (``[batch, pos]`` bool, on the CPU: ``sampled``) chooses them; None reads every
    token, padding weighted out by ``real`` rather than indexed (no copy, no device sync).
    """

    def __init__(self, mask: Tensor, keep: Tensor | None = None) -> None:
        self.index = None if keep is None else keep.flatten().nonzero().squeeze(1).to(mask.device)
        self.real = (mask.bool().flatten() if keep is None
                     else torch.ones(len(self.index), dtype=torch.bool, device=mask.device))
        self.width = mask.shape[1]

    def rows(self) -> Tensor:
        """The batch row of each token ``take`` gives (``[token]``, on the mask's device)."""
        if self.index is not None:
            return self.index // self.width
        return torch.arange(len(self.real), device=self.real.device) // self.width

    @classmethod
    def of(cls, batch, mask: Tensor, every: int) -> TokenChoice:
        """Every token of ``batch`` (``every`` 1) or one in ``every`` (``sampled``)."""
        return cls(mask, None if every == 1 else sampled(batch, every))

    @property
    def sampled(self) -> bool:
        """Whether tokens are chosen (indexed) rather than all read."""
        return self.index is not None

    def take(self, x: Tensor) -> Tensor:
        """``x [batch, pos, ...]`` as ``[token, ...]``: the chosen tokens only, when chosen."""
        return self.pick(x.flatten(0, 1))

    def pick(self, x: Tensor) -> Tensor:
        """``x [token, ...]``, tokens already flattened: the chosen ones only, when chosen."""
        return x if self.index is None else x.index_select(0, self.index)

    def taken(self) -> TokenChoice:
        """Every token ``take`` gives, as a choice among them (for tensors already taken).

        Itself when nothing is indexed (its ``pick`` changes nothing, ``real`` weights the
        padding out); else a choice of all its tokens. ``rows`` of the latter are not rows.
        """
        if self.index is None:
            return self
        return TokenChoice(torch.ones(1, len(self.index), dtype=torch.bool, device=self.real.device))
