"""Statistics on sampled tokens: which tokens of a batch a reducer reads.

A statistic with ``every > 1`` (``lens:every=16``, ``read_attribution:every=16``,
``subspaces:every=16``) reduces about one real token in ``every``. A token is chosen by its
place in the corpus, ``splitmix64(text · 2³² + position in text) mod every == 0``
(``sampled``), never by its place in a batch: every batch size, segment size and number of
processes reduce the same tokens, and so does one trace of every row. The means are then
estimates over the chosen tokens; the statistics report how many tokens they are over.

``TokenChoice`` is what a reducer holds: every real token (padding weighted out by
``real``, nothing indexed) or the chosen ones (indexed: ``take`` gathers them, a copy of
``1/every`` of the tensor, and ``real`` is all true). Samples nest: a hash that is a multiple
of ``every`` is one of every divisor of ``every``, so the tokens chosen one in 16 are among
those chosen one in 4 (``sampled_among``), and a reducer that holds the latter can pick the
former out of them (``TokenChoice.of(..., among=4)``).

A replayed CUDA graph (``streaming.graphs``) cannot change a tensor's length, so a sampled
statistic in one reads a ``StaticBatch``'s fixed-capacity choice instead: ``capacity``
slots, the chosen tokens first and the rest pointing at token 0 with ``real`` false,
refilled in place before each replay. A batch with more chosen tokens than that (five
standard deviations over the mean) is done eagerly instead.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch
from torch import Tensor

from ..errors import InputError, as_index
from ..inputs import Batch

CAPACITY_SIGMAS, CAPACITY_SLACK = 5, 8  # a fixed choice holds mean + 5 σ + 8 tokens


def capacity(n_tokens: int, every: int) -> int:
    """Slots of a fixed choice of about one in ``every`` of ``n_tokens``: never too few, in practice.

    The chosen count is binomial (mean ``μ = n/every``); ``μ + 5√μ + 8`` slots, at most ``n``
    (``√μ`` bounds the binomial's σ): a batch overflows with probability ≤ 1.2e-7 for 64 to
    65,536 tokens and ``every`` 2 to 1,024 (exact binomial tails), and is then done eagerly.
    """
    mean = n_tokens / every
    return min(n_tokens, math.ceil(mean + CAPACITY_SIGMAS * math.sqrt(mean) + CAPACITY_SLACK))


MAX_EVERY = 1 << 32  # the rarest sample: one token in 2^32 (the hash is 64 bits)


def check_every(name: str, every: int) -> int:
    """``every`` if it is a whole number in ``1..MAX_EVERY``, else ``InputError`` naming the statistic."""
    whole = as_index(every)
    if whole is None or not 1 <= whole <= MAX_EVERY:
        shown = (repr(every) if whole is None or whole < 10 ** 20
                 else f"a number of {len(str(whole))} digits")
        raise InputError(f"{name}: every (one token in every …) must be a whole number, at least 1 "
                         f"and at most {MAX_EVERY} (2^32), not {shown}")
    return whole


def sampled(batch, every: int) -> Tensor:
    """The real tokens of ``batch`` a statistic with ``every`` reduces: about one in ``every``.

    ``[batch, pos]`` bool on the CPU. Token ``j`` of row ``r`` is position ``text_start[r] + j``
    of text ``text_index[r]`` (rows are right-padded; in a part of a text, counted from the
    part's start: ``Batch.text_char``); it is chosen when ``splitmix64(text · 2³² + position)``
    is a multiple of ``every``.
    """
    return _chooser(batch)(every)


def _chooser(batch):
    """``every → sampled(batch, every)``, the batch's hashes computed once for all rates."""
    mask = batch.attention_mask.bool().cpu()
    text = np.asarray(batch.text_index, dtype=np.uint64)[:, None]
    pos = (np.asarray(batch.text_start, dtype=np.uint64)[:, None]
           + np.arange(mask.shape[1], dtype=np.uint64)[None, :])
    hashes = None

    def choose(every: int) -> Tensor:
        nonlocal hashes
        if every == 1:
            return mask
        if hashes is None:
            hashes = _splitmix64((text << np.uint64(32)) + pos)
        return mask & torch.from_numpy(hashes % np.uint64(every) == 0)
    return choose


def sampled_among(batch, every: int, among: int) -> Tensor:
    """Which of the tokens sampled one in ``among`` are also sampled one in ``every``.

    ``[n]`` bool over ``sampled(batch, among)``'s tokens in their order (row-major). ``every``
    must be a multiple of ``among``: then its choice lies within ``among``'s (module docstring).
    """
    return _keep((every, among), _chooser(batch))


def _keep(key: int | tuple[int, int], choose) -> Tensor:
    """The tokens a ``StaticBatch.samples`` key names, from a batch's ``_chooser``.

    ``every``: ``sampled``'s; ``(every, among)``: ``sampled_among``'s.
    """
    if isinstance(key, int):
        return choose(key)
    every, among = key
    if every % among:
        raise ValueError(f"one in {every} is not a sample within one in {among}")
    return choose(every)[choose(among)]


def _capturing(device: torch.device) -> bool:
    """Whether a CUDA graph is being captured on ``device``'s current stream."""
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's output function on ``uint64`` arrays (wrapping arithmetic)."""
    z = x + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class TokenChoice:
    """The tokens a reducer reads of a batch: ``index`` chooses them, ``real`` weights them.

    ``index``: the chosen tokens' flat positions in the batch (``[batch × pos]``), or None to
    read every token, padding weighted out by ``real`` rather than indexed (no copy, no device
    sync); ``real``: per token read, whether it counts (a fixed choice's empty slots do not);
    ``width``: the batch's positions per row. Made from a mask by ``of_mask``, ``of`` or
    ``fixed``.
    """

    def __init__(self, index: Tensor | None, real: Tensor, width: int) -> None:
        self.index, self.real, self.width = index, real, width

    @classmethod
    def of_mask(cls, mask: Tensor, keep: Tensor | None = None) -> TokenChoice:
        """The tokens ``keep`` chooses of a batch whose attention mask is ``mask``.

        ``keep`` (``[batch, pos]`` bool, on the CPU: ``sampled``); None: every token. A
        ``keep`` of ``[n]`` chooses among tensors already taken by another choice of ``n``
        tokens (``sampled_among``); its ``rows`` are then not rows.
        """
        if keep is None:
            return cls(None, mask.bool().flatten(), mask.shape[1])
        index = keep.flatten().nonzero().squeeze(1).to(mask.device)
        return cls(index, torch.ones(len(index), dtype=torch.bool, device=mask.device), mask.shape[1])

    @classmethod
    def fixed(cls, keep: Tensor, n: int, device) -> TokenChoice:
        """A choice of ``n`` slots (``capacity``), holding ``keep``'s tokens.

        For a replayed graph (module docstring): its tensors keep their size, ``refill``
        loads another batch's choice into them.
        """
        with torch.inference_mode(False):  # refilled outside the pass that first asks for it
            choice = cls(torch.zeros(n, dtype=torch.long, device=device),
                         torch.zeros(n, dtype=torch.bool, device=device), keep.shape[-1])
        choice.refill(keep)
        return choice

    def refill(self, keep: Tensor) -> bool:
        """Load another batch's ``keep`` (as the first one's) in place; False if it does not fit."""
        chosen = keep.flatten().nonzero().squeeze(1)
        n = len(self.index)
        if len(chosen) > n:
            return False
        index = torch.zeros(n, dtype=torch.long)
        index[: len(chosen)] = chosen
        self.index.copy_(index)
        self.real.copy_(torch.arange(n) < len(chosen))
        return True

    def rows(self) -> Tensor:
        """The batch row of each token ``take`` gives (``[token]``, on the mask's device)."""
        if self.index is not None:
            return self.index // self.width
        return torch.arange(len(self.real), device=self.real.device) // self.width

    @classmethod
    def of(cls, batch, mask: Tensor, every: int, among: int = 1) -> TokenChoice:
        """Every token of ``batch`` (``every`` 1) or one in ``every`` (``sampled``).

        ``among > 1``: one in ``every`` picked out of tensors already taken one in ``among``
        (``sampled_among``; ``every`` a multiple of it). Of a ``StaticBatch``: its fixed choice
        for ``every`` (and ``among``), made on first use, which must not be inside a CUDA
        graph's capture (it copies the choice to the device: ``graphs.record`` warms up first).
        """
        if every == 1:
            return cls.of_mask(mask)
        key = every if among == 1 else (every, among)
        if not isinstance(batch, StaticBatch):
            return cls.of_mask(mask, _keep(key, _chooser(batch)))
        if key not in batch.samples:
            if _capturing(mask.device):
                raise RuntimeError(f"a fixed choice of one token in {every} was first asked for "
                                   "inside a CUDA graph's capture; run the pass once before it")
            batch.samples[key] = cls.fixed(_keep(key, _chooser(batch)),
                                           capacity(mask.numel(), every), mask.device)
        return batch.samples[key]

    @property
    def sampled(self) -> bool:
        """Whether tokens are chosen (indexed) rather than all read."""
        return self.index is not None

    def taken(self) -> TokenChoice:
        """Every token ``take`` gives, as a choice among them (for tensors already taken).

        Itself when nothing is indexed (its ``pick`` changes nothing, ``real`` weights the
        padding out); else all its slots, weighted by the same ``real`` (a fixed choice's
        empty slots stay out). ``rows`` of the latter are not rows.
        """
        if self.index is None:
            return self
        return TokenChoice(None, self.real, len(self.real))

    def take(self, x: Tensor) -> Tensor:
        """``x [batch, pos, ...]`` as ``[token, ...]``: the chosen tokens only, when chosen."""
        return self.pick(x.flatten(0, 1))

    def pick(self, x: Tensor) -> Tensor:
        """``x [token, ...]``, tokens already flattened: the chosen ones only, when chosen."""
        return x if self.index is None else x.index_select(0, self.index)


def row_texts(batch, device) -> Tensor:
    """Each row's text index (``[batch]`` long on ``device``); a ``StaticBatch``'s own tensor."""
    if isinstance(batch, StaticBatch):
        return batch.text_ids
    return torch.tensor(batch.text_index, dtype=torch.long, device=device)


def unpadded(batch: Batch) -> bool:
    """Whether every position of ``batch`` is real, read where it costs no device sync.

    A mask on the host (a scan's batches, before they are copied) is read; one already on a
    device counts as padded (the model is then given it, which is always right).
    """
    mask = batch.attention_mask
    return mask.device.type == "cpu" and bool(mask.all())


@dataclasses.dataclass(frozen=True)
class StaticBatch(Batch):
    """A batch whose device tensors a replayed CUDA graph reads (``streaming.graphs``).

    Its tokens, mask, rows' texts (``text_ids``) and sampled tokens (``samples``: one fixed
    ``TokenChoice`` per ``every`` or ``(every, among)``, made when a reducer first asks:
    ``TokenChoice.of``) are refilled in place for
    every batch of its shape (``refill``), so a graph captured on them reads that batch.
    ``dense``: every position of every batch it holds is real (``unpadded``), so the forward
    pass is given no mask (``lean.lean_forward``); the replay keeps the graphs of such
    batches apart from those of padded ones.
    """

    text_ids: Tensor | None = None
    samples: dict = dataclasses.field(default_factory=dict)
    dense: bool = False

    @classmethod
    def on(cls, batch: Batch, device) -> StaticBatch:
        """``batch``'s static copy on ``device``."""
        return cls(batch.tokens.to(device).clone(), batch.attention_mask.to(device).clone(),
                   batch.str_tokens, batch.text_index, batch.text_start, batch.text_char,
                   text_ids=torch.tensor(batch.text_index, dtype=torch.long, device=device),
                   dense=unpadded(batch))

    def refill(self, batch: Batch) -> bool:
        """Load ``batch`` (this shape) in place; False if a sample outgrew its capacity."""
        self.tokens.copy_(batch.tokens)
        self.attention_mask.copy_(batch.attention_mask)
        self.text_ids.copy_(torch.tensor(batch.text_index, dtype=torch.long))
        choose = _chooser(batch)  # the batch hashed once for every choice
        return all(choice.refill(_keep(key, choose)) for key, choice in self.samples.items())
