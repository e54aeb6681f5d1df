"""The texts of a corpus's files: plain text (one text per line) or JSON Lines, gzipped or not.

* ``.txt``: each non-blank line is a text (stripped);
* ``.jsonl``: each non-blank line is a JSON object whose ``text_field`` (``"text"`` by
  default) holds a text, newlines and all, as corpora such as web crawls ship them;
* either with ``.gz`` after it: read through ``gzip``, never unpacked to disk.

A folder holds such files at any depth, read in name order. Files are read lazily, a line at
a time, so memory does not grow with the corpus. A line that is not a JSON object with a
string in ``text_field``, or a file that is not gzip though named so, raises ``InputError``
naming the file and line; the texts before it have been yielded.
"""

from __future__ import annotations

import gzip
import io
import json
from collections.abc import Iterator
from pathlib import Path

from ..errors import InputError

SUFFIXES = (".txt", ".jsonl", ".txt.gz", ".jsonl.gz")  # what a folder's files may end with


def corpus_files(path: Path) -> list[Path]:
    """The files of a corpus at ``path``: itself, or a folder's ``SUFFIXES`` files in name order."""
    if path.is_dir():  # an empty folder is an empty corpus: its consumers say so
        return sorted(f for f in path.rglob("*") if f.is_file() and f.name.endswith(SUFFIXES))
    if path.is_file():
        return [path]
    raise InputError(f"corpus {str(path)!r} is not 'builtin', a file or a folder of "
                     f"{', '.join(SUFFIXES)} files")


def _open(path: Path) -> io.TextIOBase:
    if path.name.endswith(".gz"):
        return gzip.open(path, "rt", encoding="utf-8", errors="replace")
    return path.open(encoding="utf-8", errors="replace")


def file_texts(path: Path, text_field: str = "text") -> Iterator[tuple[str, int]]:
    """The non-blank texts of one file (see the module docstring), in order.

    Each with how many bytes of the file (of the compressed file for ``.gz``) have been read
    so far, in blocks: the position a progress estimate reads (``progress``).
    """
    jsonl = path.name.endswith((".jsonl", ".jsonl.gz"))
    try:
        with _open(path) as handle:
            raw = getattr(handle.buffer, "fileobj", handle.buffer)  # gzip: the compressed file
            for number, line in enumerate(handle, start=1):
                if not line.strip():
                    continue
                text = line.strip() if not jsonl else _json_text(line, text_field, f"{path}:{number}")
                if not text.strip():
                    continue
                yield text, raw.tell()
    except (gzip.BadGzipFile, EOFError) as e:
        raise InputError(f"{path} is not a complete gzip file ({e}); unpack it or fix the "
                         "name") from None


def _json_text(line: str, field: str, where: str) -> str:
    """The ``field`` string of one JSON Lines record, or ``InputError`` naming ``where``."""
    try:
        record = json.loads(line)
    except json.JSONDecodeError as e:
        raise InputError(f"{where} is not JSON ({e.msg}); a .jsonl corpus holds one JSON object "
                         "per line") from None
    if not isinstance(record, dict) or field not in record:
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise InputError(f"{where} has no {field!r} field (it has {keys}); name the field that "
                         "holds the text (text_field=, --text-field)")
    text = record[field]
    if not isinstance(text, str):
        raise InputError(f"{where}: {field!r} is a {type(text).__name__}, not a string")
    return text
