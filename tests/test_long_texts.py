"""Long texts tokenized in pieces: the ids of one call per text, in bounded calls.

The reference is one tokenizer call on the whole text (what ``rs.trace`` does), for the
three kinds of tokenizer shipped: SmolLM2's byte-level BPE, MiniLM's WordPiece (lower-cased,
framed by [CLS] and [SEP]) and the twins' bytes (a BOS in front).
"""

from __future__ import annotations

import pytest

import residual_stream as rs
from residual_stream.inputs import ByteTokenizer
from residual_stream.streaming import Corpus, row_batches
from residual_stream.streaming import tokenize as tokenize_module
from residual_stream.streaming.batching import RowBatch
from residual_stream.streaming.corpus import builtin_corpus
from residual_stream.streaming.tokenize import (
    Splitter,
    cuts,
    part_chunks,
    pieces,
    spans,
    token_chunks,
    token_ids,
)


def _twin():
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def _one_call(tokenizer, texts: list[str]) -> list[list[int]]:
    return [list(tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]


def _small_pieces(monkeypatch) -> None:
    monkeypatch.setattr(tokenize_module, "LONG_CHARS", 500)
    monkeypatch.setattr(tokenize_module, "PIECE_CHARS", 60)
    monkeypatch.setattr(tokenize_module, "TOKENIZE_CHARS", 240)


def test_cut_places_by_hand():
    text = "ab cd ef 12 gh ij"  # spaces at 2, 5, 8 (before a digit: no), 11 (after one: yes), 14
    assert cuts(text, 1) == [2, 5, 11, 14]
    assert cuts(text, 4) == [5, 11]  # the first place at or after 4, then 5 + 4 = 9 → 11, 15 → none
    assert pieces(text, 4) == ["ab cd", " ef 12", " gh ij"]
    assert "".join(pieces(text, 1)) == text
    assert cuts("x  y, z_ a", 1) == []  # two spaces, a comma, an underscore: no place
    assert cuts("東京大学" * 50, 4) == []  # no spaces: one piece


@pytest.mark.parametrize("name", ["smollm2", "minilm", "twin"])
def test_long_texts_in_pieces_give_the_ids_of_one_call(name, request, monkeypatch):
    tokenizer = (_twin() if name == "twin" else request.getfixturevalue(name)).tokenizer
    _small_pieces(monkeypatch)
    lines = builtin_corpus()
    long_a = " ".join(lines[:40]) + " naïve café über 東京 don't"   # English, then code lines
    long_b = "\n".join(lines[-100:])  # 100 lines of Python, newlines kept
    texts = ["a short one", long_a, lines[50], long_b, "and the last"]
    assert min(len(long_a), len(long_b)) > 4 * tokenize_module.LONG_CHARS
    assert Splitter.of(tokenizer) is not None
    assert list(token_ids(tokenizer, texts)) == _one_call(tokenizer, texts)
    chunks = [t for t, _, _ in token_chunks(tokenizer, texts)]
    assert chunks.count(1) > 5 and chunks.count(3) > 5 and chunks == sorted(chunks)
    for text in (long_a, long_b):  # a text cut into parts (segments), each in pieces
        parts = spans(text, 3 * tokenize_module.PIECE_CHARS)
        assert len(parts) > 3
        joined = [i for span in parts for _, ids, _ in part_chunks(tokenizer, text, span) for i in ids]
        assert joined == _one_call(tokenizer, [text])[0]  # special tokens at the ends only


def test_a_long_text_at_the_default_sizes_gives_the_ids_of_one_call_in_bounded_calls(
        smollm2, monkeypatch):
    text = " ".join(builtin_corpus()) * 60  # ~1.5 MB, one text
    calls: list[int] = []
    locked = tokenize_module._locked  # every tokenizer call goes through it
    monkeypatch.setattr(tokenize_module, "_locked", lambda encode, texts: calls.append(
        sum(map(len, texts))) or locked(encode, texts))
    got = list(token_ids(smollm2.tokenizer, [text]))
    largest = max(tokenize_module.TOKENIZE_CHARS, tokenize_module.PIECE_CHARS)
    assert len(text) > 5 * largest
    assert got == _one_call(smollm2.tokenizer, [text])
    assert len(calls) > 5 and max(calls) <= 1.01 * largest


class PrefixedBytes(ByteTokenizer):
    """Bytes with a marker in front of every call's text, as a dummy prefix would put one."""

    def __call__(self, text, add_special_tokens=True, **kw):
        """``ByteTokenizer``'s ids of ``"_" + text``."""
        if isinstance(text, list):
            return {"input_ids": [self(t, add_special_tokens)["input_ids"] for t in text]}
        return super().__call__("_" + text, add_special_tokens)


def test_a_tokenizer_that_pieces_would_change_gets_each_long_text_whole(monkeypatch):
    _small_pieces(monkeypatch)
    tokenizer = PrefixedBytes()
    text = " ".join(builtin_corpus()[:40])
    assert Splitter.of(tokenizer) is None
    whole = _one_call(tokenizer, ["x", text])
    assert list(token_chunks(tokenizer, ["x", text])) == [(0, whole[0], 1), (1, whole[1], len(text))]
    corpus = Corpus(["x", text], segment_chars=100)  # nor is it cut into parts
    assert [(s.first, s.span) for s in corpus.segments(cut=lambda: Splitter.of(tokenizer) is not None)
            ] == [(0, None)]
    with pytest.raises(ValueError, match="Splitter"):
        next(part_chunks(tokenizer, text, (0, 100)))


def test_rows_are_cut_across_a_long_texts_pieces(monkeypatch):
    model = _twin()
    _small_pieces(monkeypatch)
    text = " ".join(builtin_corpus()[:8])  # ~600 bytes: 10 pieces, 39 rows of 16
    texts = ["first", text, "last one"]
    ids = _one_call(model.tokenizer, texts)
    rows = [(ids[0], 0, 0)] + [(ids[1][s:s + 16], 1, s) for s in range(0, len(ids[1]), 16)] + \
        [(ids[2], 2, 0)]
    assert len(pieces(text, tokenize_module.PIECE_CHARS)) > 5
    expected = [RowBatch([r for r, _, _ in part], tuple(t for _, t, _ in part),
                         tuple(s for _, _, s in part), 0, i // 4)
                for i in range(0, len(rows), 4) for part in [rows[i:i + 4]]]
    assert list(row_batches(model, Corpus(texts), batch_size=4, seq_len=16, order="text")) == expected
