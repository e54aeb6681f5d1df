"""Corpus bytes that are not UTF-8, read as U+FFFD on request (``encoding_errors="replace"``).

A web crawl of 10^8 tokens with one Latin-1 byte stopped a scan at that byte (strict reading,
session 37). With ``encoding_errors="replace"`` the scan goes on. Reference: Python's own
``bytes.decode("utf-8", "replace")`` of the same bytes, and ``rs.scan`` of the texts it gives.
The strict default and its error are tested in ``test_scan_inputs.py``.
"""

from __future__ import annotations

import gzip
import json
import warnings

import pytest
from conftest import assert_scan_of_texts

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming import Corpus
from residual_stream.streaming.progress import ReadProgress
from residual_stream.streaming.utf8 import ReplacedBytesWarning

LINES = [b"caf\xe9 au lait", b"a clean line", b"two runs \xff\xfe and \xc3(", b"cut \xe2\x82"]


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def _reference(data: bytes) -> list[str]:
    """The texts of a .txt file's bytes as Python's "replace" reads them: non-blank lines, stripped."""
    return [line.strip() for line in data.decode("utf-8", "replace").split("\n") if line.strip()]


def _read(corpus: Corpus) -> tuple[list[str], list[str]]:
    """The corpus's texts, and the messages of the ReplacedBytesWarnings its reading gave.

    Checked to be what the reading's counters recorded (``ReadProgress.replaced``, which a scan
    returns as ``ScanResult.replaced``).
    """
    reading = ReadProgress({})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        texts = list(corpus.texts(reading))
    warned = [str(w.message) for w in caught if w.category is ReplacedBytesWarning]
    assert reading.replaced == warned
    return texts, warned


def test_bad_bytes_read_as_python_replaces_them_with_one_warning_per_file(tmp_path):
    data = b"\n".join(LINES) + b"\n"
    (tmp_path / "a.txt").write_bytes(data)
    (tmp_path / "b.txt.gz").write_bytes(gzip.compress(data))
    (tmp_path / "c.jsonl").write_bytes(b"".join(b'{"text": "' + line + b'"}\n' for line in LINES))
    (tmp_path / "d.txt").write_bytes("clean é text\n".encode())  # read between two bad files
    (tmp_path / "e.json").write_bytes(b'{"text": "C4 \xe9"}\n')  # C4's name: was skipped as unreadable
    texts, warned = _read(Corpus(tmp_path, encoding_errors="replace"))
    want = _reference(data) * 3 + ["clean é text", _reference(b"C4 \xe9")[0]]
    assert texts == want
    assert texts[0] == "caf\ufffd au lait" and texts[2] == "two runs \ufffd\ufffd and \ufffd(" \
        and texts[3] == "cut \ufffd"  # by hand: one per byte run UTF-8 cannot read
    assert warned == [  # the first bad byte of each file, by offset and line; none for d.txt
        f"{tmp_path / 'a.txt'} is not UTF-8 text: byte 3 (line 1) is 0xe9; it and any others in this "
        "file are read as U+FFFD (encoding_errors='replace')",
        f"{tmp_path / 'b.txt.gz'} is not UTF-8 text: byte 3 of its unpacked text (line 1) is 0xe9; it "
        "and any others in this file are read as U+FFFD (encoding_errors='replace')",
        f"{tmp_path / 'c.jsonl'} is not UTF-8 text: byte 13 (line 1) is 0xe9; it and any others in "
        "this file are read as U+FFFD (encoding_errors='replace')",
        f"{tmp_path / 'e.json'} is not UTF-8 text: byte 13 (line 1) is 0xe9; it and any others in "
        "this file are read as U+FFFD (encoding_errors='replace')"]
    with pytest.raises(InputError, match=r"a.txt is not UTF-8 text: byte 3 \(line 1\).*"
                                         r"as U\+FFFD with encoding_errors='replace'$"):
        list(Corpus(tmp_path).texts())  # strict, the default: the first bad byte stops it
    clean, warned = _read(Corpus(tmp_path / "d.txt", encoding_errors="replace"))
    assert clean == ["clean é text"] and warned == []


def test_a_bad_byte_deep_in_a_file_is_found_and_the_rest_read(tmp_path):
    """Past the reader's 1 MiB blocks: the warning names where it is, the texts after it are read."""
    head = ("a" + "é" * (1 << 19) + "\n").encode()
    data = head + b"fine\n" * 10 + b"bad \xff here\n" + b"after\n"
    (tmp_path / "far.txt").write_bytes(data)
    texts, warned = _read(Corpus(tmp_path / "far.txt", encoding_errors="replace"))
    assert texts == _reference(data) and texts[-2:] == ["bad \ufffd here", "after"]
    assert [f"byte {len(head) + 50 + 4} (line 12) is 0xff" in w for w in warned] == [True]


def test_a_scan_with_replace_equals_the_scan_of_the_replaced_texts(model, tmp_path):
    data = b"\n".join(LINES * 3) + b"\n"
    (tmp_path / "web.txt").write_bytes(data)
    with pytest.warns(ReplacedBytesWarning, match="web.txt is not UTF-8 text: byte 3"):
        assert_scan_of_texts(model, Corpus(tmp_path / "web.txt", encoding_errors="replace"),
                             _reference(data), ["growth", "survival"], batch_size=2, seq_len=16)


def test_a_scan_says_which_files_held_bad_bytes_and_keeps_it_saved_and_merged(model, tmp_path):
    """``ScanResult.replaced``: the warnings the reading gave, one per file in reading order, also
    where no warning is shown (the app, a notebook's reader thread); kept by ``.pt`` and JSON, joined
    by ``merge_scans``, empty for a clean corpus."""
    web = tmp_path / "web"
    web.mkdir()
    (web / "a.txt").write_bytes(b"one caf\xe9 line\nanother line\n")
    (web / "b.txt").write_bytes("clean é text\n".encode())
    (web / "c.jsonl").write_bytes(b'{"text": "na\xefve"}\n{"text": "fine"}\n')
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("ignore")  # shown nowhere: the result still says
        warnings.simplefilter("always", ReplacedBytesWarning)
        scanned = rs.scan(model, Corpus(web, encoding_errors="replace"), ["growth", "survival"],
                          batch_size=2, seq_len=16, progress=False)
    # each file's warning, once (the scan's first batch is read twice: calibration, then the scan)
    warned = list(dict.fromkeys(str(w.message) for w in caught if w.category is ReplacedBytesWarning))
    assert len(warned) == 2 and "a.txt is not UTF-8 text: byte 7 (line 1) is 0xe9" in warned[0] \
        and "c.jsonl is not UTF-8 text: byte 12 (line 1) is 0xef" in warned[1]
    assert scanned.replaced == tuple(warned)
    assert scanned.to_dict()["replaced"] == warned
    loaded = rs.load_scan(scanned.save(tmp_path / "web.pt"))
    assert loaded.replaced == scanned.replaced
    with pytest.warns(ReplacedBytesWarning, match="corpus item 1"):
        listed = rs.scan(model, Corpus(["a clean text", "a \udcff text"], encoding_errors="replace"),
                         ["growth", "survival"], batch_size=2, seq_len=16, progress=False)
    clean = rs.scan(model, ["a clean text"], ["growth", "survival"], batch_size=2, seq_len=16,
                    progress=False)
    assert clean.replaced == () and clean.to_dict()["replaced"] == []
    merged = rs.merge_scans([tmp_path / "web.pt", listed, clean])
    assert merged.replaced == (*warned, *listed.replaced) and len(listed.replaced) == 1


def test_a_state_saved_reading_strictly_is_not_resumed_replacing(model, tmp_path):
    """The texts may differ, so the corpus's fingerprint says which reading a state was saved for."""
    (tmp_path / "c.txt").write_text("one text\nanother text\n", encoding="utf-8")
    state = tmp_path / "s.pt"
    rs.scan(model, tmp_path / "c.txt", "growth", state=state, progress=False)
    saved = state.read_bytes()
    with pytest.raises(InputError, match="saved for other arguments.*'corpus'.*read as U\\+FFFD"):
        rs.scan(model, Corpus(tmp_path / "c.txt", encoding_errors="replace"), "growth", state=state,
                progress=False)
    assert state.read_bytes() == saved
    assert rs.scan(model, Corpus(tmp_path / "c.txt"), "growth", state=state, progress=False).tokens > 0


def test_lone_surrogates_in_a_list_are_replaced_on_request(model):
    texts = ["a text \udc80\udcff from bytes decoded with surrogateescape", "a clean one"]
    with pytest.raises(InputError, match="corpus item 0 is not valid Unicode at character 7.*"
                                         "encoding_errors='replace'"):
        list(Corpus(texts).texts())
    got, warned = _read(Corpus([*texts, "\udc81 a second such item, not warned of"],
                               encoding_errors="replace"))
    assert got[:2] == ["a text \ufffd\ufffd from bytes decoded with surrogateescape", "a clean one"]
    assert got[2] == "\ufffd a second such item, not warned of"
    assert warned == ["corpus item 0 is not valid Unicode at character 7 (bytes that are not UTF-8, "
                      "decoded with surrogateescape?); it and any others are read as U+FFFD "
                      "(encoding_errors='replace')"]
    got = got[:2]
    assert Corpus(texts, encoding_errors="replace").fingerprint() != Corpus(texts).fingerprint()
    with pytest.warns(ReplacedBytesWarning, match="corpus item 0"):
        scanned = rs.scan(model, Corpus(texts, encoding_errors="replace"), "growth", progress=False)
    assert scanned.tokens == rs.scan(model, got, "growth", progress=False).tokens


@pytest.mark.parametrize("value", ["ignore", "Replace", "utf-8"])
def test_other_encoding_errors_are_refused(value):
    with pytest.raises(InputError, match=r"encoding_errors must be one of \['strict', 'replace'\]"):
        Corpus("builtin", encoding_errors=value)


def test_cli_scan_and_report_read_bad_bytes_on_request_with_one_warning_line(tmp_path, capsys):
    from residual_stream.cli import main

    (tmp_path / "c.txt").write_bytes(b"caf\xe9 au lait\nanother text\n")
    out = tmp_path / "scan.json"
    args = ["scan", "twin-pre-rms", str(tmp_path / "c.txt"), "--quiet", "--out", str(out)]
    assert main(args) == 1 and not out.exists()
    err = capsys.readouterr().err
    assert "c.txt is not UTF-8 text: byte 3 (line 1) is 0xe9" in err and \
        err.rstrip().endswith("as U+FFFD with --encoding-errors replace")  # as this command takes it
    assert main([*args, "--encoding-errors", "replace"]) == 0
    err = capsys.readouterr().err
    assert f"residual-stream: warning: {tmp_path / 'c.txt'} is not UTF-8 text: byte 3 (line 1) " in err
    assert "ReplacedBytesWarning" not in err and "warnings.warn" not in err  # one line, not Python's two
    assert "read as U+FFFD (--encoding-errors replace)" in err and "encoding_errors=" not in err
    tok = rs.load("twin-pre-rms").tokenizer
    assert json.loads(out.read_text())["tokens"] == sum(
        len(tok(t)["input_ids"]) for t in ["caf\ufffd au lait", "another text"])
    html = tmp_path / "r.html"
    report = ["report", "--model", "twin-pre-rms", "--text", str(tmp_path / "c.txt"), "--max-tokens", "16",
              "--quiet", "--out", str(html)]
    assert main(report) == 1 and not html.exists()
    assert main([*report, "--encoding-errors", "replace"]) == 0 and html.exists()
    with pytest.raises(SystemExit) as e:
        main([*args, "--encoding-errors", "ignore"])
    assert e.value.code == 2
