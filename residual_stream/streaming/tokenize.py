"""A corpus's token ids: texts grouped per tokenizer call, long texts cut into pieces.

Each text gets the ids ``rs.trace`` gives it (``tokenizer(text, add_special_tokens=True)``).
Short texts go ``TOKENIZE_CHARS`` characters' worth per call (``groups``; the fast tokenizers'
batch path). A text over ``LONG_CHARS`` characters (a book, or a corpus shipped as one line, like
text8) is cut into pieces of about ``PIECE_CHARS`` characters, each cut before a space that
follows a letter or digit and precedes a letter (``cuts``). The pieces are encoded without
special tokens, ``TOKENIZE_CHARS`` of them per call, and the text's special tokens are put
around them (``Splitter``). Its ids then come out piece by piece (``token_chunks``), so
reading a text of any length holds one piece's worth, not the whole text's: on 20 MB of
English on one line (SmolLM2's tokenizer, ``benchmarks/long_text.py``) reading every row
took 12 MiB of peak memory instead of 2,241 MiB, and 0.14 s to the first row instead of 11 s,
in ×1.02 of the time.

Cutting there gives the ids of one call for tokenizers whose pre-tokenizer splits a text
there: GPT-2's and Llama 3's byte-level patterns (SmolLM2, Qwen), WordPiece (BERT), bytes
(the twins). ``Splitter.of`` checks a tokenizer once, on a probe text cut at every such
place, and a tokenizer that gives other ids is given each long text whole, as before. A
text with no such place (no spaces, as in Chinese) is one piece.
"""

from __future__ import annotations

import hashlib
import re
import weakref
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from ..inputs import TOKENIZER_LOCK

TOKENIZE_CHARS = 1 << 16  # characters per tokenizer call (~16,000 tokens of English), at least a text
LONG_CHARS = 1 << 18      # a text longer than this is cut into pieces
PIECE_CHARS = 1 << 18     # characters per piece, at least (a cut is the next place after)
_CUT = re.compile(r"(?<=[^\W_]) (?=[^\W\d_])")  # a space after a letter or digit, before a letter
PROBE = ("The residual stream carries every write. Attention reads it, and 12 MLP layers add "
         "theirs back: one of the ways in which it is said to be a channel for all of them. "
         "Naïve café déjà vu, Straße über 東京 x1 y2 don't it's we'll, tabs\tand double  spaces,"
         "\nnew lines\n\n  indented, def f(x): return x ** 2 # code; [1, 2] {'a': 3} THE END.")
PROBE_RARE = "Ωμέγα Привет مرحبا नमस्ते 🙂🚀 ∑∫√ ½ \u00a0nbsp ＡＢＣ ﬁ Åå ẞ 0x1F 3.14159 @user #tag"


def encoder(tokenizer, special: bool = True) -> Callable[[list[str]], list[list[int]]]:
    """Token ids of a list of texts, as ``tokenizer(text, add_special_tokens=special)`` gives each.

    A fast tokenizer whose backend neither pads nor truncates is called directly
    (``encode_batch_fast``: no offsets; 1.7× the tokens per second of the Hugging Face call
    on SmolLM2's tokenizer and one core, 2.8× on two); any other goes through the
    tokenizer's own call, which sets the backend's padding and truncation for each call.
    """
    backend = getattr(tokenizer, "backend_tokenizer", None)
    fast = getattr(backend, "encode_batch_fast", None)
    if fast is not None and backend.padding is None and backend.truncation is None:
        return lambda texts: [e.ids for e in fast(texts, add_special_tokens=special)]
    return lambda texts: tokenizer(texts, add_special_tokens=special,
                                   return_attention_mask=False)["input_ids"]


def _locked(encode: Callable[[list[str]], list[list[int]]], texts: list[str]) -> list[list[int]]:
    with TOKENIZER_LOCK:  # the scan's reader thread and the caller may share a tokenizer
        return encode(texts)  # lists already (each backend's ids, or the call's input_ids)


def cuts(text: str, every: int, start: int = 0, end: int | None = None) -> list[int]:
    """Where to cut ``text[start:end]``: the first cut place (``_CUT``) at or after each ``every``."""
    end = len(text) if end is None else end
    out, pos = [], start + every
    while pos < end:
        found = _CUT.search(text, pos, end)
        if found is None:
            break
        out.append(found.start())
        pos = found.start() + every
    return out


def spans(text: str, every: int, start: int = 0, end: int | None = None) -> list[tuple[int, int]]:
    """``(start, end)`` of each piece of ``text[start:end]`` cut at ``cuts``, in order."""
    end = len(text) if end is None else end
    bounds = [start, *cuts(text, every, start, end), end]
    return list(zip(bounds, bounds[1:], strict=False))


def pieces(text: str, every: int) -> list[str]:
    """``text`` cut at ``cuts(text, every)``; they join to ``text``."""
    return [text[a:b] for a, b in spans(text, every)]


def groups(texts: Iterable[str], chars: int) -> Iterator[list[str]]:
    """Consecutive texts, each list ending with the text that brings it to ``chars`` characters."""
    group, size = [], 0
    for text in texts:
        group.append(text)
        size += len(text)
        if size >= chars:
            yield group
            group, size = [], 0
    if group:
        yield group


@dataclass(frozen=True)
class Splitter:
    """How a tokenizer frames a text's ids with special tokens, once cutting is checked exact."""

    prefix: list[int]
    suffix: list[int]
    plain: Callable[[list[str]], list[list[int]]]  # ids without special tokens

    _checked = weakref.WeakKeyDictionary()  # tokenizer → Splitter | None

    @classmethod
    def of(cls, tokenizer) -> Splitter | None:
        """The tokenizer's splitter, or None when pieces cut at ``_CUT`` change its ids.

        Checked once per tokenizer on ``PROBE`` cut at every cut place: the ids with special
        tokens must be a prefix, the pieces' plain ids in order, and a suffix.
        """
        try:
            return cls._checked[tokenizer]
        except (KeyError, TypeError):
            pass
        plain, whole = encoder(tokenizer, special=False), encoder(tokenizer)
        framed, alone = _locked(whole, [PROBE])[0], _locked(plain, [PROBE])[0]
        joined = [i for ids in _locked(plain, pieces(PROBE, 1)) for i in ids]
        splitter = None
        for k in range(len(framed) - len(alone) + 1):
            if framed[k:k + len(alone)] == alone == joined:
                splitter = cls(framed[:k], framed[k + len(alone):], plain)
                break
        try:
            cls._checked[tokenizer] = splitter
        except TypeError:  # a tokenizer that cannot be weakly referenced is checked each time
            pass
        return splitter


def can_cut(tokenizer) -> bool:
    """Whether ``tokenizer`` keeps its ids when a text is cut between words (``Splitter``)."""
    return Splitter.of(tokenizer) is not None


def token_chunks(tokenizer, texts: Iterable[str]) -> Iterator[tuple[int, list[int], int]]:
    """``(text number, ids, characters)``: each text's ids in order, a long text's in chunks.

    A text's chunks are consecutive and join to its ids (``token_ids``); a short text is one
    chunk. Long texts are cut only when the tokenizer's ``Splitter`` is exact. ``characters``:
    how much of the text the chunk's ids stand for (``progress``). Texts go ``TOKENIZE_CHARS``
    a call (``groups``); a long text is longer than that, so it always ends its group.
    """
    encode, first = encoder(tokenizer), 0
    for group in groups(texts, TOKENIZE_CHARS):
        last = len(group) - 1
        splitter = Splitter.of(tokenizer) if len(group[last]) > LONG_CHARS else None
        short = group[:last] if splitter else group
        if short:
            ids = _locked(encode, short)
            yield from ((first + t, i, len(text))
                        for t, (text, i) in enumerate(zip(short, ids, strict=True)))
        if splitter:
            yield from _long(first + last, group[last], splitter)
        first += len(group)


def _long(t: int, text: str, splitter: Splitter, start: int = 0,
          end: int | None = None) -> Iterator[tuple[int, list[int], int]]:
    """Text ``t``'s ids from ``text[start:end]``, ``TOKENIZE_CHARS`` of its pieces per call.

    The text's special tokens frame them where the span holds its start or its end.
    """
    end = len(text) if end is None else end
    parts = spans(text, PIECE_CHARS, start, end)  # each piece is copied when its call comes
    per_call = max(1, TOKENIZE_CHARS // PIECE_CHARS)
    if start == 0:
        yield t, list(splitter.prefix), 0
    for i in range(0, len(parts), per_call):
        call = [text[a:b] for a, b in parts[i:i + per_call]]
        for part, ids in zip(call, _locked(splitter.plain, call), strict=True):
            yield t, ids, len(part)
    if end == len(text):
        yield t, list(splitter.suffix), 0


def part_chunks(tokenizer, text: str, span: tuple[int, int]) -> Iterator[tuple[int, list[int], int]]:
    """``token_chunks`` of the part ``text[span[0]:span[1]]`` of a text cut at ``cuts`` places.

    The parts' ids, in order, join to the text's (the tokenizer's ``Splitter`` must exist):
    the first holds its leading special tokens, the last its trailing ones.
    """
    splitter = Splitter.of(tokenizer)
    if splitter is None:
        raise ValueError("a text can be cut into parts only for a tokenizer with a Splitter")
    yield from _long(0, text, splitter, *span)


def fingerprint(tokenizer) -> str:
    """A hash of what ``tokenizer`` makes of ``PROBE`` and ``PROBE_RARE``.

    With special tokens and without: two tokenizers that differ there would not give one
    scan the same rows (``state.scan_config``).
    """
    h = hashlib.sha256()
    for special in (True, False):
        for ids in _locked(encoder(tokenizer, special=special), [PROBE, PROBE_RARE]):
            h.update(b",".join(str(i).encode() for i in ids) + b";")
    return h.hexdigest()[:16]


def token_ids(tokenizer, texts: Iterable[str]) -> Iterator[list[int]]:
    """Each text's token ids (special tokens added), joined from ``token_chunks``."""
    current, ids = None, []
    for t, chunk, _ in token_chunks(tokenizer, texts):
        if t != current and current is not None:
            yield ids
            ids = []
        current = t
        ids += chunk
    if current is not None:
        yield ids
