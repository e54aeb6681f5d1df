"""The texts of a corpus's files: plain text (one text per line) or JSON Lines, compressed or not.

* ``.txt``: each non-blank line is a text (stripped);
* ``.jsonl``: each non-blank line is a JSON object whose ``text_field`` (``"text"`` by
  default) holds a text, newlines and all, as corpora such as web crawls ship them;
* either with ``.gz``, ``.xz``, ``.bz2`` or ``.zst`` after it: read through that compression
  as it streams, never unpacked to disk (``packing``);
* ``.json`` (compressed or not) whose first line is a whole JSON object: JSON Lines under
  another name, as C4 ships them (``json_lines``). A JSON document (an array, an indented
  object) is refused when named alone and skipped in a folder, as is a record without
  ``text_field``;
* ``.parquet`` or ``.arrow``: each row's ``text_field`` column, as FineWeb and the Hub's
  datasets ship them and ``datasets``' ``save_to_disk`` writes them (``columnar``).

A folder holds such files at any depth, read in name order. Files are read lazily, a line at
a time, so memory does not grow with the corpus. A line that is not a JSON object with a
string in ``text_field``, or a compressed file cut short or damaged, raises ``InputError``
naming the file and line; the texts before it have been yielded. So does a file that its
first bytes show is not text, or not packed as its name says: compressed by a tool no corpus
is read through (zip, 7z), compressed one way and named another (gzip not named ``.gz``), or binary;
and bytes that are not UTF-8 (Latin-1, say), when they are read, naming the first one's byte
offset and line (``utf8.not_utf8``), unless the corpus asks to read them as U+FFFD
(``encoding_errors="replace"``: one warning per file, ``utf8``). A UTF-8 byte-order
mark at a file's start is dropped. A corpus path that is neither a regular file nor a folder
(a named pipe, a device) is refused: it could not be read twice, and a FIFO would block.

Also here: the built-in corpus, what a list of texts must be to be a corpus
(``ordered_and_reread``), and what is known of files without reading them through: their
bytes per kind (``sizes``), a fingerprint (``files_fingerprint``) and the characters of text
per byte at their start (``chars_per_byte``, ``probes``: a progress estimate's prior).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import io
import json
from collections.abc import Iterator, Mapping
from collections.abc import Set as AbstractSet
from importlib import resources
from pathlib import Path

from ..errors import InputError
from ..files import path_kind
from .columnar import ARROW_FILE_MAGIC, NAME_FIELD, PARQUET_MAGIC, chars_per_unit, columnar_texts
from .columnar import SUFFIXES as COLUMNAR
from .packing import (
    PACKINGS,
    Packing,
    damaged,
    damaged_errors,
    packed_by,
    packing_of,
    unpacked,
    unpacked_head,
)
from .packing import SUFFIXES as PACKING_SUFFIXES
from .utf8 import EncodingErrors, codec_errors, kept, not_utf8, replacements, warn_replaced

# what a folder's files may end with; and .json files, read when their first line is a record (``json_lines``)
SUFFIXES = (*(base + packed for base in (".txt", ".jsonl") for packed in ("", *PACKING_SUFFIXES)), *COLUMNAR)
JSON_SUFFIXES = tuple(".json" + packed for packed in ("", *PACKING_SUFFIXES))
DESCRIBED = f".txt, .jsonl or .json, plain or {', '.join(PACKING_SUFFIXES)}; or {' or '.join(COLUMNAR)}"
FIRST_LINE_CHARS = 1 << 24  # characters of a .json file's first line read to tell if it is one
PROBE_BYTES = 1 << 18  # bytes of a file's start read to estimate its characters per byte
FINGERPRINT_ENDS = 1 << 12  # bytes read from each end of a corpus file for its fingerprint
SNIFF_BYTES = 1 << 12  # bytes of a file's start checked to be text (``_check_content``)


def builtin_corpus() -> list[str]:
    """The shipped corpus: 220 English sentences and 100 lines of Python, one per line."""
    text = resources.files("residual_stream").joinpath("data/builtin_corpus.txt").read_text("utf-8")
    return [line for line in text.splitlines() if line and not line.startswith("#")]


def ordered_and_reread(source) -> bool:
    """Whether ``source`` is a path or a collection of texts that reads the same every time.

    A list, a tuple, a dataset's column: sized and ordered. Not an iterator (read once), a
    set (its order changes between runs) or a dict.
    """
    if isinstance(source, str | Path):
        return True
    return (hasattr(source, "__len__") and hasattr(source, "__iter__")
            and not isinstance(source, Iterator | AbstractSet | Mapping))


def corpus_files(path: Path, text_field: str = "text") -> list[Path]:
    """The files of a corpus at ``path``: itself, or a folder's corpus files in name order.

    A folder's: its ``SUFFIXES`` files, and its ``JSON_SUFFIXES`` files whose first record
    holds ``text_field`` (so not a dataset's ``dataset_info.json``; one that cannot be read
    is skipped too). ``InputError`` for a folder whose files are all of other kinds (naming
    some, or the field its JSON Lines lack), and for a ``.json`` file that is not JSON Lines
    (a JSON array or an indented document is no corpus file), and for a path that is neither
    a regular file nor a folder (a named pipe would block the reading).
    """
    kind_of_path = path_kind(path, "the corpus")
    if kind_of_path == "folder":  # an empty folder is an empty corpus: its consumers say so
        files = sorted(f for f in path.rglob("*") if f.is_file())
        found = [f for f in files if f.name.endswith(SUFFIXES)
                 or f.name.endswith(JSON_SUFFIXES) and _skip_unreadable(f, text_field)]
        if files and not found:
            lacking = next((f for f in files if f.name.endswith(JSON_SUFFIXES)
                            and _skip_unreadable(f, None)), None)
            if lacking is not None:  # C4's files with another text_field
                raise InputError(f"{lacking}: its records have no {text_field!r} field; name the "
                                 "field that holds the text " + NAME_FIELD)
            some = ", ".join(f.relative_to(path).as_posix() for f in files[:3])
            others = f"{len(files)} other file{'s' if len(files) > 1 else ''}: {some}"
            raise InputError(f"corpus folder {str(path)!r} holds no corpus file ({DESCRIBED}; {others}"
                             f"{', …' if len(files) > 3 else ''}); unpack or rename them")
        return found
    if kind_of_path == "file":
        if path.name.endswith(JSON_SUFFIXES) and not json_lines(path):
            raise InputError(f"{path}: its first line is not a JSON object, so it is a JSON "
                             "document, not JSON Lines, which is no corpus: write one JSON object "
                             "per line (a .jsonl file)")
        return [path]
    if kind_of_path is not None:
        raise InputError(f"corpus {str(path)!r} is {kind_of_path}, not a regular file or a folder: "
                         "a scan reads its corpus more than once (its first batch, a resumed scan), "
                         "so write the texts to a file and give that")
    raise InputError(f"corpus {str(path)!r} is not 'builtin', a file or a folder of corpus files "
                     f"({DESCRIBED})")


def files_fingerprint(root: Path, files: list[Path], text_field: str) -> str:
    """Identifies the files of a corpus at ``root`` wherever they lie (``Corpus.fingerprint``).

    Their names within ``root``, sizes, and the first and last ``FINGERPRINT_ENDS`` bytes of
    each, hashed; with any JSON Lines file, the field its texts come from too.
    """
    digest, total = hashlib.sha256(), 0
    for f in files:
        size = f.stat().st_size
        name = f.relative_to(root).as_posix() if root.is_dir() else f.name
        digest.update(f"{name}:{size}\0".encode())
        with open(f, "rb") as data:
            digest.update(data.read(FINGERPRINT_ENDS))
            if size > 2 * FINGERPRINT_ENDS:
                data.seek(-FINGERPRINT_ENDS, 2)
            digest.update(data.read())
        total += size
    field = f"text_field={text_field}; " if any(has_fields(kind(f)) for f in files) else ""
    return f"{field}{len(files)} files, {total} bytes, sha256:{digest.hexdigest()[:16]}"


def sizes(files: list[Path]) -> dict[str, int]:
    """The files' bytes, summed per ``kind``."""
    totals: dict[str, int] = {}
    for f in files:
        k = kind(f)
        totals[k] = totals.get(k, 0) + f.stat().st_size
    return totals


def probes(files: list[Path], text_field: str) -> dict[str, float]:
    """``chars_per_byte`` at the start of the first file of each ``kind`` (where it has a line)."""
    first: dict[str, Path] = {}
    for f in files:
        first.setdefault(kind(f), f)
    ratios = {k: chars_per_byte(f, text_field) for k, f in first.items()}
    return {k: r for k, r in ratios.items() if r}


@contextlib.contextmanager
def _text(path: Path, errors: str = "strict") -> Iterator[tuple[io.TextIOBase, io.IOBase]]:
    """``(path as text, the file)``: UTF-8 unpacked as its name says (``packing``), a byte-order mark dropped.

    ``errors="strict"``: a byte that is not UTF-8 raises ``UnicodeDecodeError`` when read
    (``not_utf8``); else the codec error handler named (``utf8.codec_errors``). The file's
    position is the bytes of it read so far (compressed bytes for a compressed file).
    """
    _check_content(path, packing_of(path))
    with unpacked(path) as (stream, raw), \
            io.TextIOWrapper(stream, encoding="utf-8-sig", errors=errors) as text:
        yield text, raw


def _check_content(path: Path, packing: Packing | None) -> None:
    """``InputError`` for a file whose first bytes show it is not text, or not packed as named.

    Compressed one way and named another (or not at all), compressed by a tool no corpus is
    read through (zip, 7z), or, plain, holding a NUL byte in its first ``SNIFF_BYTES``: read
    as text, it would be garbage texts.
    """
    with open(path, "rb") as f:
        head = f.read(SNIFF_BYTES)
    packed, named = packed_by(head), None if packing is None else packing.name
    right = next((p for p in PACKINGS if p.name == packed), None)
    if right is not None and packed != named:
        base = path.name[:-len(packing.suffix)] if packing else path.name
        raise InputError(f"{path} is {packed}-compressed: give it a .txt{right.suffix} or "
                         f".jsonl{right.suffix} name (e.g. {base}{right.suffix}) to read it through {packed}")
    if packed is not None and right is None:
        raise InputError(f"{path} is {packed}-compressed, which a corpus is not read through: unpack "
                         f"it, or compress it with {', '.join(p.name for p in PACKINGS)} "
                         f"({', '.join(PACKING_SUFFIXES)})")
    if packing is None and head.startswith((PARQUET_MAGIC, ARROW_FILE_MAGIC, b"\xff\xff\xff\xff")):
        what = "a Parquet" if head.startswith(PARQUET_MAGIC) else "an Arrow"
        raise InputError(f"{path} is {what} file: give it a .{what.split()[1].lower()} name to read its "
                         "text column")
    if packing is None and b"\0" in head:
        raise InputError(f"{path} is not text (a NUL byte in its first {SNIFF_BYTES} bytes): "
                         "give UTF-8 text or JSON Lines")


def file_texts(path: Path, text_field: str = "text", encoding_errors: EncodingErrors = "strict",
               replaced: list[str] | None = None) -> Iterator[tuple[str, int]]:
    """The non-blank texts of one file (see the module docstring), in order.

    Each with how many bytes of the file (of the compressed file, for one) have been read so
    far, in blocks: the position a progress estimate reads (``progress``). Bytes that are not
    UTF-8 are refused, or read as U+FFFD with one warning per file (``utf8``), whose text is
    added to ``replaced`` when given.
    """
    if kind(path) in COLUMNAR:  # a column of strings, not lines
        yield from columnar_texts(path, text_field)
        return
    jsonl = kind(path).startswith(".jsonl")
    warned = encoding_errors == "strict"  # nothing to warn of: the first such byte stops it
    try:
        with _text(path, codec_errors(encoding_errors)) as (handle, raw):
            seen = replacements()
            for number, line in enumerate(handle, start=1):
                if not warned and (now := replacements()) != seen:  # this file's, or another's
                    warning, seen = warn_replaced(path), now  # decoded in this thread meanwhile
                    warned = kept(warning, replaced)
                text = _line_text(line, jsonl, text_field, path, number)
                if text:
                    yield text, raw.tell()
    except damaged_errors(path) as e:  # gzip's zlib.error: damaged data after the header
        raise damaged(path, e) from None
    except UnicodeDecodeError:
        raise not_utf8(path) from None


def kind(path: Path) -> str:
    """How ``path`` is read: ``".txt"`` or ``".jsonl"``, with its packing's suffix (``".gz"``) after it.

    A ``.json`` file is read as JSON Lines: ``corpus_files`` lets through only those that are.
    ``".parquet"`` or ``".arrow"`` for a columnar file (``columnar``).
    """
    if path.name.endswith(COLUMNAR):
        return next(s for s in COLUMNAR if path.name.endswith(s))
    packing = packing_of(path)
    name = path.name[:-len(packing.suffix)] if packing else path.name
    return (".jsonl" if name.endswith((".jsonl", ".json")) else ".txt") + (packing.suffix if packing else "")


def has_fields(kind_of_file: str) -> bool:
    """Whether files of this ``kind`` hold their texts in a field (JSON Lines) or column (Parquet, Arrow)."""
    return kind_of_file.startswith(".jsonl") or kind_of_file in COLUMNAR


def json_lines(path: Path, text_field: str | None = None) -> bool:
    """Whether the first non-blank line of ``path`` (a ``.json`` file) is a whole JSON object (or none).

    With ``text_field``, one holding that field too. A JSON document written with indents
    starts with a line of ``{`` or ``[`` alone; an array on one line is no object. Reads at
    most ``FIRST_LINE_CHARS`` characters, bytes that are not UTF-8 as U+FFFD (they do not
    change what the line is; the file's reading refuses them or warns); ``InputError`` for a
    file that is no text (see ``_check_content``) or a damaged compressed one.
    """
    try:
        with _text(path, "replace") as (handle, _):
            line = ""
            while not line.strip():
                line = handle.readline(FIRST_LINE_CHARS)
                if not line:
                    return True  # no line: an empty corpus, as an empty .jsonl file is
    except damaged_errors(path) as e:
        raise damaged(path, e) from None
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):  # not JSON; an integer of 5,000 digits; [[[[…
        return False
    return isinstance(record, dict) and (text_field is None or text_field in record)


def _skip_unreadable(path: Path, text_field: str | None) -> bool:
    """``json_lines`` for a folder's ``.json`` file; False for one that cannot be read.

    Remembered per file version (size, modification time): a scan lists its folder several
    times (fingerprint, sizes, probes, texts), and C4 holds 1,024 such files.
    """
    try:
        found = path.stat()
        return _json_lines_of(str(path), found.st_size, found.st_mtime_ns, text_field)
    except (InputError, OSError):
        return False


@functools.lru_cache(maxsize=1 << 14)
def _json_lines_of(path: str, size: int, mtime_ns: int, text_field: str | None) -> bool:
    """``json_lines`` of one version of a file (``_skip_unreadable``'s memory)."""
    return json_lines(Path(path), text_field)


def chars_per_byte(path: Path, text_field: str = "text") -> float | None:
    """Characters of text per byte of ``path`` (compressed bytes for a compressed file) at its start.

    From its first ``PROBE_BYTES`` bytes: the texts of the whole lines there, as
    ``file_texts`` reads them, over the bytes those lines take (for a compressed file, their
    share of the compressed bytes unpacked, ``packing.unpacked_head``). None when those bytes
    hold no line, or cannot be read (the file's own reading says why). A Parquet or Arrow
    file's, from its first batch of rows (``columnar.chars_per_unit``). What a progress
    estimate assumes for a kind of file it has not read yet (``progress.ReadProgress``).
    """
    how = kind(path)
    if how in COLUMNAR:
        return chars_per_unit(path, text_field)
    with open(path, "rb") as f:
        head = f.read(PROBE_BYTES)
    unpacked_bytes = unpacked_head(path, head)
    if unpacked_bytes is None:
        return None
    data, units = unpacked_bytes
    whole = len(head) < PROBE_BYTES and units == len(head)  # the whole file: its last line is whole
    if not units:
        return None
    lines = data.split(b"\n") if whole else data.split(b"\n")[:-1]  # the last may be cut
    if not lines or not data:
        return None
    used = sum(len(line) + 1 for line in lines)
    jsonl, chars = how.startswith(".jsonl"), 0
    for line in lines:
        try:
            chars += len(_line_text(line.decode("utf-8", errors="replace"), jsonl, text_field, path))
        except InputError:  # a malformed record: the reading names it
            continue
    return chars / (units * min(1.0, used / len(data)))


def _line_text(line: str, jsonl: bool, field: str, path: Path | str, number: int | None = None) -> str:
    """The text of one line of a file: the line stripped, or a record's ``field``; "" if blank.

    An error names ``path`` and the line's ``number`` (made only then: a line's cost counts).
    """
    if not line.strip():
        return ""
    text = _json_text(line, field, path, number) if jsonl else line.strip()
    return text if text.strip() else ""


_decode = json.JSONDecoder().decode  # json.loads of a str, without its per-call checks


def _json_text(line: str, field: str, path: Path | str, number: int | None) -> str:
    """The ``field`` string of one JSON Lines record, or ``InputError`` naming its place."""
    try:
        record = _decode(line)
    except json.JSONDecodeError as e:
        where = path if number is None else f"{path}:{number}"
        raise InputError(f"{where} is not JSON ({e.msg}); a .jsonl corpus holds one JSON object "
                         "per line") from None
    if not isinstance(record, dict) or field not in record:
        where = path if number is None else f"{path}:{number}"
        keys = sorted(record) if isinstance(record, dict) else type(record).__name__
        raise InputError(f"{where} has no {field!r} field (it has {keys}); name the field that "
                         "holds the text " + NAME_FIELD)
    text = record[field]
    if not isinstance(text, str):
        where = path if number is None else f"{path}:{number}"
        raise InputError(f"{where}: {field!r} is a {type(text).__name__}, not a string")
    return text
