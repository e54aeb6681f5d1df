"""The corpus reader: grouped tokenization, vectorized packing, lazy token strings, read-ahead.

References are the one-text-at-a-time paths they replace: a tokenizer call per text (what
``rs.trace`` does), a row-by-row padding loop, and ``convert_ids_to_tokens`` per row.
"""

from __future__ import annotations

import threading

import pytest
import torch
from conftest import Column
from spies import counting_twin, segment_inputs

import residual_stream as rs
from residual_stream.errors import EmptyTextError, InputError
from residual_stream.inputs import TokenStrings, pack
from residual_stream.streaming import Corpus, batching, corpus_batches, row_batches
from residual_stream.streaming import tokenize as tokenize_module
from residual_stream.streaming.batching import RowBatch
from residual_stream.streaming.corpus import Segment, builtin_corpus
from residual_stream.streaming.ledger import Share
from residual_stream.streaming.reader import prefetched
from residual_stream.streaming.tokenize import token_ids


@pytest.mark.parametrize("name", ["smollm2", "minilm"])
def test_grouped_tokenization_gives_each_texts_own_ids(name, request, monkeypatch):
    model = request.getfixturevalue(name)  # SmolLM2's BPE; MiniLM's WordPiece adds [CLS], [SEP]
    texts = builtin_corpus()[:300]
    monkeypatch.setattr(tokenize_module, "TOKENIZE_CHARS", 3000)  # several groups, a partial last
    grouped = list(token_ids(model.tokenizer, texts))
    alone = [list(model.tokenizer(t, add_special_tokens=True)["input_ids"]) for t in texts]
    assert grouped == alone


def test_rows_cut_and_batch_like_one_text_at_a_time(monkeypatch):
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    texts = ["a" * 40, "bc", "d" * 9, "efgh" * 5]  # 41, 3, 10, 21 ids with BOS
    monkeypatch.setattr(tokenize_module, "TOKENIZE_CHARS", 12)  # groups of 1, 2 and 1 texts
    kw = dict(batch_size=2, seq_len=16, max_tokens=60)
    got = list(row_batches(model, Corpus(texts), order="text", **kw))
    ids = [model.tokenizer(t)["input_ids"] for t in texts]
    rows = [ids[0][:16], ids[0][16:32], ids[0][32:], ids[1], ids[2], ids[3][:6]]
    assert sum(map(len, rows)) == 60  # the budget cuts the last row
    assert got == [RowBatch(rows[0:2], (0, 0), (0, 16), 0, 0),  # text 0 from 0, then from 16
                   RowBatch(rows[2:4], (0, 1), (32, 0), 0, 1),
                   RowBatch(rows[4:6], (2, 3), (0, 0), 0, 2)]
    # by length (one window here): 16, 16, 10, 9, 6, 3 ids; the budget still cuts text 3
    assert list(row_batches(model, Corpus(texts), **kw)) == [
        RowBatch(rows[0:2], (0, 0), (0, 16), 0, 0),
        RowBatch([rows[4], rows[2]], (2, 0), (0, 32), 0, 1),
        RowBatch([rows[5], rows[3]], (3, 1), (0, 0), 0, 2)]
    with pytest.raises(InputError, match="order must be one of"):
        list(row_batches(model, Corpus(texts), order="shortest", **kw))
    with pytest.raises(EmptyTextError, match="no texts"):
        list(row_batches(model, Corpus(["", "  "]), batch_size=2, seq_len=16))
    with pytest.raises(InputError, match="longer than the model's context"):
        list(row_batches(model, Corpus(texts), batch_size=2, seq_len=64))


def test_pack_pads_like_a_loop_and_names_rows_lazily(smollm2):
    rows = [[5, 6, 7], [8], [9, 10, 11, 12, 13]]
    batch = pack(smollm2, rows, names="lazy")
    pad = smollm2.tokenizer.pad_token_id
    pad = smollm2.tokenizer.eos_token_id if pad is None else pad
    want = torch.full((3, 5), pad, dtype=torch.long)
    mask = torch.zeros((3, 5), dtype=torch.long)
    for r, ids in enumerate(rows):
        want[r, :len(ids)], mask[r, :len(ids)] = torch.tensor(ids), 1
    assert torch.equal(batch.tokens, want) and torch.equal(batch.attention_mask, mask)
    assert isinstance(batch.str_tokens, TokenStrings)
    assert batch.str_tokens == pack(smollm2, rows).str_tokens  # the eager lists
    names = TokenStrings(smollm2.tokenizer, rows)  # (the tests' type checker samples a batch's)
    assert not names._done  # nothing converted yet
    assert names[2] == smollm2.tokenizer.convert_ids_to_tokens(rows[2]) and set(names._done) == {2}
    assert names[-1] is names[2]
    assert names[0:2] == [smollm2.tokenizer.convert_ids_to_tokens(r) for r in rows[:2]]
    with pytest.raises(IndexError):
        names[3]
    with pytest.raises(InputError, match="outside the model's vocabulary"):
        pack(smollm2, [[1, smollm2.anatomy.d_vocab]])


def test_corpus_batches_are_packed_row_batches():
    model = rs.twin(norm="layernorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    texts = builtin_corpus()[:20]
    kw = dict(batch_size=3, seq_len=16, max_tokens=200)
    packed = list(corpus_batches(model, Corpus(texts), **kw))
    rows = list(row_batches(model, Corpus(texts), **kw))
    assert len(packed) == len(rows) > 1
    for batch, r in zip(packed, rows, strict=True):
        want = pack(model, r.rows)
        assert torch.equal(batch.tokens, want.tokens) and batch.str_tokens == want.str_tokens
        assert (batch.text_index, batch.text_start) == (r.text_index, r.text_start)


@pytest.mark.parametrize("max_tokens", [None, 8000])
def test_length_order_sorts_each_window_of_the_corpus_order(max_tokens, monkeypatch):
    """Reference: the corpus-order rows, cut into windows of ``SORT_BATCHES`` batches within
    each segment, each window sorted by hand (longest first, ties in corpus order)."""
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=64)
    monkeypatch.setattr(batching, "SORT_BATCHES", 3)
    corpus = Corpus(builtin_corpus()[:120], segment_chars=3000)  # several segments
    kw = dict(batch_size=4, seq_len=48, max_tokens=max_tokens)
    by_text = list(row_batches(model, corpus, order="text", **kw))
    by_length = list(row_batches(model, corpus, **kw))
    assert len({b.segment for b in by_text}) > 2

    def placed(batches):
        return [(b.segment, list(zip(b.rows, b.text_index, b.text_start, strict=True)))
                for b in batches]

    want = []
    for segment in dict.fromkeys(b.segment for b in by_text):
        rows = [r for s, part in placed(by_text) if s == segment for r in part]
        for w in range(0, len(rows), 12):
            window = rows[w:w + 12]
            order = sorted(range(len(window)), key=lambda i: (-len(window[i][0]), i))
            want += [(segment, window[i]) for i in order]
    assert [(s, r) for s, part in placed(by_length) for r in part] == want
    for b in by_length:  # batches of 4 numbered within their segment, a short one at its end
        same = [c for c in by_length if c.segment == b.segment]
        assert b.index == same.index(b) and (len(b.rows) == 4 or b is same[-1])
    lengths = [len(r) for b in by_length for r in b.rows]
    if max_tokens is not None:
        assert sum(lengths) == max_tokens
    assert lengths != sorted(lengths, reverse=True)  # sorted within windows, not overall


def _write(path, lines: list[str], zipped: bool = False) -> None:
    import gzip

    data = "".join(line + "\n" for line in lines)
    if zipped:
        with gzip.open(path, "wt", encoding="utf-8") as f:
            f.write(data)
    else:
        path.write_text(data, encoding="utf-8")


def test_json_lines_and_gzipped_files_read_as_the_texts_they_hold(tmp_path):
    """Reference: the texts written, as a list corpus (JSON Lines keeps a text's newlines)."""
    import json

    docs = ["First document.\nIts second line.", "  ", "Zweites Dokument: ünïcödé.", "x"]
    records = [json.dumps({"id": i, "body": d}) for i, d in enumerate(docs)]
    _write(tmp_path / "b.jsonl", records)
    _write(tmp_path / "c.jsonl.gz", records, zipped=True)
    _write(tmp_path / "a.txt", ["one line", "", "  two line  "])
    _write(tmp_path / "d.txt.gz", ["zipped line"], zipped=True)
    (tmp_path / "notes.md").write_text("not a corpus file\n")
    kept = [d for d in docs if d.strip()]
    assert list(Corpus(tmp_path / "b.jsonl", text_field="body").texts()) == kept
    assert list(Corpus(tmp_path / "c.jsonl.gz", text_field="body").texts()) == kept
    folder = Corpus(tmp_path, text_field="body")
    assert list(folder.texts()) == ["one line", "two line", *kept, *kept, "zipped line"]
    before = folder.fingerprint()
    (tmp_path / "notes.md").write_text("still not a corpus file\n")
    assert "text_field=body" in before and folder.fingerprint() == before  # notes.md is not in it
    assert "text_field" not in Corpus(tmp_path / "a.txt").fingerprint()
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    kw = dict(batch_size=2, seq_len=8)
    as_list = Corpus(list(folder.texts()))
    assert list(row_batches(model, folder, **kw)) == list(row_batches(model, as_list, **kw))


def test_malformed_corpus_files_are_refused_naming_file_and_line(tmp_path):
    _write(tmp_path / "bad.jsonl", ['{"text": "fine"}', "", '{"text": "cut', '{"text": "after"}'])
    with pytest.raises(InputError, match=r"bad.jsonl:3 is not JSON"):
        list(Corpus(tmp_path / "bad.jsonl").texts())
    _write(tmp_path / "field.jsonl", ['{"body": "x", "id": 1}'])
    with pytest.raises(InputError, match=r"field.jsonl:1 has no 'text' field \(it has \['body', 'id'\]\)"):
        list(Corpus(tmp_path / "field.jsonl").texts())
    _write(tmp_path / "list.jsonl", ['["text"]'])
    with pytest.raises(InputError, match="no 'text' field .it has list"):
        list(Corpus(tmp_path / "list.jsonl").texts())
    _write(tmp_path / "num.jsonl", ['{"text": 3}'])
    with pytest.raises(InputError, match="'text' is a int, not a string"):
        list(Corpus(tmp_path / "num.jsonl").texts())
    (tmp_path / "fake.txt.gz").write_text("plain text, not gzip\n")
    with pytest.raises(InputError, match="fake.txt.gz is not a complete gzip file"):
        list(Corpus(tmp_path / "fake.txt.gz").texts())
    import gzip

    words = ["alpha", "beta", "gamma", "delta"]
    damaged = bytearray(gzip.compress("".join(f"line {i} {words[i % 4]} {words[i * 7 % 3]}\n"
                                              for i in range(3000)).encode()))
    for i in range(200, 260):  # the deflate stream damaged after a valid header: zlib.error
        damaged[i] ^= 0x55
    (tmp_path / "damaged.txt.gz").write_bytes(bytes(damaged))
    with pytest.raises(InputError, match="damaged.txt.gz is not a complete gzip file"):
        list(Corpus(tmp_path / "damaged.txt.gz").texts())
    with pytest.raises(InputError, match="text_field must name a JSON field"):
        Corpus(tmp_path / "bad.jsonl", text_field="")
    with pytest.raises(InputError, match="is not 'builtin', a file or a folder"):
        list(Corpus(tmp_path / "missing.jsonl").texts())


def test_files_that_are_no_text_are_refused_by_name_and_a_byte_order_mark_is_dropped(tmp_path):
    """A bzip2/xz/zip file, gzip not named .gz, a binary file and a ``.json`` file were read as
    lines of garbage ('BZh91AY&SY…' scanned as texts); a folder of only such files was "no
    texts". A UTF-8 BOM stayed in a .txt file's first text and made a .jsonl's first record
    "not JSON". Reference: the texts written."""
    import bz2
    import gzip
    import json
    import lzma
    import zipfile

    lines = ["Hello world", "second text"]
    records = "".join(json.dumps({"text": t}) + "\n" for t in lines)
    (tmp_path / "web.jsonl.gz").write_bytes(bz2.compress(records.encode()))  # bzip2 named gzip
    (tmp_path / "web.txt").write_bytes(lzma.compress(records.encode()))  # xz named plain
    (tmp_path / "gz.txt").write_bytes(gzip.compress(records.encode()))
    with zipfile.ZipFile(tmp_path / "zip.txt", "w") as z:
        z.writestr("web.txt", records)
    (tmp_path / "utf16.txt").write_text("\n".join(lines), encoding="utf-16")
    (tmp_path / "export.json").write_text(json.dumps([{"text": t} for t in lines], indent=1))
    refused = {"web.jsonl.gz": r"is bzip2-compressed: give it a .txt.bz2 or .jsonl.bz2 name "
                               r"\(e.g. web.jsonl.bz2\)",
               "web.txt": r"is xz-compressed: give it a .txt.xz or .jsonl.xz name \(e.g. web.txt.xz\)",
               "gz.txt": "is gzip-compressed: give it a .txt.gz or .jsonl.gz name",
               "zip.txt": "is zip-compressed, which a corpus is not read through: unpack it, or compress "
                          "it with gzip, xz, bzip2, zstd",
               "utf16.txt": "is not text .a NUL byte",
               "export.json": "its first line is not a JSON object, so it is a JSON document"}
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    for name, message in refused.items():
        with pytest.raises(InputError, match=f"{name}.*{message}"):
            list(Corpus(tmp_path / name).texts())
    with pytest.raises(InputError, match="web.jsonl.gz is bzip2"):  # out of the reader thread
        rs.scan(model, tmp_path / "web.jsonl.gz", ["growth"], progress=False)
    only = tmp_path / "packed"
    only.mkdir()
    (only / "a.jsonl.zip").write_bytes((tmp_path / "zip.txt").read_bytes())
    with pytest.raises(InputError, match=r"holds no corpus file \(.txt, .jsonl or .json, plain or .gz, .xz, "
                                         r".bz2, .zst; or .parquet or .arrow; 1 other file: a.jsonl.zip\)"):
        list(Corpus(only).texts())
    (tmp_path / "bom.txt").write_text("\ufeff" + "\n".join(lines), encoding="utf-8")
    (tmp_path / "bom.jsonl").write_text("\ufeff" + records, encoding="utf-8")
    (tmp_path / "bom.jsonl.gz").write_bytes(gzip.compress(("\ufeff" + records).encode()))
    for name in ("bom.txt", "bom.jsonl", "bom.jsonl.gz"):
        assert list(Corpus(tmp_path / name).texts()) == lines, name
    (tmp_path / "bz.txt").write_text("BZh9 starts this text\n")  # bzip2's first bytes, as text
    assert list(Corpus(tmp_path / "bz.txt").texts()) == ["BZh9 starts this text"]


def test_json_lines_named_json_are_read_as_c4_ships_them_and_json_documents_are_not(tmp_path):
    """C4 ships JSON Lines as ``.json.gz``: they were refused ("name it .jsonl"). A ``.json``
    file whose first line is a record is now read; a JSON document (an array on one line,
    an indented object) is refused alone and skipped in a folder, as is a one-line
    ``dataset_info.json`` without the text field. Reference: the texts written."""
    import gzip
    import json

    lines = ["First web page.\nIts second line.", "Second page.", "Third."]
    records = "".join(json.dumps({"text": t, "url": f"u{i}"}) + "\n" for i, t in enumerate(lines))
    folder = tmp_path / "c4"
    folder.mkdir()
    (folder / "c4-train.00000.json.gz").write_bytes(gzip.compress(records[:-1].encode()))
    (folder / "c4-train.00001.json").write_text("\n" + records)  # a blank line first
    (folder / "dataset_info.json").write_text(json.dumps({"description": "c4"}))
    (folder / "state.json").write_text(json.dumps({"files": ["a"]}, indent=2))
    (folder / "list.json").write_text(json.dumps(lines))
    assert list(Corpus(folder / "c4-train.00000.json.gz").texts()) == lines
    assert list(Corpus(folder).texts()) == lines + lines
    assert list(Corpus(folder, text_field="url").texts()) == ["u0", "u1", "u2"] * 2
    for name in ("state.json", "list.json"):
        with pytest.raises(InputError, match=f"{name}: its first line is not a JSON object"):
            list(Corpus(folder / name).texts())
    with pytest.raises(InputError, match="dataset_info.json:1 has no 'text' field"):
        list(Corpus(folder / "dataset_info.json").texts())
    # a folder's .json that cannot be read is skipped, not fatal (UTF-16, gzip bytes, no access)
    (folder / "utf16.json").write_text(json.dumps({"text": "x"}), encoding="utf-16")
    (folder / "packed.json").write_bytes(gzip.compress(records.encode()))
    (folder / "digits.json").write_text("1" * 5000 + "\n")  # json.loads: ValueError, not JSON
    assert list(Corpus(folder).texts()) == lines + lines
    with pytest.raises(InputError, match="digits.json: its first line is not a JSON object"):
        list(Corpus(folder / "digits.json").texts())
    # an empty .json is an empty corpus, as an empty .jsonl is
    (tmp_path / "empty.json").write_text("\n\n")
    assert list(Corpus(tmp_path / "empty.json").texts()) == []
    # C4 with another text_field: the field is named, not "holds no .txt … file"
    c4 = tmp_path / "c4only"
    c4.mkdir()
    (c4 / "c4-train.00000.json.gz").write_bytes((folder / "c4-train.00000.json.gz").read_bytes())
    with pytest.raises(InputError, match="c4-train.00000.json.gz: its records have no 'content' field"):
        list(Corpus(c4, text_field="content").texts())


def test_cli_scan_reads_a_json_lines_field_and_refuses_a_bad_record(tmp_path, capsys):
    import json

    from residual_stream.cli import main

    texts = ["A first text.\nWith two lines.", "A second one."]
    _write(tmp_path / "c.jsonl", [json.dumps({"body": t}) for t in texts])
    out = tmp_path / "scan.json"
    args = ["scan", "twin-pre-rms", str(tmp_path / "c.jsonl"), "--quiet", "--out", str(out)]
    assert main([*args, "--text-field", "body"]) == 0
    model = rs.load("twin-pre-rms")
    assert json.loads(out.read_text())["tokens"] == sum(len(model.tokenizer(t)["input_ids"]) for t in texts)
    out.unlink()
    assert main(args) == 1  # the default field, "text", is not there
    assert "c.jsonl:1 has no 'text' field (it has ['body'])" in capsys.readouterr().err
    assert not out.exists()


@pytest.mark.parametrize("source", [(t for t in ["a text"]), iter(["a text"]), {"a text"},
                                    {"a text": 1}])
def test_a_corpus_read_once_or_unordered_is_refused(source, tmp_path):
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    with pytest.raises(InputError, match="a corpus is read more than once, in one order"):
        rs.scan(model, source, state=tmp_path / "s.pt", progress=False)
    assert not list(tmp_path.iterdir())


def test_a_corpus_item_that_is_not_a_text_is_named(tmp_path):
    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    with pytest.raises(InputError, match="corpus item 1 is a bytes, not a text"):
        rs.scan(model, Column(["a text", b"bytes"]), state=tmp_path / "s.pt", progress=False)
    assert not list(tmp_path.iterdir())
    assert list(Corpus(("one", " ", "two")).texts()) == ["one", "two"]  # a tuple reads as a list
    assert list(Corpus(Column(["one", "two"])).texts()) == ["one", "two"]
    bad = "a text \udc80 from bytes decoded with surrogateescape"  # not UTF-8 on disk
    for m in (model, rs.load("minilm-l6", progress=False)):  # bytes, and a fast tokenizer's TypeError
        with pytest.raises(InputError, match="corpus item 2 is not valid Unicode at character 7"):
            rs.scan(m, ["a text", "another", bad], state=tmp_path / "s.pt", progress=False)
        assert not list(tmp_path.iterdir())


def test_segments_are_cut_by_characters_and_batches_stay_inside_them():
    model = counting_twin()
    texts = ["abcdef", "ghij", "k", "lmnopqrstu", "vw"]  # segments of ≥ 10 characters
    corpus = Corpus(texts, segment_chars=10)
    assert list(corpus.segments()) == [Segment(0, texts[0:2]), Segment(2, texts[2:4]),
                                      Segment(4, texts[4:])]
    got = list(row_batches(model, corpus, batch_size=3, seq_len=4, order="text"))
    assert [b.key for b in got] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]
    assert [b.text_index for b in got] == [(0, 0, 1), (1,), (2, 3, 3), (3,), (4,)]
    assert [b.text_start for b in got] == [(0, 4, 0), (4,), (0, 0, 4), (8,), (0,)]  # BOS + bytes
    assert [r for b in got for r in b.rows] == [  # the same rows as one long segment
        r for b in row_batches(model, Corpus(texts), batch_size=3, seq_len=4, order="text")
        for r in b.rows]
    for bad in (0, True):  # True was taken as segments of one character
        with pytest.raises(InputError, match="segment_chars must be a positive"):
            Corpus(texts, segment_chars=bad)


TEXTS_12 = [f"text number {i} " * (1 + i % 3) for i in range(12)]
LONG = [*TEXTS_12[:3], " ".join(TEXTS_12 * 2), *TEXTS_12[3:5]]  # one text of 705 characters


@pytest.mark.parametrize("max_tokens", [None, 150])  # 150: the budget ends in segment 3
@pytest.mark.parametrize("texts", [TEXTS_12, LONG], ids=["texts", "a-long-text-in-parts"])
def test_each_share_tokenizes_its_own_segments_and_the_shares_make_the_whole(texts, max_tokens):
    model = counting_twin()
    corpus = Corpus(texts, segment_chars=40)
    kw = dict(batch_size=2, seq_len=8, max_tokens=max_tokens)
    whole = list(row_batches(model, corpus, **kw))
    segments = list(corpus.segments(cut=lambda: True))  # the twins' bytes can be cut anywhere
    assert len(segments) > 3
    if texts is LONG:  # the long text's parts are segments 2, 3, … (the texts before it: 0 and 1)
        spans = [s.span for s in segments if s.span is not None]
        assert len(spans) > 10 and [s.first for s in segments[2:2 + len(spans)]] == [3] * len(spans)
        assert "".join(LONG[3][a:b] for a, b in spans) == LONG[3]
    everything = [t for s in segments for t in segment_inputs(s)]
    shares = []
    for rank in range(2):
        model.tokenizer.seen = []
        shares += list(row_batches(model, corpus, share=Share(rank, 2), **kw))
        mine = [t for s, seg in enumerate(segments) if s % 2 == rank for t in segment_inputs(seg)]
        if max_tokens is None:  # the others' segments are never tokenized
            assert model.tokenizer.seen == mine
        else:  # the budget needs every segment before it counted: up to where it ends
            assert model.tokenizer.seen == everything[:len(model.tokenizer.seen)] != mine
    assert {b.segment % 2 for b in shares} == {0, 1}  # both shares have batches
    assert sorted(shares, key=lambda b: b.key) == whole
    if max_tokens is not None:
        assert sum(len(r) for b in whole for r in b.rows) == max_tokens
        assert whole[-1].segment == 3 < len(segments) - 1


def test_prefetched_keeps_order_raises_in_place_and_stops_when_left():
    assert list(prefetched(iter(range(50)), depth=3)) == list(range(50))

    def failing():
        yield from (0, 1)
        raise ValueError("corrupt line")

    got = []
    with pytest.raises(ValueError, match="corrupt line"):
        for item in prefetched(failing()):
            got.append(item)
    assert got == [0, 1]

    made = []

    def endless():
        while True:
            made.append(len(made))
            yield made[-1]

    before = threading.active_count()
    for item in prefetched(endless(), depth=2):
        if item == 5:
            break  # closes the generator: its ``finally`` stops the reader and joins it
    assert threading.active_count() == before
    assert len(made) <= 6 + 2 + 1  # read ahead by at most the queue and the item in hand


def test_prefetched_sets_the_callers_stop_so_a_waiting_reader_leaves():
    """``items`` blocked on a wait of its own (the counts exchange) sees the ``stop`` it was
    given set as soon as the caller leaves the loop, so the reader leaves at once."""
    import time

    stop, seen = threading.Event(), []

    def waiting():
        yield 0
        seen.append(stop.wait(timeout=5))  # as ``ledger.dist_exchange`` polls its stop
        yield 1

    start = time.perf_counter()
    for _ in prefetched(waiting(), stop=stop):
        break
    assert seen == [True] and stop.is_set()
    assert time.perf_counter() - start < 2.5  # not the wait's 5 s timeout


def test_the_fingerprint_follows_the_files_not_their_path_or_time(tmp_path):
    """A copy elsewhere (new path, new modification times) is the same corpus; a changed
    byte at either end, a changed size, a renamed file or another field is not."""
    import os
    import shutil

    lines = [f"line {i} of the corpus, some words" for i in range(400)]  # ~14 KB: both ends read
    (tmp_path / "a").mkdir()
    _write(tmp_path / "a" / "part1.txt", lines)
    _write(tmp_path / "a" / "part2.jsonl", ['{"text": "one record"}'])
    first = Corpus(tmp_path / "a").fingerprint()
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)  # new mtimes
    os.utime(tmp_path / "b" / "part1.txt", (1, 1))
    assert Corpus(tmp_path / "b").fingerprint() == first
    one_file = Corpus(tmp_path / "a" / "part1.txt").fingerprint()
    assert Corpus(tmp_path / "b" / "part1.txt").fingerprint() == one_file
    assert Corpus(tmp_path / "b", text_field="body").fingerprint() != first
    data = (tmp_path / "b" / "part1.txt").read_bytes()
    for changed in (b"L" + data[1:], data[:-2] + b"X\n", data + b"more\n"):
        (tmp_path / "b" / "part1.txt").write_bytes(changed)
        assert Corpus(tmp_path / "b").fingerprint() != first
    (tmp_path / "b" / "part1.txt").write_bytes(data)
    assert Corpus(tmp_path / "b").fingerprint() == first
    (tmp_path / "b" / "part1.txt").rename(tmp_path / "b" / "part0.txt")
    assert Corpus(tmp_path / "b").fingerprint() != first


def test_a_scan_resumes_from_a_copy_of_its_corpus_elsewhere(tmp_path):
    import shutil

    model = rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)
    (tmp_path / "a").mkdir()
    _write(tmp_path / "a" / "texts.txt", builtin_corpus()[:40])
    kw = dict(batch_size=2, seq_len=16, progress=False)
    whole = rs.scan(model, tmp_path / "a", "growth", **kw)
    state = tmp_path / "scan.pt"

    def stop(key, tokens):
        if key == (0, 3):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        rs.scan(model, tmp_path / "a", "growth", state=state, save_every=1, on_batch=stop, **kw)
    shutil.copytree(tmp_path / "a", tmp_path / "b", copy_function=shutil.copyfile)
    shutil.rmtree(tmp_path / "a")
    seen = []
    resumed = rs.scan(model, tmp_path / "b", "growth", state=state,
                      on_batch=lambda key, t: seen.append(key), **kw)
    assert seen[0] == (0, 4) and resumed.tokens == whole.tokens
    assert torch.allclose(resumed.stats["growth"].mean, whole.stats["growth"].mean, rtol=1e-12, atol=0)


def test_the_builtin_corpus_is_fingerprinted_by_its_texts(monkeypatch):
    """A release that changes the built-in corpus must not resume a state saved over the old one."""
    from residual_stream.streaming import corpus as corpus_module

    before = Corpus("builtin").fingerprint()
    assert before.startswith("builtin sha256:") and Corpus("builtin").fingerprint() == before
    assert before.split()[1] == Corpus(corpus_module.builtin_corpus()).fingerprint().split()[-1]
    monkeypatch.setattr(corpus_module, "builtin_corpus", lambda: ["another built-in corpus"])
    assert Corpus("builtin").fingerprint() != before
