"""The scan's estimate of its corpus's tokens, against the tokens the corpus really holds.

The reference is the token count of every batch ``row_batches`` reads; the estimate
``progress.ReadProgress`` makes while reading (``tokens per character × characters per
unit × units``) must reach it exactly for a list (a unit is an item) and to the byte
position's block for files, and be close once a part of a uniform corpus is read.
"""

from __future__ import annotations

import gzip
import json

import pytest

import residual_stream as rs
from residual_stream.streaming import Corpus, row_batches
from residual_stream.streaming.corpus import builtin_corpus
from residual_stream.streaming.progress import ReadProgress


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def test_the_estimate_by_hand():
    p = ReadProgress(total=1000)
    assert p.estimate() is None  # nothing read yet
    p.read(chars=150, units=50)
    p.read(chars=50, units=100)  # 200 characters in 100 units: 2 a unit
    assert p.estimate() is None  # nothing tokenized yet
    p.tokenized(chars=60, tokens=15)
    p.tokenized(chars=40, tokens=10)  # 25 tokens for 100 characters
    assert p.estimate() == 500 and p.estimate(world_size=2) == 250  # 0.25 × 2 × 1000


def _estimate(model, corpus: Corpus, **kw) -> tuple[list[int | None], int]:
    """The estimate after each batch, and the tokens read in all."""
    progress = ReadProgress(corpus.units())
    estimates, tokens = [], 0
    for batch in row_batches(model, corpus, reading=progress, order="text", **kw):
        tokens += sum(map(len, batch.rows))
        estimates.append(progress.estimate())
    return estimates, tokens


def test_a_list_corpus_is_estimated_exactly_once_read_and_closely_before(model):
    texts = builtin_corpus()[:120] + ["", "  "]  # blank texts: units without characters
    corpus = Corpus(texts, segment_chars=1500)
    assert corpus.units() == 122
    estimates, tokens = _estimate(model, corpus, batch_size=4, seq_len=16)
    assert estimates[-1] == tokens
    assert abs(estimates[len(estimates) // 4] - tokens) < 0.1 * tokens  # a quarter of the way


@pytest.mark.parametrize("zipped", [False, True])
def test_files_are_estimated_by_their_bytes(model, tmp_path, zipped):
    """Two files of one kind: text lines, or gzipped JSON Lines (a unit is then a byte of the
    compressed file). Positions come in read blocks (8 KiB of a file, 128 KiB of a gzip
    stream's compressed bytes), so the files are large against them: 0.5 MB each unzipped."""
    lines = builtin_corpus() * 20
    for name in ("a", "b"):
        if zipped:
            with gzip.open(tmp_path / f"{name}.jsonl.gz", "wt", encoding="utf-8") as f:
                f.writelines(json.dumps({"text": f"{t} ünï {i}"}) + "\n" for i, t in enumerate(lines))
        else:
            (tmp_path / f"{name}.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    corpus = Corpus(tmp_path, segment_chars=50_000)
    assert corpus.units() == sum(f.stat().st_size for f in tmp_path.iterdir())
    estimates, tokens = _estimate(model, corpus, batch_size=64, seq_len=32)
    assert abs(estimates[-1] - tokens) < 0.01 * tokens
    assert abs(estimates[len(estimates) // 4] - tokens) < 0.1 * tokens


def test_the_progress_bar_ends_at_the_tokens_scanned(model, capsys):
    result = rs.scan(model, builtin_corpus()[:40], "growth", batch_size=4, seq_len=16)
    bar = capsys.readouterr().err.strip().splitlines()[-1].split("\r")[-1]
    assert "100%" in bar and f"{result.tokens / 1000:.2f}k/{result.tokens / 1000:.2f}k" in bar, bar
