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
from residual_stream.streaming import progress as progress_module
from residual_stream.streaming.corpus import builtin_corpus
from residual_stream.streaming.progress import ReadProgress
from residual_stream.streaming.sources import chars_per_byte


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def test_the_estimate_by_hand():
    p = ReadProgress({"items": 1000})
    assert p.estimate() is None  # nothing read yet
    p.read("items", chars=150, units=50)
    p.read("items", chars=50, units=100)  # 200 characters in 100 units: 2 a unit
    assert p.estimate() is None  # nothing tokenized yet
    p.tokenized(chars=60, tokens=15)
    p.tokenized(chars=40, tokens=10)  # 25 tokens for 100 characters
    assert p.estimate() == 500 and p.estimate(world_size=2) == 250  # 0.25 × 2 × 1000


def test_a_kind_not_read_yet_counts_at_its_probe_then_at_its_reading(monkeypatch):
    p = ReadProgress({".txt": 1000, ".txt.gz": 400}, probes={".txt": 1.0, ".txt.gz": 3.0})
    p.read(".txt", chars=200, units=100)  # 2 characters a byte read, against the probe's 1
    p.tokenized(chars=100, tokens=25)
    assert p.estimate() == round(0.25 * (1 * 1000 + 3 * 400))  # 550: both at their probes
    p.read(".txt", chars=1800, units=1000)
    assert p.estimate() == 550  # a position is a read block ahead of the texts: not yet trusted
    p.file_ended(".txt", units=1000)  # every plain byte read: 2 a byte, exactly
    assert p.estimate() == round(0.25 * (2 * 1000 + 3 * 400))  # 800: the gzipped at its probe
    p.read(".txt.gz", chars=400, units=100)
    assert p.estimate() == 800  # 100 of 400 units read: still the probe
    p.read(".txt.gz", chars=1200, units=400)
    p.file_ended(".txt.gz", units=400)  # 4 a compressed byte
    assert p.estimate() == round(0.25 * (2 * 1000 + 4 * 400))  # 900
    monkeypatch.setattr(progress_module, "TRUSTED_UNITS", 50)
    q = ReadProgress({".txt": 1000, ".jsonl": 500}, probes={".txt": 1.0})
    q.read(".txt", chars=200, units=100)  # past 50 units: measured
    q.tokenized(chars=100, tokens=25)
    assert q.estimate() == round(0.25 * 2 * 1500)  # no probe for .jsonl: the mean of the known


def test_the_probe_reads_characters_per_byte_as_the_reading_counts_them(tmp_path):
    texts = ["naïve café", "  padded  ", "plain ascii text"]
    plain = tmp_path / "a.txt"
    plain.write_text("\n".join(texts) + "\n\n", encoding="utf-8")
    chars = len("naïve café") + len("padded") + len("plain ascii text")  # stripped, blank skipped
    assert chars_per_byte(plain) == pytest.approx(chars / plain.stat().st_size)
    zipped = tmp_path / "b.jsonl.gz"
    with gzip.open(zipped, "wt", encoding="utf-8") as f:
        f.writelines(json.dumps({"body": t, "n": 1}) + "\n" for t in texts)
    assert chars_per_byte(zipped, "body") == pytest.approx(sum(map(len, texts)) / zipped.stat().st_size)
    big = tmp_path / "c.txt"  # longer than the probe: its whole lines over their bytes
    big.write_text("x" * 99 + "\n" + "abc\n" * 300_000, encoding="utf-8")
    assert chars_per_byte(big) == pytest.approx(0.75, rel=1e-3)
    (tmp_path / "d.txt.gz").write_bytes(b"not gzip at all")
    assert chars_per_byte(tmp_path / "d.txt.gz") is None  # the reading will say why


def test_a_folder_of_plain_and_gzipped_files_is_estimated_before_the_gzipped_are_reached(
        model, tmp_path):
    """Before session 15 the plain files' characters per byte stood for the gzipped ones too,
    which hold about 3 times as many: the estimate was half the tokens until they were read."""
    lines = builtin_corpus() * 20
    (tmp_path / "a.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    with gzip.open(tmp_path / "b.txt.gz", "wt", encoding="utf-8") as f:
        f.writelines(t + "\n" for t in lines[::-1])
    corpus = Corpus(tmp_path, segment_chars=50_000)
    assert set(corpus.units()) == {".txt", ".txt.gz"}
    progress = corpus.progress()
    assert progress.probes[".txt.gz"] > 2.5 * progress.probes[".txt"]
    estimates, tokens = _estimate(model, corpus, batch_size=64, seq_len=32)
    assert abs(estimates[-1] - tokens) < 0.01 * tokens
    for at in (0.1, 0.25, 0.5, 0.75):  # the plain file is read first, then the gzipped one
        assert abs(estimates[int(len(estimates) * at)] - tokens) < 0.02 * tokens, at


def _estimate(model, corpus: Corpus, **kw) -> tuple[list[int | None], int]:
    """The estimate after each batch, and the tokens read in all."""
    progress = corpus.progress()
    estimates, tokens = [], 0
    for batch in row_batches(model, corpus, reading=progress, order="text", **kw):
        tokens += sum(map(len, batch.rows))
        estimates.append(progress.estimate())
    return estimates, tokens


def test_a_list_corpus_is_estimated_exactly_once_read_and_closely_before(model):
    texts = builtin_corpus()[:120] + ["", "  "]  # blank texts: units without characters
    corpus = Corpus(texts, segment_chars=1500)
    assert corpus.units() == {"items": 122}
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
    kind = ".jsonl.gz" if zipped else ".txt"
    assert corpus.units() == {kind: sum(f.stat().st_size for f in tmp_path.iterdir())}
    estimates, tokens = _estimate(model, corpus, batch_size=64, seq_len=32)
    assert abs(estimates[-1] - tokens) < 0.01 * tokens
    assert abs(estimates[len(estimates) // 4] - tokens) < 0.1 * tokens


def test_the_progress_bar_ends_at_the_tokens_scanned(model, capsys):
    result = rs.scan(model, builtin_corpus()[:40], "growth", batch_size=4, seq_len=16)
    bar = capsys.readouterr().err.strip().splitlines()[-1].split("\r")[-1]
    assert "100%" in bar and f"{result.tokens / 1000:.2f}k/{result.tokens / 1000:.2f}k" in bar, bar
