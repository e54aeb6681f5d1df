"""Bytes of a corpus file that are not UTF-8: refused by default, or read as U+FFFD on request.

``encoding_errors`` (``Corpus``, ``--encoding-errors``) says which:

* ``"strict"`` (the default): the first such byte stops the reading with ``not_utf8``, an
  ``InputError`` naming its byte offset and line and the ``iconv`` line that converts the file.
  A Latin-1 file is then never analysed as text it is not.
* ``"replace"``: each maximal run of bytes UTF-8 cannot read becomes one U+FFFD, as Python's
  ``bytes.decode("utf-8", "replace")`` makes it, and the scan goes on: a web crawl of 10^8
  tokens with one stray byte is still scanned. The first such byte of each file is reported
  once, as a ``ReplacedBytesWarning`` naming the file, the byte's offset and its line; the
  others in that file are replaced silently. The warning's text is kept too (``kept``, into the
  reading's ``ReadProgress.replaced``), so a scan names those files in its result
  (``ScanResult.replaced``) even where the warning is never seen.

The replacing is done by a codec error handler of our own (``HANDLER``), which counts the
replacements made in each thread (``replacements``): the reader of a file compares the count
before and after each line to see that its file held such a byte, and then finds where
(``first_bad_byte``, reading the file again up to it, once per file).
"""

from __future__ import annotations

import codecs
import re
import threading
import warnings
from pathlib import Path
from typing import Literal

from ..errors import InputError
from .packing import packing_of, unpacked

EncodingErrors = Literal["strict", "replace"]
ENCODING_ERRORS: tuple[str, ...] = ("strict", "replace")
HANDLER = "residual_stream.replace"  # the codec error handler of encoding_errors="replace"
REPLACE = "encoding_errors='replace'"  # how an error advises it (the CLI: --encoding-errors replace)
BLOCK = 1 << 20  # bytes read at a time when looking for the first bad byte

_counts = threading.local()
_SURROGATE = re.compile("[\ud800-\udfff]")


class ReplacedBytesWarning(UserWarning):
    """A corpus file held bytes that are not UTF-8, read as U+FFFD (``encoding_errors="replace"``)."""


def replacements() -> int:
    """How many runs of bytes this thread's decoding has replaced by U+FFFD so far."""
    return getattr(_counts, "n", 0)


def _replace(error: UnicodeError) -> tuple[str, int]:
    """The codec error handler ``HANDLER``: one U+FFFD for the bytes ``error`` covers, counted."""
    if not isinstance(error, UnicodeDecodeError):
        raise error  # only decoding is done with it
    _counts.n = replacements() + 1
    return "\ufffd", error.end


codecs.register_error(HANDLER, _replace)


def codec_errors(encoding_errors: EncodingErrors) -> str:
    """The ``errors=`` a file is opened with for ``encoding_errors``."""
    return HANDLER if encoding_errors == "replace" else "strict"


def first_bad_byte(path: Path) -> tuple[int, int, int] | None:
    """``(offset, line, byte)`` of the first byte of ``path`` that UTF-8 does not read there.

    Of its unpacked text for a compressed file (``packing``). Read a block at a time; a
    character cut short at the end of the file counts. None when every byte is UTF-8.
    """
    decoder, offset, line, found = codecs.getincrementaldecoder("utf-8")(), 0, 1, None
    with unpacked(path) as (f, _):
        while found is None and (block := f.read(BLOCK)):
            pending = decoder.getstate()[0]
            try:
                decoder.decode(block)
            except UnicodeDecodeError as e:
                data = pending + block
                found = offset - len(pending) + e.start, line + data[:e.start].count(b"\n"), \
                    data[e.start]
            line += block.count(b"\n")
            offset += len(block)
    cut = decoder.getstate()[0]
    if found is None and cut:  # a character cut short at the end
        found = offset - len(cut), line, cut[0]
    return found


def _where(found: tuple[int, int, int], path: Path) -> str:
    """A bad byte's place in words: ``byte 3 (line 1) is 0xe9``."""
    unpacked_text = " of its unpacked text" if packing_of(path) else ""
    return f"byte {found[0]}{unpacked_text} (line {found[1]}) is 0x{found[2]:02x}"


def not_utf8(path: Path) -> InputError:
    """The error for ``path`` holding bytes that are not UTF-8: the first one's offset and line."""
    found, packing = first_bad_byte(path), packing_of(path)
    where = "" if found is None else f": {_where(found, path)}, which UTF-8 does not read there"
    convert = f"iconv -f latin1 -t utf-8 {path.name} > utf8-{path.name}" if packing is None else \
        f"{packing.tools[0]} {path.name} | iconv -f latin1 -t utf-8 | {packing.tools[1]} > utf8-{path.name}"
    return InputError(f"{path} is not UTF-8 text{where}; convert the file to UTF-8 from the "
                      f"encoding it was written in (from Latin-1: {convert}) and give the "
                      f"converted file instead, or read such bytes as U+FFFD with {REPLACE}")


def warn_replaced(path: Path) -> str | None:
    """Warn that ``path``'s bytes that are not UTF-8 are read as U+FFFD; the warning's text.

    None, and no warning, when it has none: the count that called for this was another
    file's, decoded in this thread meanwhile.
    """
    found = first_bad_byte(path)
    if found is None:
        return None
    return _warn(f"{path} is not UTF-8 text: {_where(found, path)}; it and any others in this file are "
                 f"read as U+FFFD ({REPLACE})")


def warn_item_replaced(item: int, at: int) -> str:
    """Warn that corpus item ``item``'s lone surrogates (from character ``at``) are read as U+FFFD."""
    return _warn(f"corpus item {item} is not valid Unicode at character {at} (bytes that are not UTF-8, "
                 f"decoded with surrogateescape?); it and any others are read as U+FFFD ({REPLACE})")


def _warn(message: str) -> str:
    """Issue ``message`` as a ``ReplacedBytesWarning``; return it (``ScanResult.replaced`` keeps it).

    Its place is here, the toolkit's, as a command shows it (``bars.one_line_warnings``).
    """
    warnings.warn(message, ReplacedBytesWarning, stacklevel=1)
    return message


def kept(warning: str | None, replaced: list[str] | None) -> bool:
    """Add ``warning`` (a warning's text, or None) to ``replaced`` where given, once; was there one."""
    if warning is not None and replaced is not None and warning not in replaced:
        replaced.append(warning)
    return warning is not None


def replace_surrogates(text: str) -> str:
    """``text`` with its lone surrogates (bytes a shell decoded with ``surrogateescape``) as U+FFFD."""
    return _SURROGATE.sub("\ufffd", text)
