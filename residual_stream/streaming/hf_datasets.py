"""A 🤗 ``datasets.Dataset`` as a corpus: the texts of one of its string columns, in its row order.

What a notebook holds after ``load_dataset("json", data_files=…, split="train")`` (or
``load_from_disk``, or ``Dataset.from_pandas``): ``Corpus(dataset, text_field="text")`` reads
the column ``text_field``, ``BATCH_ROWS`` rows at a time through Arrow (``TextColumn``), so a
dataset memory-mapped from its cache files streams through in constant memory, in the order the
dataset gives (after its ``shuffle``, ``select`` or ``filter``), whatever format it was set to
(``set_format("torch")``). A null or blank text is skipped, as a blank line is; rows are the
progress units (``corpus.ITEMS``), nulls and blanks included. One column of a dataset
(``dataset["text"]``, a ``Column``) is read as its dataset's (``column_of``).

Read through the dataset's own API, never by importing ``datasets``: a dataset is recognized
only where the caller has imported that package (``is_dataset``). What cannot be a corpus is told
what to pass instead (``advice``): a ``DatasetDict`` (a split of it), an ``IterableDataset``
(read once from its source, with no length: load it without ``streaming``, or give its files).
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from ..errors import InputError

BATCH_ROWS = 1024  # rows of the column converted to Python strings at a time
STRING_TYPES = ("string", "large_string", "string_view")  # a ``datasets.Value``'s dtypes of text


def is_dataset(source: object) -> bool:
    """Whether ``source`` is a ``datasets.Dataset`` (False where ``datasets`` was never imported)."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(source, getattr(module, "Dataset", ()))


def column_of(source: object, field: str) -> TextColumn | None:
    """The texts of a ``datasets.Dataset`` (its column ``field``) or of one column of it; else None.

    A column (``dataset["text"]``, a ``datasets`` ``Column``: a sequence that converts one row at
    a time, 7.5 µs a row) is read as its dataset's column, through Arrow.
    """
    if is_dataset(source):
        return TextColumn(source, field)
    column = getattr(sys.modules.get("datasets.arrow_dataset"), "Column", ())
    if isinstance(source, column) and is_dataset(getattr(source, "source", None)):
        return TextColumn(source.source, source.column_name)
    return None


def advice(source: object) -> str | None:
    """What to pass instead of a ``datasets`` object that is no corpus; None for anything else."""
    module = sys.modules.get("datasets")
    if module is None:
        return None
    if isinstance(source, (module.DatasetDict, module.IterableDatasetDict)):
        return (f"it holds the splits {list(source)[:8]}: pick one, Corpus(dataset['train'], "
                "text_field='text')")
    if isinstance(source, module.IterableDataset):
        return ("it is read once from its source and has no length: load it without "
                "streaming=True (load_dataset(…, split='train') keeps it on disk, memory-mapped), or "
                "give its .parquet/.jsonl files or a save_to_disk folder")
    return None


class TextColumn:
    """Column ``field`` of ``dataset`` as a sized, re-readable sequence of texts ("" for a null).

    What ``Corpus`` lists for a dataset: ``len`` is the dataset's rows, and each iteration reads
    the column afresh, ``BATCH_ROWS`` rows at a time, as Arrow (the dataset's own format set
    aside). ``InputError`` at construction for a missing column (naming those there) or one that
    does not hold strings.
    """

    def __init__(self, dataset, field: str) -> None:
        """Check that ``dataset`` has a column ``field`` of strings."""
        if field not in dataset.column_names:
            raise InputError(f"the dataset has no {field!r} column (it has {dataset.column_names[:8]}); "
                             "name the column that holds the text: Corpus(dataset, text_field=…)")
        dtype = getattr(dataset.features[field], "dtype", type(dataset.features[field]).__name__)
        if dtype not in STRING_TYPES:
            raise InputError(f"the dataset's column {field!r} holds {dataset.features[field]}, not "
                             "text (strings): name the column that holds the text: "
                             "Corpus(dataset, text_field=…)")
        self.dataset, self.field = dataset, field

    def __len__(self) -> int:
        """The dataset's rows, nulls and blanks included."""
        return len(self.dataset)

    def __iter__(self) -> Iterator[str]:
        """Each row's text, in the dataset's order; a null as ""."""
        rows = self.dataset.with_format("arrow").select_columns([self.field])
        for table in rows.iter(batch_size=BATCH_ROWS):
            for text in table.column(self.field).to_pylist():
                yield "" if text is None else text

    def __repr__(self) -> str:
        """``dataset column 'text' of N rows``: how a scan state's fingerprint names it."""
        return f"dataset column {self.field!r} of {len(self)} rows"
