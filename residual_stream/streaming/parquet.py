"""Parquet corpus files: one text per row of a string column (FineWeb's, and any Hub dataset's parquet).

Read ``BATCH_ROWS`` rows at a time through ``pyarrow`` (an optional dependency: the app's
install has it, else ``pip install pyarrow``), so memory holds one batch of the one column, not
a row group or the file. The column is ``text_field`` (``"text"`` by default, as FineWeb and
most datasets name it); a null or blank text is skipped, as a blank line is. Arrow's strings
are UTF-8 by their format, so ``encoding_errors`` has nothing to do here.

A file's position, as a progress estimate reads it (``progress``), is its bytes times the
share of its rows read: its size once every row is.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError

SUFFIX = ".parquet"
MAGIC = b"PAR1"  # a Parquet file's first (and last) bytes
BATCH_ROWS = 1024


def _pyarrow():
    """``(pyarrow, pyarrow.parquet)``, or ``InputError`` saying what to install."""
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise InputError("reading a .parquet corpus file needs pyarrow: pip install pyarrow (the "
                         "app's install has it), or give the texts as JSON Lines") from None
    return pyarrow, pyarrow.parquet


def parquet_texts(path: Path, text_field: str = "text") -> Iterator[tuple[str, int]]:
    """The non-blank texts of ``text_field``'s column of the Parquet file ``path``, in row order.

    Each with the file's position (see the module docstring). ``InputError`` for a file that is
    not whole Parquet (cut short, another format named so), a missing column (naming those
    there) and a column of anything but strings.
    """
    pa, pq = _pyarrow()
    try:
        table = pq.ParquetFile(path)
    except (pa.ArrowException, OSError) as e:
        raise _damaged(path, e) from None
    try:
        schema = table.schema_arrow
        if text_field not in schema.names:
            raise InputError(f"{path} has no {text_field!r} column (it has {schema.names[:8]}); name the "
                             "column that holds the text (text_field=, --text-field)")
        column = schema.field(text_field).type
        if not (pa.types.is_string(column) or pa.types.is_large_string(column)
                or getattr(pa.types, "is_string_view", lambda _: False)(column)):
            raise InputError(f"{path}: column {text_field!r} holds {column}, not text (string); name "
                             "the column that holds the text (text_field=, --text-field)")
        size, rows, done = path.stat().st_size, table.metadata.num_rows, 0
        for batch in table.iter_batches(batch_size=BATCH_ROWS, columns=[text_field]):
            done += batch.num_rows
            position = size if done >= rows else size * done // rows
            for text in batch.column(0).to_pylist():
                if text is not None and text.strip():
                    yield text, position
    except (pa.ArrowException, OSError) as e:
        raise _damaged(path, e) from None
    finally:
        table.close()


def _damaged(path: Path, error: BaseException) -> InputError:
    """The error for a file that is not whole Parquet."""
    return InputError(f"{path} is not a complete Parquet file ({type(error).__name__}: "
                      f"{str(error).splitlines()[0][:200]}); download it again, or fix its name")
