"""What ``rs.scan`` does with odd inputs: a budget past the corpus's end, several processes'
progress bars, files given as a state that are no scan state, odd statistics, corpus files
that are not UTF-8, a named pipe as the corpus, a ``text_field`` that cannot apply.

Each refusal is the project's ``InputError`` with what to do, and leaves the files it was
given as they were. Reference: the corpus's own token counts and the bytes written.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import threading
import zipfile

import pytest
import torch

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming import Corpus
from residual_stream.streaming.corpus import builtin_corpus
from residual_stream.streaming.progress import ReadProgress, ScanBar, count, share_of
from residual_stream.streaming.specs import make_accumulators


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def _bars(err: str) -> list[str]:
    """Every state the progress bars were drawn in, in order."""
    return [s.strip() for line in err.splitlines() for s in line.split("\r") if "scan " in s]


def _tokens(model, texts: list[str]) -> int:
    return sum(len(model.tokenizer(t)["input_ids"]) for t in texts)


# 1. The bar's total: the budget or the corpus, whichever is smaller, 100 % at the end

def test_a_budget_past_the_corpus_ends_the_bar_at_the_tokens_scanned(model, tmp_path, capsys):
    """A 2-line file with max_tokens=1e6 showed "0%| 6.00/1.00M" at its end."""
    lines = ["hello world", "second line here"]
    (tmp_path / "c.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = rs.scan(model, tmp_path / "c.txt", "growth", max_tokens=1_000_000, batch_size=1)
    assert result.tokens == _tokens(model, lines) < 1000
    bars = _bars(capsys.readouterr().err)
    assert "100%" in bars[-1] and f"| {result.tokens}/{result.tokens} [" in bars[-1], bars[-1]
    assert not any("1.00M" in b for b in bars[1:]), bars  # the estimate replaces the budget
    for bar in bars:  # counts are integers below 1000, "1.00M" above, never "6.00" or "29.0"
        for shown in re.search(r"(\S+)/(\S+) \[", bar).groups():
            assert re.fullmatch(r"\d+|\d+(\.\d+)?[kMGT]", shown), bar


def test_the_bar_counts_small_budgets_in_integers_and_large_ones_scaled(model, capsys):
    rs.scan(model, ["a b c d e f g h"] * 4, "growth", max_tokens=10, batch_size=2)
    bars = _bars(capsys.readouterr().err)
    assert bars[0].startswith(f"scan {model.name}: ") and "| 0/10 [" in bars[0], bars[0]
    assert "100%" in bars[-1] and "| 10/10 [" in bars[-1], bars[-1]
    assert [count(n) for n in (None, 0, 6, 999, 1000, 27_300, 1_000_000)] == \
        ["?", "0", "6", "999", "1.00k", "27.3k", "1.00M"]


def test_a_budget_inside_the_corpus_is_the_total(model, capsys):
    texts = builtin_corpus()[:60]
    rs.scan(model, texts, "growth", max_tokens=700, batch_size=4, seq_len=16)
    bars = _bars(capsys.readouterr().err)
    assert "| 0/700 [" in bars[0] and "100%" in bars[-1] and "| 700/700 [" in bars[-1], bars


def test_the_estimate_is_capped_by_the_budget():
    p = ReadProgress({"items": 1000})
    p.read("items", 2000, 1000)
    p.file_ended("items", 1000)
    p.tokenized(2000, 500)
    assert p.estimate() == 500
    assert p.estimate(max_tokens=10**6) == 500 and p.estimate(max_tokens=120) == 120


# 2. Several processes: each bar sized to its own segments' tokens

def test_each_process_is_estimated_at_the_segments_it_owns():
    """Rank r takes segments s ≡ r (mod N): a corpus of one segment is all rank 0's. Before,
    each rank's total was ceil(max_tokens / N) and rank 0 overran it while rank 1 sat at 0."""
    assert share_of(900, 1000, 0, 2) == 900 and share_of(900, 1000, 1, 2) == 0
    assert [share_of(4500, 1000, r, 2) for r in (0, 1)] == [2500, 2000]  # segments 0, 2, 4 / 1, 3
    for chars in (0, 1, 999, 1000, 5999, 6000, 12_345):
        assert sum(share_of(chars, 1000, r, 3) for r in range(3)) == chars
    p = ReadProgress({"items": 100})  # 10,000 characters at 0.25 tokens a character
    p.read("items", 10_000, 100)
    p.file_ended("items", 100)
    p.tokenized(4000, 1000)
    assert p.estimate(2, 0, None, 1 << 22) == 2500 and p.estimate(2, 1, None, 1 << 22) == 0
    assert p.estimate(2, 0, 2000, 1 << 22) == 2000  # the whole budget, in rank 0's one segment
    assert [p.estimate(2, r, None, 3000) for r in (0, 1)] == [1500, 1000]  # 3000+1000 / 3000 chars
    assert [p.estimate(2, r, 2000, 3000) for r in (0, 1)] == [1250, 750]  # 8000 chars: 3000+2000 / 3000
    assert p.estimate(world_size=2) == 1250  # no segment size: an even share


def test_a_process_shows_no_total_until_its_part_is_known(model):
    """With a budget, a process's part depends on the segments before its own."""
    texts = ["one two three"] * 3
    bar = ScanBar("m", Corpus(texts).progress, 2000, 0, True, 0, 2, 1 << 22)
    assert bar.bar.total is None and bar.bar.desc == "scan m [rank 0 of 2]" and not bar.bar.disable
    bar.update(0, 0)
    assert bar.bar.total is None  # it tokenized nothing: no estimate
    bar.close()
    assert bar.bar.total == 0
    other = ScanBar("m", Corpus(texts).progress, 2000, 0, True, 1, 2, 1 << 22)
    assert other.bar.disable and other.reading is None  # one bar on the terminal the processes share
    alone = ScanBar("m", Corpus(texts).progress, 2000, 0, False, 0, 1, 1 << 22)
    assert alone.bar.total == 2000


# 3. Files given as a state that are no scan state, and damaged states

@pytest.fixture(scope="module")
def saved_state(model, tmp_path_factory) -> dict:
    path = tmp_path_factory.mktemp("state") / "scan.pt"
    rs.scan(model, ["alpha beta gamma", "delta epsilon"], "growth", state=path, progress=False)
    return torch.load(path, weights_only=True)


def _refused(model, path, match: str) -> str:
    """The message of the scan refusing ``path`` as its state; the file is left as it was."""
    before = path.read_bytes()
    with pytest.raises(InputError, match=match) as caught:
        rs.scan(model, ["alpha beta gamma", "delta epsilon"], "growth", state=path, progress=False)
    assert path.read_bytes() == before
    return str(caught.value)


def test_a_checkpoint_or_a_zip_file_is_not_a_scan_state_and_is_not_to_be_deleted(model, tmp_path):
    """A checkpoint was "saved by another version of residual-stream ... delete it", an ordinary
    zip file "damaged ... delete it"."""
    files = {"weights.pt": lambda p: torch.save(model.module.state_dict(), p),
             "module.pt": lambda p: torch.save(torch.nn.Linear(2, 2), p),
             "tensor.pt": lambda p: torch.save(torch.zeros(3), p),
             "config-list.pt": lambda p: torch.save({"config": [1, 2]}, p),
             "no-version.pt": lambda p: torch.save({"config": {"model": "x"}, "next": [0, 0]}, p),
             "archive.zip": lambda p: zipfile.ZipFile(p, "w").writestr("a.txt", "hello")}
    for name, write in files.items():
        write(tmp_path / name)
        message = _refused(model, tmp_path / name, f"{name} is not a scan state")
        assert "delete" not in message and "new file name" in message, message


def test_a_state_missing_a_field_is_refused_as_damaged(model, saved_state, tmp_path):
    """A state without ``next``, ``tokens``, ``batches``, ``stats`` or ``ledger`` raised a raw
    KeyError; sums that do not load, whatever they raised."""
    path = tmp_path / "scan.pt"
    for field in ("next", "tokens", "batches", "stats", "ledger"):
        torch.save({k: v for k, v in saved_state.items() if k != field}, path)
        _refused(model, path, f"scan.pt is damaged: its '{field}' is missing")
    for field, value in (("next", [0]), ("tokens", "many"), ("ledger", [1.5])):
        torch.save(saved_state | {field: value}, path)
        _refused(model, path, "scan.pt is damaged")
    torch.save(saved_state | {"stats": {"growth": {"nothing": 1}}}, path)
    _refused(model, path, "scan.pt is damaged")
    torch.save(saved_state | {"stats": {}}, path)
    _refused(model, path, "scan.pt is damaged")


def test_a_state_of_another_version_is_still_named_so(model, saved_state, tmp_path):
    path = tmp_path / "scan.pt"
    torch.save(saved_state | {"config": saved_state["config"] | {"version": 1}}, path)
    _refused(model, path, "saved by another version of residual-stream .state version 1")
    torch.save(saved_state, path)  # and the state itself still resumes
    rs.scan(model, ["alpha beta gamma", "delta epsilon"], "growth", state=path, progress=False)


# 4. Odd statistics

@pytest.mark.parametrize("stats, match", [
    (["lens:every=1000000000000000000000000000000"],
     r"lens: every .* a whole number, at least 1 and at most 4294967296 .2\^32., not a number of "
     r"31 digits"),
    (["lens:every=4294967297"], r"at most 4294967296 .2\^32., not 4294967297"),
    ([None], r"stats item 0 is None \(of type NoneType\): each item is a statistic's name or spec "
             r"\(choose from \['composition', 'growth'"),
    (["growth", 3.5], r"stats item 1 is 3.5 \(of type float\)"),
    (5, r"stats is a statistic's name or spec .*, an accumulator, or a list of them, not 5 \(of type int\)"),
])
def test_odd_statistics_are_refused_naming_the_item(stats, match):
    """They raised OverflowError, AttributeError and TypeError. ``make_accumulators`` is what
    ``rs.scan`` and the CLI call first; the test run's type checks stop a call of ``rs.scan``
    with a ``None`` statistic before its body."""
    with pytest.raises(InputError, match=match):
        make_accumulators(stats)


def test_a_sample_rate_of_two_to_the_32_still_runs(model):
    result = rs.scan(model, ["alpha beta gamma"], ["lens:every=4294967296"], progress=False)
    assert result.tokens > 0


# 5. Corpus files that are not UTF-8

def test_a_file_that_is_not_utf8_is_refused_naming_the_byte_before_any_batch(model, tmp_path):
    """``b'caf\\xe9'`` was read as "caf\\ufffd" and scanned."""
    path = tmp_path / "latin1.txt"
    path.write_bytes(b"caf\xe9\n")
    batches = []
    with pytest.raises(InputError, match=r"latin1.txt is not UTF-8 text: byte 3 \(line 1\) is 0xe9.*"
                                         r"iconv -f latin1 -t utf-8 latin1.txt"):
        rs.scan(model, path, "growth", progress=False, on_batch=lambda key, n: batches.append(key))
    assert batches == [] and path.read_bytes() == b"caf\xe9\n"
    with pytest.raises(InputError, match="byte 3 .line 1"):
        list(Corpus(path).texts())


def test_a_bad_byte_far_into_a_file_is_found_where_it_is(tmp_path):
    """Past the reader's blocks (1 MiB), in a gzipped file, with a multi-byte character cut
    between two of its blocks before it; and in a JSON Lines file's first line."""
    head = ("a" + "é" * (1 << 19) + "\n").encode()  # a 2-byte "é" across the 1 MiB block end
    good = b"fine text\n" * 10
    (tmp_path / "far.txt").write_bytes(head + good + b"bad \xff here\n")
    (tmp_path / "far.txt.gz").write_bytes(gzip.compress(head + good + b"bad \xff here\n"))
    at = len(head + good) + 4
    with pytest.raises(InputError, match=rf"far.txt is not UTF-8 text: byte {at} \(line 12\) is 0xff"):
        list(Corpus(tmp_path / "far.txt").texts())
    with pytest.raises(InputError, match=rf"far.txt.gz is not UTF-8 text: byte {at} of its unpacked "
                                         r"text \(line 12\) is 0xff.*gunzip -c far.txt.gz \| iconv"):
        list(Corpus(tmp_path / "far.txt.gz").texts())
    (tmp_path / "cut.txt").write_bytes(b"fine\nends in \xc3")  # a character cut short at the end
    with pytest.raises(InputError, match=r"byte 13 \(line 2\) is 0xc3"):
        list(Corpus(tmp_path / "cut.txt").texts())
    (tmp_path / "r.jsonl").write_bytes(b'{"text": "caf\xe9"}\n')
    with pytest.raises(InputError, match=r"r.jsonl is not UTF-8 text: byte 13 \(line 1\)"):
        list(Corpus(tmp_path / "r.jsonl").texts())
    (tmp_path / "ok.txt").write_bytes(head + good)
    assert len(list(Corpus(tmp_path / "ok.txt").texts())) == 11


# 6. A named pipe as the corpus

def test_a_named_pipe_as_the_corpus_is_refused_instead_of_blocking(model, tmp_path, capsys):
    fifo = tmp_path / "fifo.txt"
    os.mkfifo(fifo)
    outcome: list = []

    def run() -> None:
        try:
            rs.scan(model, fifo, "growth", progress=False)
        except Exception as e:  # noqa: BLE001 - the test looks at what it was
            outcome.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(timeout=20)
    if thread.is_alive():  # blocked opening the pipe: give it a writer that closes at once
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=20)
        pytest.fail("the scan blocked on the named pipe")
    assert isinstance(outcome[0], InputError), outcome
    assert "is a named pipe (FIFO), not a regular file or a folder" in str(outcome[0])
    with pytest.raises(InputError, match="named pipe"):
        list(Corpus(fifo).texts())
    (tmp_path / "a.txt").write_text("one text\n", encoding="utf-8")  # in a folder: skipped
    assert list(Corpus(tmp_path).texts()) == ["one text"]
    from residual_stream.cli import main  # the report's --text and --corpus, by the same kind

    for option, what in (("--text", "not a file"), ("--corpus", "not a folder")):
        assert main(["report", "--model", "twin-pre-ln", option, str(fifo), "--out",
                     str(tmp_path / "r.html")]) == 1
        assert f"{option} {fifo}: it is a named pipe (FIFO), {what}" in capsys.readouterr().err


# 7. A text field where no text comes from a field

def test_a_text_field_for_a_corpus_without_fields_is_refused(tmp_path):
    (tmp_path / "c.txt").write_text("one\ntwo\n", encoding="utf-8")
    with pytest.raises(InputError, match=r"text_field='foo' .--text-field. names the JSON Lines field"
                                         r".*'.*c.txt' holds plain text \(.txt: one text per line"):
        Corpus(tmp_path / "c.txt", text_field="foo")
    with pytest.raises(InputError, match="the corpus is a list of texts, which has no fields"):
        Corpus(["one", "two"], text_field="foo")
    with pytest.raises(InputError, match="the corpus is the built-in corpus"):
        Corpus("builtin", text_field="foo")
    with pytest.raises(InputError, match=r"holds plain text \(.txt: one text per line"):
        Corpus(tmp_path, text_field="foo")
    (tmp_path / "r.jsonl").write_text(json.dumps({"foo": "three"}) + "\n", encoding="utf-8")
    assert list(Corpus(tmp_path / "r.jsonl", text_field="foo").texts()) == ["three"]
    mixed = Corpus(tmp_path, text_field="foo")  # a folder of both: the field is the .jsonl's
    assert list(mixed.texts()) == ["one", "two", "three"]
    assert list(Corpus(tmp_path / "c.txt").texts()) == ["one", "two"]  # the default: no field named
