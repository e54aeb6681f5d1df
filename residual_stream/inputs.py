"""Inputs: texts to a right-padded token batch, with the checks that keep analyses honest.

Each text becomes one row (``overflow="chunk"`` splits a long text into several rows).
Padding is on the right and marked by ``attention_mask == 0``; causal models therefore see
exactly what they would see unpadded, and every analysis excludes the pads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch
from jaxtyping import Int
from torch import Tensor

from .errors import ContextLengthError, EmptyTextError, InputError

if TYPE_CHECKING:
    from .loading import Model

Overflow = Literal["error", "chunk"]


@dataclass(frozen=True, eq=False)
class Batch:
    """Token ids ``[batch, pos]``, the mask, token strings, and which text each row came from."""

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    str_tokens: list[list[str]]
    text_index: tuple[int, ...]


class ByteTokenizer:
    """A dependency-free tokenizer: UTF-8 bytes are ids 0..255, BOS is 256 (for the twins)."""

    vocab_size = 257
    bos_token_id = 256
    pad_token_id = 0
    eos_token_id = None

    def __call__(self, text: str, add_special_tokens: bool = True) -> dict[str, list[int]]:
        """Encode ``text`` like a Hugging Face tokenizer call (returns ``{"input_ids": ...}``)."""
        ids = list(text.encode("utf-8"))
        return {"input_ids": ([self.bos_token_id] if add_special_tokens else []) + ids}

    def convert_ids_to_tokens(self, ids: list[int]) -> list[str]:
        """Readable token strings (``<bos>``, printable bytes, or ``<0x..>``)."""
        return ["<bos>" if i == 256 else chr(i) if 32 <= i < 127 else f"<0x{i:02x}>" for i in ids]


def _pad_id(tokenizer: object) -> int:
    for attr in ("pad_token_id", "eos_token_id", "unk_token_id"):
        value = getattr(tokenizer, attr, None)
        if value is not None:
            return int(value)
    return 0


def from_ids(model: Model, tokens: Tensor) -> Batch:
    """A ``Batch`` from token ids ``[batch, pos]`` (no padding), checked against the vocabulary."""
    if tokens.ndim != 2 or tokens.numel() == 0 or tokens.dtype.is_floating_point:
        raise InputError(f"token ids must be a non-empty integer tensor [batch, pos], got "
                         f"{tuple(tokens.shape)} of {tokens.dtype}")
    if tokens.shape[1] > model.anatomy.n_ctx:
        raise ContextLengthError(f"{tokens.shape[1]} tokens is longer than the model's context "
                                 f"of {model.anatomy.n_ctx}; pass fewer positions")
    _check_vocab(model, int(tokens.min()), int(tokens.max()))
    tokens = tokens.long().cpu()
    convert = getattr(model.tokenizer, "convert_ids_to_tokens", None)
    names = [convert(r.tolist()) if convert else [str(i) for i in r.tolist()] for r in tokens]
    return Batch(tokens, torch.ones_like(tokens), names, tuple(range(len(tokens))))


def _check_vocab(model: Model, low: int, high: int) -> None:
    if low < 0 or high >= model.anatomy.d_vocab:
        raise InputError(
            f"token id {high if high >= model.anatomy.d_vocab else low} is outside the model's "
            f"vocabulary of {model.anatomy.d_vocab} ids: the tokenizer does not match the model")


def encode(
    model: Model, texts: str | list[str] | Tensor, *, max_length: int | None = None,
    overflow: Overflow = "error",
) -> Batch:
    """Tokenize ``texts`` for ``model`` into a right-padded ``Batch`` (token-id tensors pass through)."""
    if isinstance(texts, Tensor):
        return from_ids(model, texts)
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)) or not texts:
        raise EmptyTextError("no texts given: pass a string or a non-empty list of strings")
    if overflow not in ("error", "chunk"):
        raise InputError(f"overflow must be 'error' or 'chunk', got {overflow!r}")
    limit = int(max_length or model.anatomy.n_ctx)
    rows: list[list[int]] = []
    index: list[int] = []
    for i, text in enumerate(texts):
        if not isinstance(text, str) or not text.strip():
            raise EmptyTextError(f"text {i} is empty: give it some words to analyse")
        ids = list(model.tokenizer(text, add_special_tokens=True)["input_ids"])
        if not ids:
            raise EmptyTextError(f"text {i} tokenizes to nothing: give it some words to analyse")
        if len(ids) > limit and overflow == "error":
            raise ContextLengthError(
                f"text {i} is {len(ids)} tokens, longer than the limit of {limit} tokens "
                f"(the model's context is {model.anatomy.n_ctx}); shorten it, or pass "
                "overflow='chunk' to split it into several rows"
            )
        chunks = [ids[s:s + limit] for s in range(0, len(ids), limit)]
        rows.extend(chunks)
        index.extend([i] * len(chunks))
    return pack(model, rows, tuple(index))


def pack(model: Model, rows: list[list[int]], text_index: tuple[int, ...] | None = None) -> Batch:
    """Right-pad token-id ``rows`` into a ``Batch``, checked against the model's vocabulary."""
    if not rows or not all(rows):
        raise EmptyTextError("no tokens to pack: every row needs at least one token")
    _check_vocab(model, min(min(r) for r in rows), max(max(r) for r in rows))
    width = max(len(r) for r in rows)
    pad = _pad_id(model.tokenizer)
    tokens = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for r, ids in enumerate(rows):
        tokens[r, : len(ids)] = torch.tensor(ids)
        mask[r, : len(ids)] = 1
    index = tuple(range(len(rows))) if text_index is None else text_index
    return Batch(tokens, mask, [model.tokenizer.convert_ids_to_tokens(r) for r in rows], index)
