"""Columnar corpus files: one text per row of a string column, in Parquet or Arrow files.

* ``.parquet``: FineWeb's files, and any Hub dataset's parquet branch;
* ``.arrow``: Arrow IPC files, as ``datasets``' ``save_to_disk`` and its cache write them
  (the stream format; the random-access file format too), memory-mapped.

Read through ``pyarrow`` (an optional dependency: the app's install has it, else ``pip install
pyarrow``), ``BATCH_ROWS`` rows of the one column at a time, so memory holds one batch, not a
row group or the file. The column is ``text_field`` (``"text"`` by default, as FineWeb and most
datasets name it); a null or blank text is skipped, as a blank line is. Arrow's strings are
UTF-8 by their format, so ``encoding_errors`` has nothing to do here.

A file's position, as a progress estimate reads it (``progress``): the bytes read so far for an
Arrow stream; else the file's bytes times the share of its rows (Parquet) or record batches
(an Arrow file) read, its size once every one is. The estimate's prior for a kind not read yet
is its first file's first batch, measured the same way (``chars_per_unit``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError

PARQUET, ARROW = ".parquet", ".arrow"
SUFFIXES = (PARQUET, ARROW)
PARQUET_MAGIC = b"PAR1"  # a Parquet file's first (and last) bytes
ARROW_FILE_MAGIC = b"ARROW1"  # an Arrow IPC file's (the stream format has none)
BATCH_ROWS = 1024
NAME_FIELD = "(text_field=, --text-field)"  # how an error advises naming the text's field (the app: its box)


def _pyarrow():
    """``(pyarrow, pyarrow.parquet)``, or ``InputError`` saying what to install."""
    try:
        import pyarrow
        import pyarrow.ipc
        import pyarrow.parquet
    except ImportError:
        raise InputError("reading a .parquet or .arrow corpus file needs pyarrow: pip install pyarrow "
                         "(the app's install has it), or give the texts as JSON Lines") from None
    return pyarrow, pyarrow.parquet


def columnar_texts(path: Path, text_field: str = "text") -> Iterator[tuple[str, int]]:
    """The non-blank texts of ``text_field``'s column of the Parquet or Arrow file ``path``, in row order.

    Each with the file's position (see the module docstring). ``InputError`` for a file that is
    not whole (cut short, another format named so), a missing column (naming those there) and
    a column of anything but strings.
    """
    pa, pq = _pyarrow()
    opened = []  # what to close however the reading ends
    try:
        schema, batches = _arrow(path, pa, opened) if path.name.endswith(ARROW) else \
            _parquet(path, text_field, pq, opened)
        _check_column(path, schema, text_field, pa)
        for batch, position in batches:
            column = batch.column(text_field)
            for start in range(0, len(column), BATCH_ROWS):
                for text in column.slice(start, BATCH_ROWS).to_pylist():
                    if text is not None and text.strip():
                        yield text, position
    except (pa.ArrowException, OSError) as e:
        kind = "Parquet" if path.name.endswith(PARQUET) else "Arrow"
        raise InputError(f"{path} is not a complete {kind} file ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]}); download it again, or fix its name") from None
    finally:
        for thing in opened:
            thing.close()


def chars_per_unit(path: Path, text_field: str = "text") -> float | None:
    """Characters of text per byte of ``path`` as its positions count them, from its first batch.

    The characters of the texts up to the first position read, over that position: for Parquet
    its first ``BATCH_ROWS`` rows' share of the file's bytes, for an Arrow file its first record
    batch's, for a stream the bytes read to its first batch. None where the file has no text, or
    cannot be read (its reading says why). A progress estimate's prior for the kind
    (``sources.probes``).
    """
    first, chars = None, 0
    try:
        with contextlib.closing(columnar_texts(path, text_field)) as texts:
            for text, position in texts:
                if first is not None and position != first:
                    break
                first, chars = position, chars + len(text)
    except InputError:
        return None
    return chars / first if first else None


def _parquet(path: Path, text_field: str, pq, opened: list):
    """``(schema, (batch, position) …)`` of a Parquet file: ``BATCH_ROWS`` rows of ``text_field`` at once."""
    table = pq.ParquetFile(path)
    opened.append(table)
    size, rows = path.stat().st_size, table.metadata.num_rows

    def batches():
        done = 0
        for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=[text_field]):
            done += batch.num_rows
            yield batch, size if done >= rows else size * done // rows

    return table.schema_arrow, batches()


def _arrow(path: Path, pa, opened: list):
    """``(schema, (batch, position) …)`` of an Arrow IPC file or stream, memory-mapped: its record batches."""
    source = pa.memory_map(str(path))
    opened.append(source)
    if source.read(len(ARROW_FILE_MAGIC)) == ARROW_FILE_MAGIC:
        source.seek(0)
        reader = pa.ipc.open_file(source)
        size, n = path.stat().st_size, reader.num_record_batches
        return reader.schema, ((reader.get_batch(i), size * (i + 1) // n) for i in range(n))
    source.seek(0)
    reader = pa.ipc.open_stream(source)
    return reader.schema, ((batch, source.tell()) for batch in reader)


def _check_column(path: Path, schema, text_field: str, pa) -> None:
    """``InputError`` unless ``schema`` has a column ``text_field`` of strings."""
    if text_field not in schema.names:
        raise InputError(f"{path} has no {text_field!r} column (it has {schema.names[:8]}); name the "
                         "column that holds the text " + NAME_FIELD)
    column = schema.field(text_field).type
    if not (pa.types.is_string(column) or pa.types.is_large_string(column)
            or getattr(pa.types, "is_string_view", lambda _: False)(column)):
        raise InputError(f"{path}: column {text_field!r} holds {column}, not text (string); name "
                         "the column that holds the text " + NAME_FIELD)
