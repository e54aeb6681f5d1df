"""Parquet and Arrow corpus files: a string column's rows as texts (``streaming.columnar``).

Parquet as FineWeb ships it; Arrow IPC streams as ``datasets``' ``save_to_disk`` writes them
(a folder of ``data-0000N-of-0000M.arrow`` beside ``dataset_info.json`` and ``state.json``).
Reference: the texts written with ``pyarrow``, and ``rs.scan`` of the same texts as a list.
"""

from __future__ import annotations

import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import assert_scan_of_texts

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming import Corpus
from residual_stream.streaming.sources import file_texts

ROWS = [None if i % 50 == 7 else "  " if i % 50 == 9 else f"Row {i}: café, {'ж' * (i % 5)} and more text."
        for i in range(3000)]
TEXTS = [t for t in ROWS if t is not None and t.strip()]  # nulls and blanks skipped, as blank lines are


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def _write(path, rows=ROWS, row_group_size=700, **columns):
    pq.write_table(pa.table({"text": rows, "id": list(range(len(rows))), **columns}), path,
                   row_group_size=row_group_size)
    return path


def test_a_parquet_file_is_read_a_batch_of_rows_at_a_time_in_row_order(tmp_path):
    """Five row groups of 700 rows, read in batches across them; each position is the file's bytes
    times the share of rows read, its size at the end."""
    path = _write(tmp_path / "fineweb.parquet")
    assert pq.ParquetFile(path).metadata.num_row_groups == 5
    read = list(file_texts(path))
    assert [t for t, _ in read] == TEXTS
    positions = [p for _, p in read]
    assert positions == sorted(positions) and positions[-1] == path.stat().st_size
    assert positions[0] == path.stat().st_size * 1024 // len(ROWS)  # after the first batch of 1024 rows


def test_another_column_and_wrong_ones_are_named(tmp_path):
    path = _write(tmp_path / "c.parquet", content=[f"content {i}" for i in range(len(ROWS))])
    assert list(Corpus(path, text_field="content").texts()) == [f"content {i}" for i in range(len(ROWS))]
    with pytest.raises(InputError, match=r"c.parquet has no 'body' column "
                                         r"\(it has \['text', 'id', 'content'\]\)"):
        list(Corpus(path, text_field="body").texts())
    with pytest.raises(InputError, match="c.parquet: column 'id' holds int64, not text"):
        list(Corpus(path, text_field="id").texts())


def test_a_damaged_or_misnamed_parquet_file_is_refused_by_name(tmp_path):
    whole = _write(tmp_path / "whole.parquet").read_bytes()
    (tmp_path / "cut.parquet").write_bytes(whole[:len(whole) // 2])
    with pytest.raises(InputError, match="cut.parquet is not a complete Parquet file .ArrowInvalid"):
        list(Corpus(tmp_path / "cut.parquet").texts())
    (tmp_path / "lines.parquet").write_text("a text file named .parquet\n")
    with pytest.raises(InputError, match="lines.parquet is not a complete Parquet file"):
        list(Corpus(tmp_path / "lines.parquet").texts())
    (tmp_path / "table.txt").write_bytes(whole)
    with pytest.raises(InputError, match="table.txt is a Parquet file: give it a .parquet name"):
        list(Corpus(tmp_path / "table.txt").texts())


def test_a_scan_of_parquet_and_json_lines_files_equals_the_scan_of_their_texts(model, tmp_path):
    """A folder as a Hub dataset's parquet branch holds it, beside a JSON Lines file; the text
    field applies to both; the fingerprint names it."""
    folder = tmp_path / "data"
    folder.mkdir()
    _write(folder / "train-00000-of-00002.parquet", ROWS[:200], row_group_size=64)
    (folder / "train-00001-of-00002.jsonl").write_text(
        "".join(json.dumps({"text": t}) + "\n" for t in TEXTS[200:260]), encoding="utf-8")
    want_texts = [t for t in ROWS[:200] if t is not None and t.strip()] + TEXTS[200:260]
    assert list(Corpus(folder).texts()) == want_texts
    assert Corpus(folder).fingerprint().startswith("text_field=text; 2 files")
    assert_scan_of_texts(model, folder, want_texts, ["growth", "survival"], batch_size=4, seq_len=32)


def test_cli_scan_reads_a_parquet_column(tmp_path, capsys):
    from residual_stream.cli import main

    path = _write(tmp_path / "c.parquet", ROWS[:40], body=[f"body {i}" for i in range(40)])
    out = tmp_path / "scan.json"
    args = ["scan", "twin-pre-rms", str(path), "--text-field", "body", "--quiet", "--out", str(out)]
    assert main(args) == 0
    tok = rs.load("twin-pre-rms").tokenizer
    assert json.loads(out.read_text())["tokens"] == sum(len(tok(f"body {i}")["input_ids"]) for i in range(40))


def _write_arrow(path, rows=ROWS, chunk=1000, stream=True, **columns):
    """An Arrow IPC stream (``datasets``' format: record batches of 1000 rows) or file."""
    table = pa.table({"text": rows, "id": list(range(len(rows))), **columns})
    with pa.OSFile(str(path), "wb") as sink:
        writer = (pa.ipc.new_stream if stream else pa.ipc.new_file)(sink, table.schema)
        writer.write_table(table, max_chunksize=chunk)
        writer.close()
    return path


@pytest.mark.parametrize("stream", [True, False], ids=["stream", "file"])
def test_an_arrow_file_is_read_a_record_batch_at_a_time(tmp_path, stream):
    path = _write_arrow(tmp_path / "data-00000-of-00001.arrow", stream=stream)
    read = list(file_texts(path))
    assert [t for t, _ in read] == TEXTS
    positions = [p for _, p in read]
    assert positions == sorted(positions) and 0 < positions[0] < positions[-1] <= path.stat().st_size
    with pytest.raises(InputError, match=r"has no 'body' column \(it has \['text', 'id'\]\)"):
        list(Corpus(path, text_field="body").texts())
    (tmp_path / "cut.arrow").write_bytes(path.read_bytes()[:len(path.read_bytes()) // 2])
    with pytest.raises(InputError, match="cut.arrow is not a complete Arrow file"):
        list(Corpus(tmp_path / "cut.arrow").texts())
    (tmp_path / "table.txt").write_bytes(path.read_bytes())
    with pytest.raises(InputError, match="table.txt is an Arrow file: give it a .arrow name"):
        list(Corpus(tmp_path / "table.txt").texts())


def test_a_save_to_disk_folder_scans_as_its_texts(model, tmp_path):
    """``Dataset.save_to_disk``'s layout: Arrow shards and two JSON documents (which are not JSON
    Lines, so they are skipped). Reference: the scan of the texts as a list."""
    folder = tmp_path / "saved"
    folder.mkdir()
    _write_arrow(folder / "data-00000-of-00002.arrow", ROWS[:150], chunk=64)
    _write_arrow(folder / "data-00001-of-00002.arrow", ROWS[150:300], chunk=64)
    info = {"features": {"text": {"dtype": "string"}}}
    (folder / "dataset_info.json").write_text(json.dumps(info, indent=2))
    state = {"_data_files": [{"filename": "data-00000-of-00002.arrow"}]}
    (folder / "state.json").write_text(json.dumps(state, indent=2))
    want_texts = [t for t in ROWS[:300] if t is not None and t.strip()]
    assert list(Corpus(folder).texts()) == want_texts
    assert_scan_of_texts(model, folder, want_texts, ["growth"], batch_size=4, seq_len=32)


def test_without_pyarrow_a_parquet_file_says_what_to_install(tmp_path, monkeypatch):
    path = _write(tmp_path / "c.parquet")
    monkeypatch.setitem(sys.modules, "pyarrow.parquet", None)  # import pyarrow.parquet: ImportError
    for each in (path, _write_arrow(tmp_path / "c.arrow")):
        with pytest.raises(InputError, match="a .parquet or .arrow corpus file needs pyarrow: pip install"):
            list(Corpus(each).texts())


@pytest.mark.parametrize("how", ["parquet", "arrow-stream", "arrow-file"])
def test_each_columnar_kind_is_probed_from_its_first_batch_before_it_is_read(tmp_path, how):
    """The progress estimate's prior for a kind not read yet: the first batch's characters over
    its position. Reference: the first 1,024 rows' characters over their share of the Parquet
    file's bytes, the first record batch's (1,000 rows) over a third of the Arrow file's; for a
    stream, within 3 % of the whole file's characters per byte."""
    from residual_stream.streaming.sources import chars_per_byte

    chars = sum(map(len, TEXTS))
    path = (_write(tmp_path / "a.parquet") if how == "parquet" else
            _write_arrow(tmp_path / "a.arrow", stream=how == "arrow-stream"))
    size, probe = path.stat().st_size, chars_per_byte(path)
    first = {"parquet": (1024, size * 1024 // len(ROWS)), "arrow-file": (1000, size // 3)}.get(how)
    if first is not None:
        rows, position = first
        assert probe == pytest.approx(sum(map(len, [t for t in ROWS[:rows] if t and t.strip()])) / position,
                                      rel=1e-12)
    assert probe == pytest.approx(chars / size, rel=0.03)
    progress = Corpus(tmp_path).progress()
    assert progress.probes == {f".{how.split('-')[0]}": probe}
    assert Corpus(tmp_path, text_field="id").progress().probes == {}  # its reading says why, later
