"""A 🤗 ``datasets.Dataset`` as a corpus: one string column's rows, in the dataset's order
(``streaming.hf_datasets``).

References: the rows as ``datasets`` itself gives them (``[row[field] for row in dataset]``),
and ``rs.scan`` of those texts as a list (``assert_scan_of_texts``).
"""

from __future__ import annotations

import itertools
import json
import re
import subprocess
import sys

import datasets
import pytest
from conftest import Column, assert_scan_of_texts

import residual_stream as rs
from residual_stream.errors import InputError
from residual_stream.streaming import Corpus
from residual_stream.streaming.corpus import ITEMS
from residual_stream.streaming.hf_datasets import column_of
from residual_stream.streaming.progress import ReadProgress

ROWS = [None if i % 40 == 7 else " \t" if i % 40 == 9 else f"Row {i}: café, {'ж' * (i % 5)} and more text."
        for i in range(2500)]  # 2,500 rows: three Arrow batches of 1,024, the last short


def _texts(rows) -> list[str]:
    """What a corpus reads of ``rows``: nulls and blank texts skipped, as blank lines are."""
    return [t for t in rows if t is not None and t.strip()]


@pytest.fixture(scope="module")
def dataset() -> datasets.Dataset:
    return datasets.Dataset.from_dict({"text": ROWS, "id": list(range(len(ROWS))),
                                       "body": [f"body {i}" for i in range(len(ROWS))]})


@pytest.fixture(scope="module")
def model() -> rs.Model:
    return rs.twin(norm="rmsnorm", placement="pre", n_layers=1, d_model=16, n_heads=2, n_ctx=32)


def test_a_dataset_reads_its_text_column_in_row_order_and_counts_every_row(dataset):
    """Across Arrow batches; the progress units are rows, nulls and blanks included, and the
    reading ends at the dataset's length."""
    corpus = Corpus(dataset)
    assert corpus.units() == {ITEMS: len(ROWS)}
    reading = ReadProgress(corpus.units())
    assert list(corpus.texts(reading)) == _texts(ROWS)
    assert reading.units[ITEMS] == len(ROWS) and reading.ended[ITEMS][1] == len(ROWS)
    assert reading.chars_read[ITEMS] == sum(map(len, _texts(ROWS)))
    assert list(Corpus(dataset, text_field="body").texts()) == list(dataset["body"])


@pytest.mark.parametrize("transform", ["shuffle", "select", "filter", "torch_format", "large_string"])
def test_a_transformed_dataset_is_read_in_its_own_order_whatever_its_format(dataset, transform):
    """The order ``datasets`` gives after its transforms (an indices mapping over the same
    Arrow table), and strings whatever format the dataset was set to."""
    changed = {
        "shuffle": lambda d: d.shuffle(seed=5),
        "select": lambda d: d.select(range(2400, 100, -7)),
        "filter": lambda d: d.filter(lambda row: row["id"] % 3 == 0),
        "torch_format": lambda d: d.with_format("torch"),
        "large_string": lambda d: d.cast_column("text", datasets.Value("large_string")),
    }[transform](dataset)
    want = _texts(row["text"] for row in changed.with_format(None))
    assert list(Corpus(changed).texts()) == want and len(want) > 100
    if transform == "shuffle":
        assert want != _texts(ROWS)


def test_a_column_of_a_dataset_is_read_as_its_dataset(dataset, monkeypatch):
    """``dataset["text"]`` (a ``Column``, which converts a row at a time) reads the same texts
    through its dataset's Arrow table, never through the column itself, with the dataset's
    fingerprint (a state saved with one resumes with the other)."""
    shuffled = dataset.shuffle(seed=3)
    want = [_texts(ROWS), _texts(shuffled.with_format(None)["text"]), list(dataset["body"])]
    corpora = [Corpus(c) for c in (dataset["text"], shuffled["text"], dataset["body"])]  # type-checked
    with monkeypatch.context() as patch:
        patch.setattr(datasets.arrow_dataset.Column, "__iter__", lambda self: 1 / 0)
        patch.setattr(datasets.arrow_dataset.Column, "__getitem__", lambda self, i: 1 / 0)
        for corpus, texts in zip(corpora, want, strict=True):
            assert list(corpus.texts()) == texts
        assert corpora[0].units() == {ITEMS: len(ROWS)}
    assert corpora[2].fingerprint() == Corpus(dataset, text_field="body").fingerprint()
    with pytest.raises(InputError, match=r"column 'id' holds Value\('int64'\), not text"):
        column_of(dataset["id"], "text")  # what Corpus(dataset["id"]) says (a type check in tests)
    with pytest.raises(InputError, match=r"the corpus is a column already: leave text_field out"):
        Corpus(dataset["text"], text_field="body")


def test_a_scan_of_a_dataset_equals_the_scan_of_its_texts(model, dataset):
    assert_scan_of_texts(model, dataset.select(range(300)), _texts(ROWS[:300]), ["growth", "survival"],
                         batch_size=3, seq_len=16)


def test_a_scan_of_a_dataset_resumes_and_another_dataset_is_refused_its_state(model, dataset, tmp_path):
    """The fingerprint is the column's name, rows and texts: an equal dataset made again
    resumes (states are complete here, so nothing is scanned twice); a changed text, or another
    column, does not."""
    part = dataset.select(range(200))
    state = tmp_path / "scan.pt"
    kw = dict(batch_size=2, seq_len=16, progress=False, state=state)
    whole = rs.scan(model, part, ["growth"], **kw)
    again = datasets.Dataset.from_dict({"text": ROWS[:200], "id": list(range(200)),
                                        "body": [f"body {i}" for i in range(200)]})
    resumed = rs.scan(model, again, ["growth"], **kw)
    assert resumed.resumed_tokens == whole.tokens == resumed.tokens
    fingerprint = Corpus(part).fingerprint()
    assert fingerprint.startswith("dataset column 'text' of 200 rows sha256:")
    edited = again.map(lambda row: {"text": row["text"] and row["text"].replace("café", "cafe")})
    assert Corpus(edited).fingerprint() != fingerprint != Corpus(part, text_field="body").fingerprint()
    with pytest.raises(InputError, match=r"saved for other arguments {.corpus.: \(\"dataset column"):
        rs.scan(model, edited, ["growth"], **kw)


def test_a_missing_column_or_one_of_numbers_is_named_before_reading(dataset):
    with pytest.raises(InputError, match=r"the dataset has no 'content' column \(it has "
                                         r"\['text', 'id', 'body'\]\).*text_field="):
        Corpus(dataset, text_field="content")
    with pytest.raises(InputError, match=r"column 'id' holds Value\('int64'\), not text"):
        Corpus(dataset, text_field="id")
    nested = datasets.Dataset.from_dict({"text": [["a", "b"], ["c"]]})
    with pytest.raises(InputError, match="column 'text' holds List"):
        Corpus(nested)


def test_a_dataset_dict_is_told_to_pick_a_split(dataset):
    with pytest.raises(InputError, match=r"cannot be a DatasetDict: it holds the splits \['train', "
                                         r"'test'\]: pick one, Corpus\(dataset\['train'\]"):
        Corpus(datasets.DatasetDict({"train": dataset, "test": dataset}))
    with pytest.raises(InputError, match=r"cannot be an IterableDatasetDict: it holds the splits "
                                         r"\['train'\]"):
        Corpus(datasets.IterableDatasetDict({"train": dataset.to_iterable_dataset()}))
    with pytest.raises(InputError, match=r"corpus item 0 is a dict, not a text \(a record\?"):
        list(Corpus(Column([{"text": "a record"}])).texts())


def _endless(pulled: list[int], field: str = "text"):
    """A stream with no end and no features (``from_generator``), counting the rows it gives."""
    def rows():
        for i in itertools.count():
            pulled[0] += 1
            yield {field: f"Row {i} of a stream with no end."}
    return datasets.IterableDataset.from_generator(rows)


def test_a_streamed_dataset_reads_its_column_and_scans_as_its_texts(model, dataset, tmp_path):
    """A streaming ``IterableDataset``, in shards or from JSON Lines and shuffled: the rows in
    the stream's own order, the same at every reading; no length, so no progress units."""
    stream = dataset.to_iterable_dataset(num_shards=3)
    assert list(Corpus(stream).texts()) == _texts(ROWS) and Corpus(stream).units() == {}
    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps({"text": t, "n": i}) + "\n" for i, t in enumerate(ROWS)), "utf-8")
    shuffled = datasets.load_dataset("json", data_files=str(path), streaming=True,
                                     split="train").shuffle(seed=4, buffer_size=100)
    order = _texts(row["text"] for row in shuffled)
    assert order != _texts(ROWS) and sorted(order) == sorted(_texts(ROWS))
    assert list(Corpus(shuffled).texts()) == order == list(Corpus(shuffled).texts())
    assert_scan_of_texts(model, stream.take(300), _texts(ROWS[:300]), ["growth", "survival"],
                         batch_size=3, seq_len=16)


def test_an_endless_stream_is_scanned_to_max_tokens(model):
    """Read as far as the budget needs (and a segment ahead), fingerprinted by its first texts:
    neither reads it to an end it does not have."""
    pulled = [0]
    stream = _endless(pulled)
    fingerprint = Corpus(stream).fingerprint()
    assert fingerprint.startswith("streamed dataset column 'text' (generator, default, split train, "
                                  "1 shard), first texts sha256:")
    assert fingerprint == Corpus(_endless([0])).fingerprint() != Corpus(_endless([0], "body"),
                                                                      text_field="body").fingerprint()
    result = rs.scan(model, stream, ["growth"], max_tokens=3000, batch_size=4, seq_len=16, progress=False)
    assert result.tokens == 3000 and 0 < pulled[0] < 10**6


def test_a_streamed_scan_resumes_from_its_state_and_another_stream_is_refused_it(model, dataset, tmp_path):
    state = tmp_path / "scan.pt"
    kw = dict(batch_size=2, seq_len=16, progress=False, state=state)
    whole = rs.scan(model, dataset.select(range(200)).to_iterable_dataset(), ["growth"], **kw)
    again = rs.scan(model, datasets.Dataset.from_dict({"text": ROWS[:200]}).to_iterable_dataset(),
                    ["growth"], **kw)
    assert again.resumed_tokens == whole.tokens == again.tokens
    edited = datasets.Dataset.from_dict({"text": ["Another first row.", *ROWS[1:200]]})
    with pytest.raises(InputError, match=r"saved for other arguments {.corpus.: \(\"streamed dataset"):
        rs.scan(model, edited.to_iterable_dataset(), ["growth"], **kw)


def test_a_stream_without_the_column_or_with_numbers_in_it_is_refused(dataset):
    """Named at construction where the stream knows its features, else at the first row."""
    with pytest.raises(InputError, match=r"streamed dataset has no 'content' column \(it has "
                                         r"\['text', 'id', 'body'\]\)"):
        Corpus(dataset.to_iterable_dataset(), text_field="content")
    with pytest.raises(InputError, match=r"streamed dataset's column 'id' holds Value\('int64'\)"):
        Corpus(dataset.to_iterable_dataset(), text_field="id")
    with pytest.raises(InputError, match=r"rows have no 'text' column \(they have \['body'\]\)"):
        list(Corpus(_endless([0], "body")).texts())
    numbers = datasets.IterableDataset.from_generator(lambda: ({"text": i} for i in range(3)))
    with pytest.raises(InputError, match=r"column 'text' holds int, not text"):
        list(Corpus(numbers).texts())


def test_the_cli_scans_a_dataset_named_hf_streaming_it(tmp_path, capsys):
    """``hf:FOLDER`` (a local dataset, as the Hub's are opened: ``load_dataset(…, streaming=True)``)
    scans the same tokens as its texts given as a list, to the budget; what cannot be opened
    is said, with the options to check."""
    from residual_stream.cli import main
    from residual_stream.streaming.runner import frames

    folder = tmp_path / "rows"
    folder.mkdir()
    (folder / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in ROWS[:400]), "utf-8")
    out = tmp_path / "scan.pt"
    options = ["--stats", "growth", "--max-tokens", "600", "--batch-size", "4", "--seq-len", "32"]
    assert main(["scan", "twin-pre-ln", f"hf:{folder}", *options, "--quiet", "--out", str(out)]) == 0
    got = rs.load_scan(out)
    want = rs.scan(rs.load("twin-pre-ln"), _texts(ROWS[:400]), ["growth"], max_tokens=600, batch_size=4,
                   seq_len=32, progress=False)
    assert got.tokens == want.tokens == 600
    for key, frame in frames(want.stats["growth"]).items():
        assert frames(got.stats["growth"])[key].equals(frame), key
    assert got.config["corpus"].startswith("streamed dataset column 'text' (rows, json, default, split train")
    capsys.readouterr()
    cases = [([f"hf:{tmp_path / 'none'}"], "could not be opened: Couldn't find any data file"),
             ([f"hf:{folder}", "--split", "test"], r"split 'test'\) could not be opened: Bad split"),
             (["hf:"], "hf: names a dataset"),
             (["builtin", "--split", "train"], "--split is for a corpus hf:NAME"),
             (["hf:nobody/no-such-dataset"], "could not be opened")]  # offline in tests, or not found
    for argv, message in cases:
        assert main(["scan", "twin-pre-ln", *argv, "--out", str(tmp_path / "x.json")]) == 1
        assert re.search(message, capsys.readouterr().err), argv
    assert not (tmp_path / "x.json").exists()


def test_the_library_never_imports_datasets_itself():
    """A dataset is recognized only where its caller imported ``datasets``: a scan of a list
    (and the CLI's imports) leave it unimported. transformers imports it lazily too."""
    code = ("import sys, residual_stream as rs, residual_stream.cli\n"
            "from residual_stream.streaming import Corpus\n"
            "assert list(Corpus(['one text', 'two']).texts()) == ['one text', 'two']\n"
            "print('datasets' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
