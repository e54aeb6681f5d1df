"""Inputs: texts to a right-padded token batch, with the checks that keep analyses honest.

Each text becomes one row (``overflow="chunk"`` splits a long text into several rows).
Padding is on the right and marked by ``attention_mask == 0``; causal models therefore see
exactly what they would see unpadded, and every analysis excludes the pads.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numpy as np
import torch
from jaxtyping import Int
from torch import Tensor

from .errors import ContextLengthError, EmptyTextError, InputError, as_index

if TYPE_CHECKING:
    from .loading import Model

Overflow = Literal["error", "chunk"]
CHUNK = "overflow='chunk'"  # how a too-long text's error advises chunking (the CLI: --overflow chunk)
TOKENIZER_LOCK = threading.Lock()  # a scan tokenizes in a reader thread; conversions share it


@dataclass(frozen=True, eq=False)
class Batch:
    """Token ids ``[batch, pos]``, the mask, token strings, and where each row came from.

    Row ``r`` is text ``text_index[r]`` from its token ``text_start[r]`` on (a long text cut
    into several rows has one start per row; a scan's ``text_index`` counts the corpus's texts),
    its tokens counted from the text's character ``text_char[r]`` (0 but in a part of a text
    that a scan cut into parts: ``streaming.corpus.Segment``).
    """

    tokens: Int[Tensor, "batch pos"]
    attention_mask: Int[Tensor, "batch pos"]
    str_tokens: Sequence[list[str]]
    text_index: tuple[int, ...]
    text_start: tuple[int, ...] = ()
    text_char: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        """Rows start at their texts' first token unless told otherwise."""
        for name in ("text_start", "text_char"):
            if not getattr(self, name):
                object.__setattr__(self, name, (0,) * len(self.text_index))


class TokenStrings(Sequence):
    """Each row's token strings, converted the first time the row is read.

    A scan names only the few tokens it reports (the massive activations), so its batches
    convert no row they never show (``pack(..., names="lazy")``); a row reads as a list.
    """

    def __init__(self, tokenizer: object, rows: list[list[int]]) -> None:
        """The strings of ``rows`` (token ids) under ``tokenizer``, none converted yet."""
        self._tokenizer, self._rows = tokenizer, rows
        self._done: dict[int, list[str]] = {}

    def __len__(self) -> int:
        """The number of rows."""
        return len(self._rows)

    def __getitem__(self, i):
        """Row ``i``'s token strings (a slice gives a list of rows)."""
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = range(len(self))[i]  # negative indices, and IndexError past the end
        if i not in self._done:
            self._done[i] = _names(self._tokenizer, self._rows[i])
        return self._done[i]

    def __eq__(self, other: object) -> bool:
        """Equal to any sequence of the same rows' strings (a list of lists, say)."""
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable cache; compares by value


def _names(tokenizer: object, ids: list[int]) -> list[str]:
    convert = getattr(tokenizer, "convert_ids_to_tokens", None)
    if convert is None:
        return [str(i) for i in ids]
    with TOKENIZER_LOCK:
        return convert(ids)


class ByteTokenizer:
    """A dependency-free tokenizer: UTF-8 bytes are ids 0..255, BOS is 256 (for the twins)."""

    vocab_size = 257
    bos_token_id = 256
    pad_token_id = 0
    eos_token_id = None

    def __call__(self, text: str | list[str], add_special_tokens: bool = True,
                 **_: object) -> dict[str, list]:
        """Encode ``text`` (or a list of texts) like a Hugging Face tokenizer call.

        Returns ``{"input_ids": ids}``, ``ids`` a list per text for a list; other keyword
        arguments of the Hugging Face call (``return_attention_mask``) change nothing here.
        """
        if isinstance(text, list):
            return {"input_ids": [self(t, add_special_tokens)["input_ids"] for t in text]}
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
    if tokens.ndim != 2 or tokens.numel() == 0 or tokens.dtype.is_floating_point \
            or tokens.dtype.is_complex or tokens.dtype == torch.bool:
        raise InputError(f"token ids must be a non-empty integer tensor [batch, pos], got "
                         f"{tuple(tokens.shape)} of {tokens.dtype}")
    if tokens.shape[1] > model.anatomy.n_ctx:
        raise ContextLengthError(f"{tokens.shape[1]} tokens is longer than the model's context "
                                 f"of {model.anatomy.n_ctx}; pass fewer positions")
    _check_vocab(model, int(tokens.min()), int(tokens.max()))
    tokens = tokens.long().cpu()
    names = [_names(model.tokenizer, r.tolist()) for r in tokens]
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
    n_ctx = model.anatomy.n_ctx
    if max_length is not None and (as_index(max_length) is None or not 1 <= max_length <= n_ctx):
        raise InputError(f"max_length must be a whole number between 1 and the model's context of "
                         f"{n_ctx}, got {max_length!r}")
    if overflow not in ("error", "chunk"):
        raise InputError(f"overflow must be 'error' or 'chunk', got {overflow!r}")
    if isinstance(texts, Tensor):
        batch = from_ids(model, texts)
        if max_length is not None and batch.tokens.shape[1] > max_length:
            raise ContextLengthError(f"the token ids are {batch.tokens.shape[1]} positions, over "
                                     f"max_length={max_length}: cut them (ids[:, :{max_length}])")
        return batch
    if isinstance(texts, str):
        texts = [texts]
    if not isinstance(texts, (list, tuple)):
        kind = getattr(getattr(texts, "dtype", None), "kind", "")  # numpy / pandas: "O", "U" for text
        hint = (": texts.tolist() makes a list of it" if kind in ("O", "U", "S") else
                ": torch.as_tensor(ids) makes one of an array of ids") if hasattr(texts, "__array__") else ""
        raise InputError(f"texts are a string, a list of strings or a torch integer tensor [batch, "
                         f"pos] of token ids, not a {type(texts).__name__}{hint}")
    if not texts:
        raise EmptyTextError("no texts given: pass a string or a non-empty list of strings")
    limit = int(max_length or model.anatomy.n_ctx)
    rows: list[list[int]] = []
    index: list[int] = []
    starts: list[int] = []
    for i, text in enumerate(texts):
        ids = _ids(model, i, text, limit, overflow)
        cuts = range(0, len(ids), limit)
        starts.extend(cuts)
        rows.extend(ids[s:s + limit] for s in cuts)
        index.extend([i] * len(cuts))
    return pack(model, rows, tuple(index), tuple(starts))


def _ids(model: Model, i: int, text: object, limit: int, overflow: Overflow) -> list[int]:
    """Text ``i``'s token ids, refused when empty, not Unicode, or over ``limit`` unchunked."""
    if not isinstance(text, str):
        hint = " (decode it: text.decode('utf-8'))" if isinstance(text, bytes) else (
            ": give texts as strings, or token ids as a torch integer tensor [batch, pos]")
        raise InputError(f"text {i} is a {type(text).__name__}, not a string{hint}")
    if not text.strip():
        raise EmptyTextError(f"text {i} is empty: give it some words to analyse")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:  # lone surrogates: bytes a shell could not decode
        raise InputError(f"text {i} is not valid Unicode at character {e.start} (bytes that "
                         "are not UTF-8?): give the text as UTF-8") from None
    ids = _tokenized(model, text, True)
    if len(ids) <= 4 and not _tokenized(model, text, False):  # at most the ids a tokenizer adds
        raise EmptyTextError(f"text {i} tokenizes to nothing{' but special tokens' if ids else ''} "
                             f"({text[:20]!r}: characters the tokenizer drops): give it some words to "
                             "analyse")
    if len(ids) > limit and overflow == "error":
        raise ContextLengthError(
            f"text {i} is {len(ids)} tokens, longer than the limit of {limit} tokens "
            f"({model.name}'s context is {model.anatomy.n_ctx}); shorten it, or pass "
            f"{CHUNK} to split it into several rows", tokens=len(ids), limit=limit,
            model=model.name)
    return ids


def _tokenized(model: Model, text: str, special: bool) -> list[int]:
    """The tokenizer's ids of ``text``, checked to be whole numbers (``InputError`` naming what it gave)."""
    quiet = {"verbose": False} if hasattr(model.tokenizer, "model_max_length") else {}  # Hugging Face's:
    out = model.tokenizer(text, add_special_tokens=special, **quiet)  # no "longer than the maximum" log
    ids = out.get("input_ids") if hasattr(out, "get") else None
    if not isinstance(ids, list | tuple) or not all(
            isinstance(t, int | np.integer) and not isinstance(t, bool) for t in ids):
        shown = type(out).__name__ if ids is None else f"input_ids {str(ids)[:60]}"
        raise InputError(f"the tokenizer returned {shown}, not {{'input_ids': [whole numbers]}} as a Hugging "
                         "Face tokenizer does for one text: give rs.load a tokenizer of that form")
    return [int(t) for t in ids]


def pack(model: Model, rows: list[list[int]], text_index: tuple[int, ...] | None = None,
         text_start: tuple[int, ...] | None = None, *, names: Literal["now", "lazy"] = "now",
         text_char: tuple[int, ...] = ()) -> Batch:
    """Right-pad token-id ``rows`` into a ``Batch``, checked against the model's vocabulary.

    ``text_index``, ``text_start``, ``text_char``: where each row came from (default: row
    ``r`` is text ``r`` from its start). ``names="lazy"``: token strings are converted per row when first
    read (``TokenStrings``; what a scan wants, which names a few tokens of its batches at most).
    """
    if not rows or not all(rows):
        raise EmptyTextError("no tokens to pack: every row needs at least one token")
    lengths = torch.tensor([len(r) for r in rows])
    flat = torch.tensor(list(itertools.chain.from_iterable(rows)), dtype=torch.long)
    _check_vocab(model, int(flat.min()), int(flat.max()))
    mask = (torch.arange(int(lengths.max())) < lengths[:, None]).long()
    tokens = torch.full(mask.shape, _pad_id(model.tokenizer), dtype=torch.long)
    tokens[mask.bool()] = flat  # row-major: each row's ids in order, then the next row's
    index = tuple(range(len(rows))) if text_index is None else text_index
    strings = (TokenStrings(model.tokenizer, rows) if names == "lazy"
               else [_names(model.tokenizer, r) for r in rows])
    return Batch(tokens, mask, strings, index, text_start or (), text_char)
