"""A 🤗 ``datasets`` dataset as a corpus: the texts of one of its string columns, in its row order.

What a notebook holds after ``load_dataset("json", data_files=…, split="train")`` (or
``load_from_disk``, or ``Dataset.from_pandas``): ``Corpus(dataset, text_field="text")`` reads
the column ``text_field``, ``BATCH_ROWS`` rows at a time through Arrow (``TextColumn``), so a
dataset memory-mapped from its cache files streams through in constant memory, in the order the
dataset gives (after its ``shuffle``, ``select`` or ``filter``), whatever format it was set to
(``set_format("torch")``). A null or blank text is skipped, as a blank line is; rows are the
progress units (``corpus.ITEMS``), nulls and blanks included. One column of a dataset
(``dataset["text"]``, a ``Column``) is read as its dataset's (``column_of``).

A streaming ``IterableDataset`` (``load_dataset(…, streaming=True)``: the Hub's corpora read as
they download) is read the same way (``StreamColumn``), with what a stream lacks said: it has no
length, so the progress bar counts out of ``max_tokens`` (with none, it shows no time left); its
fingerprint (a scan state's, ``Corpus.fingerprint``) is its source's description and a hash of
its first ``HEAD_CHARS`` characters of text, so a change further on is not seen; and its start
is read again for each of those, for a scan's calibration batch, and by a resumed scan (which
reads up to where it stopped, untokenized) and every ``torchrun`` process (each reads it all,
tokenizing its own segments). Each reading must give the same rows in the same order: a
stream's ``shuffle(seed=…)`` does, until its ``set_epoch`` changes.

Read through the dataset's own API, never by importing ``datasets``: a dataset is recognized
only where the caller has imported that package (``is_dataset``). A ``DatasetDict`` is told to
pick a split (``advice``). The one import is ``open_stream``'s, for the command line's corpus
``hf:NAME`` (a dataset on the Hub, or a local dataset folder), opened streaming.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator

from ..errors import InputError

HUB_PREFIX = "hf:"  # the command line's corpus hf:NAME: a 🤗 dataset, streamed (``open_stream``)
BATCH_ROWS = 1024  # rows of the column converted to Python strings at a time
HEAD_CHARS = 1 << 20  # characters of a stream's first texts that its fingerprint hashes
STRING_TYPES = ("string", "large_string", "string_view")  # a ``datasets.Value``'s dtypes of text


def is_dataset(source: object) -> bool:
    """Whether ``source`` is a ``datasets.Dataset`` (False where ``datasets`` was never imported)."""
    module = sys.modules.get("datasets")
    return module is not None and isinstance(source, getattr(module, "Dataset", ()))


def column_of(source: object, field: str) -> TextColumn | StreamColumn | None:
    """The texts of a ``datasets`` dataset (its column ``field``) or of one column of it; else None.

    A ``Dataset``'s or one of its columns (``dataset["text"]``, a ``datasets`` ``Column``: a
    sequence that converts one row at a time, 7.5 µs a row, read as its dataset's column,
    through Arrow) as a ``TextColumn``; a streaming ``IterableDataset``'s as a ``StreamColumn``.
    """
    if is_dataset(source):
        return TextColumn(source, field)
    if isinstance(source, getattr(sys.modules.get("datasets"), "IterableDataset", ())):
        return StreamColumn(source, field)
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
    return None


def open_stream(name: str, config: str | None, split: str):
    """``datasets.load_dataset(name, config, split=split, streaming=True)``: rows read as they download.

    ``InputError`` for a name that is empty or cannot be opened (no such dataset or folder, no
    network, a split or configuration it lacks: ``datasets``' own reason), and where
    ``datasets`` is not installed.
    """
    if not name.strip():
        raise InputError("hf: names a dataset: hf:HuggingFaceFW/fineweb-edu, or hf:./a/dataset/folder")
    try:
        import datasets
    except ImportError:
        raise InputError(f"{HUB_PREFIX}{name} needs the datasets package: pip install datasets") from None
    try:
        return datasets.load_dataset(name, config, split=split, streaming=True)
    except (OSError, ValueError) as e:  # not found, offline, a bad split or config
        reason = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise InputError(f"the dataset {name!r} (configuration {config}, split {split!r}) could not be "
                         f"opened: {reason[:300]}; check the name, --dataset-config and --split") from None


def _check_features(features, field: str, what: str) -> None:
    """``InputError`` where ``features`` (None: unknown) lack ``field`` or it does not hold strings."""
    if features is None:
        return
    if field not in features:
        raise InputError(f"the {what} has no {field!r} column (it has {list(features)[:8]}); "
                         "name the column that holds the text: Corpus(dataset, text_field=…)")
    dtype = getattr(features[field], "dtype", type(features[field]).__name__)
    if dtype not in STRING_TYPES:
        raise InputError(f"the {what}'s column {field!r} holds {features[field]}, not text (strings): "
                         "name the column that holds the text: Corpus(dataset, text_field=…)")


class TextColumn:
    """Column ``field`` of ``dataset`` as a sized, re-readable sequence of texts ("" for a null).

    What ``Corpus`` lists for a dataset: ``len`` is the dataset's rows, and each iteration reads
    the column afresh, ``BATCH_ROWS`` rows at a time, as Arrow (the dataset's own format set
    aside). ``InputError`` at construction for a missing column (naming those there) or one that
    does not hold strings.
    """

    def __init__(self, dataset, field: str) -> None:
        """Check that ``dataset`` has a column ``field`` of strings."""
        _check_features(dataset.features, field, "dataset")
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


class StreamColumn:
    """Column ``field`` of a streaming ``IterableDataset`` as a re-readable iterable of texts.

    No length: read to its end, or to a scan's ``max_tokens``. Each iteration reads the stream
    afresh, ``BATCH_ROWS`` rows a call; ``head`` gives its first ``HEAD_CHARS`` characters of
    text, for its fingerprint. ``InputError`` for a missing column or one that does not hold
    strings: at construction where the stream's features are known, else at the row.
    """

    def __init__(self, dataset, field: str) -> None:
        """Check ``field`` against ``dataset``'s features, where it has them."""
        _check_features(dataset.features, field, "streamed dataset")
        self.dataset, self.field = dataset, field

    def __iter__(self) -> Iterator[str]:
        """Each row's text, in the stream's order; a null as ""."""
        known = self.dataset.features is not None  # else its rows are read whole, to find the column
        rows = self.dataset.select_columns([self.field]) if known else self.dataset
        for batch in rows.iter(batch_size=BATCH_ROWS):
            if self.field not in batch:
                raise InputError(f"the streamed dataset's rows have no {self.field!r} column (they have "
                                 f"{list(batch)[:8]}): Corpus(dataset, text_field=…)")
            for text in batch[self.field]:
                if text is not None and not isinstance(text, str):
                    raise InputError(f"the streamed dataset's column {self.field!r} holds "
                                     f"{type(text).__name__}, not text: Corpus(dataset, text_field=…)")
                yield "" if text is None else text

    def head(self) -> Iterator[str]:
        """The stream's first texts, up to ``HEAD_CHARS`` characters (the one that reaches it whole)."""
        chars = 0
        for text in self:
            yield text
            chars += len(text)
            if chars >= HEAD_CHARS:
                return

    def __repr__(self) -> str:
        """``streamed dataset column 'text' (json, split train, 4 shards), first texts``."""
        info = self.dataset.info
        named = (info.dataset_name if info.dataset_name != info.builder_name else None,
                 info.builder_name, info.config_name)
        source = ", ".join(str(part) for part in named if part)
        split = f", split {self.dataset.split}" if self.dataset.split else ""
        return (f"streamed dataset column {self.field!r} ({source or 'generated'}{split}, "
                f"{self.dataset.n_shards} shard{'s' if self.dataset.n_shards != 1 else ''}), first texts")
