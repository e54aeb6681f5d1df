"""Corpus files compressed with gzip, xz, bzip2 or zstd, read as they stream (``streaming.packing``).

The Pile and SlimPajama ship JSON Lines as ``.jsonl.zst``; they, ``.xz`` and ``.bz2`` files were
refused ("compress it with gzip"). Reference: Python's own decompressors (``gzip``, ``lzma``,
``bz2``) and ``zstandard``'s one-shot ``decompress`` of the same bytes, and ``rs.scan`` of the
plain texts.
"""

from __future__ import annotations

import bz2
import gzip
import json
import lzma
import sys

import pytest
import zstandard
from conftest import assert_scan_of_texts

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming import Corpus
from residual_stream.streaming.sources import file_texts

PACK = {".gz": gzip.compress, ".xz": lzma.compress, ".bz2": bz2.compress,
        ".zst": lambda data: zstandard.ZstdCompressor().compress(data)}
UNPACK = {".gz": gzip.decompress, ".xz": lzma.decompress, ".bz2": bz2.decompress,
          ".zst": lambda data: zstandard.ZstdDecompressor().decompress(data)}
TEXTS = [f"Text {i}: the residual stream, café {'и' * (i % 7)}." for i in range(3000)]
RECORDS = "".join(json.dumps({"text": t, "id": i}) + "\n" for i, t in enumerate(TEXTS)).encode()


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


@pytest.mark.parametrize("suffix", list(PACK))
@pytest.mark.parametrize("base", [".txt", ".jsonl", ".json"])
def test_each_packing_reads_the_texts_its_decompressor_gives(tmp_path, base, suffix):
    """Every text, in order; each position is the compressed bytes read so far, the file's size at
    the end (a progress estimate is exact there)."""
    plain = ("\n".join(TEXTS) + "\n").encode() if base == ".txt" else RECORDS
    path = tmp_path / f"corpus{base}{suffix}"
    path.write_bytes(PACK[suffix](plain))
    assert UNPACK[suffix](path.read_bytes()) == plain  # the reference reads it back
    read = list(file_texts(path))
    assert [t for t, _ in read] == TEXTS
    positions = [p for _, p in read]
    assert positions == sorted(positions) and positions[-1] == path.stat().st_size


def test_zstd_frames_are_read_in_turn_and_a_file_cut_short_is_named(tmp_path):
    """As ``zstd -dc`` reads a file of several frames (pzstd writes them). A file cut inside a frame
    read as a shorter corpus through zstandard's own stream reader; it is now refused, as a gzip,
    xz or bzip2 file cut short is, after the texts before the cut."""
    half = len(RECORDS) // 2
    cut_at = RECORDS.rindex(b"\n", 0, half) + 1
    two = PACK[".zst"](RECORDS[:cut_at]) + PACK[".zst"](RECORDS[cut_at:])
    (tmp_path / "two.jsonl.zst").write_bytes(two)
    assert list(Corpus(tmp_path / "two.jsonl.zst").texts()) == TEXTS
    names = {".gz": "gzip", ".xz": "xz", ".bz2": "bzip2", ".zst": "zstd"}
    for suffix, name in names.items():
        packed = PACK[suffix](RECORDS)
        path = tmp_path / f"cut.jsonl{suffix}"
        path.write_bytes(packed[:len(packed) * 2 // 3])
        read = []
        with pytest.raises(InputError, match=rf"cut.jsonl{suffix} is not a complete {name} file \("):
            read.extend(Corpus(path).texts())
        assert read == TEXTS[:len(read)] and len(read) < len(TEXTS), suffix


def test_a_scan_of_a_folder_of_every_packing_equals_the_scan_of_its_texts(model, tmp_path):
    parts = [TEXTS[i::4][:40] for i in range(4)]
    for (suffix, pack), texts in zip(PACK.items(), parts, strict=True):
        records = "".join(json.dumps({"text": t}) + "\n" for t in texts).encode()
        (tmp_path / f"part{suffix[1:]}.jsonl{suffix}").write_bytes(pack(records))
    order = sorted(PACK, key=lambda s: f"part{s[1:]}.jsonl{s}")  # the folder is read in name order
    want_texts = [t for s in order for t in parts[list(PACK).index(s)]]
    assert list(Corpus(tmp_path).texts()) == want_texts
    assert_scan_of_texts(model, tmp_path, want_texts, ["growth"], batch_size=4, seq_len=32)


def test_bytes_that_are_not_utf8_in_a_compressed_file_are_found_in_its_unpacked_text(tmp_path):
    data = b"fine\ncaf\xe9\n"
    for suffix, tools in {".xz": ("xz -dc", "xz"), ".zst": ("zstd -dc", "zstd")}.items():
        path = tmp_path / f"latin1.txt{suffix}"
        path.write_bytes(PACK[suffix](data))
        with pytest.raises(InputError, match=rf"byte 8 of its unpacked text \(line 2\) is 0xe9.*"
                                             rf"{tools[0]} latin1.txt{suffix} \| iconv -f latin1 -t utf-8 \| "
                                             rf"{tools[1]} > utf8-latin1.txt{suffix}"):
            list(Corpus(path).texts())
        with pytest.warns(UserWarning, match=r"byte 8 of its unpacked text \(line 2\)"):
            assert list(Corpus(path, encoding_errors="replace").texts()) == ["fine", "caf\ufffd"]


def test_without_zstandard_a_zst_file_says_what_to_install(tmp_path, monkeypatch):
    (tmp_path / "c.jsonl.zst").write_bytes(PACK[".zst"](RECORDS))
    monkeypatch.setitem(sys.modules, "zstandard", None)  # import zstandard: ImportError
    with pytest.raises(InputError, match="needs the zstandard package: pip install zstandard"):
        list(Corpus(tmp_path / "c.jsonl.zst").texts())


@pytest.mark.parametrize("suffix", list(PACK))
def test_each_packing_is_probed_for_its_characters_per_byte_before_it_is_read(tmp_path, suffix):
    """The progress estimate's prior for a kind not read yet (``sources.chars_per_byte``): xz,
    bzip2 and zstd had none before (gzip's alone was read). A file of varied lines larger than
    the probe's 256 KiB; reference: all its characters over all its compressed bytes."""
    import random

    from residual_stream.streaming.sources import chars_per_byte

    rng = random.Random(0)
    words = ["stream", "residual", "norm", "attention", "écriture", "layer", "token", "read"]
    texts = [" ".join(rng.choice(words) for _ in range(rng.randint(3, 40))) for _ in range(60_000)]
    path = tmp_path / f"varied.jsonl{suffix}"
    path.write_bytes(PACK[suffix]("".join(json.dumps({"text": t}) + "\n" for t in texts).encode()))
    assert path.stat().st_size > (1 << 18)  # the probe reads a part of it
    truth = sum(map(len, texts)) / path.stat().st_size
    assert chars_per_byte(path) == pytest.approx(truth, rel=0.02)  # measured: within 0.71 %
    (tmp_path / f"junk.txt{suffix}").write_bytes(PACK[suffix](b"x" * 100)[:8] + b"\0junk" * 50)
    assert chars_per_byte(tmp_path / f"junk.txt{suffix}") is None  # the reading will say why
