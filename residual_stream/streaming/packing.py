"""How a corpus file is compressed: named by its last suffix, read as it streams, never unpacked to disk.

``.gz`` (gzip: C4, Dolma), ``.xz``, ``.bz2`` and ``.zst`` (zstd: The Pile's and SlimPajama's JSON
Lines) after ``.txt``, ``.jsonl`` or ``.json`` (``PACKINGS``). zstd is read through the
``zstandard`` package, every frame of a file in turn. A file's first bytes tell how it is
really compressed (``packed_by``): a file compressed one way and named another, or compressed by
a tool no corpus is read through (zip, 7z), is refused by ``sources`` with what to do.

``unpacked`` opens a file as its unpacked bytes together with the file itself, whose position
(the compressed bytes read so far) is what a progress estimate reads (``progress``);
``unpacked_head`` unpacks a file's first bytes for that estimate's prior (``sources.chars_per_byte``).
"""

from __future__ import annotations

import bz2
import contextlib
import gzip
import io
import lzma
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from ..errors import InputError

BLOCK = 1 << 17  # compressed bytes read at a time from a .zst file


class _ZstdFrames(io.RawIOBase):
    """The zstd frames of ``raw`` unpacked in turn, as ``zstd -dc`` reads a file.

    ``EOFError`` where the file ends inside a frame: ``zstandard``'s own stream reader ended
    there quietly, so a file cut short read as a shorter corpus.
    """

    def __init__(self, raw: io.IOBase, zstandard) -> None:
        super().__init__()
        self.raw, self.zstandard, self.frame = raw, zstandard, None
        self.out, self.at = b"", 0  # unpacked bytes not yet read, from ``at``

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        """Unpacked bytes into ``buffer``; 0 at the end of the file, once its last frame has ended."""
        while self.at == len(self.out):
            packed = self.raw.read(BLOCK)
            if not packed:
                if self.frame is not None and not self.frame.eof:
                    raise EOFError("Compressed file ended before the end of its last frame")
                return 0
            self.out, self.at = b"", 0
            while packed:
                if self.frame is None or self.frame.eof:
                    self.frame = self.zstandard.ZstdDecompressor().decompressobj()
                self.out += self.frame.decompress(packed)
                packed = self.frame.unused_data if self.frame.eof else b""
        n = min(len(buffer), len(self.out) - self.at)
        buffer[:n] = self.out[self.at:self.at + n]
        self.at += n
        return n


def _zstd_module():
    """``zstandard``, or ``InputError`` saying what to install."""
    try:
        import zstandard
    except ImportError:
        raise InputError("reading a .zst corpus file needs the zstandard package: pip install "
                         "zstandard (or unpack it: zstd -d FILE)") from None
    return zstandard


def _zstd(raw: io.IOBase) -> io.IOBase:
    """A zstd stream over ``raw``, every frame in turn (``_ZstdFrames``), buffered."""
    return io.BufferedReader(_ZstdFrames(raw, _zstd_module()), BLOCK)


def _zstd_errors() -> tuple[type[BaseException], ...]:
    try:
        import zstandard
    except ImportError:
        return ()
    return (zstandard.ZstdError, EOFError)


@dataclass(frozen=True)
class Packing:
    """One compression: its name, file suffix, first bytes, reader and the errors of a damaged file.

    ``tools``: the shell commands that unpack to stdout and pack from stdin (an error's advice).
    """

    name: str
    suffix: str
    magic: bytes
    open: Callable[[io.IOBase], io.IOBase]
    damaged: Callable[[], tuple[type[BaseException], ...]]
    tools: tuple[str, str]
    decompressor: Callable[[], object]  # an incremental one: ``.decompress(bytes) -> bytes``, ``.eof``


PACKINGS = (
    Packing("gzip", ".gz", b"\x1f\x8b", lambda raw: gzip.GzipFile(fileobj=raw),
            lambda: (gzip.BadGzipFile, EOFError, zlib.error), ("gunzip -c", "gzip"),
            lambda: zlib.decompressobj(wbits=31)),  # a gzip header
    Packing("xz", ".xz", b"\xfd7zXZ\x00", lzma.LZMAFile, lambda: (lzma.LZMAError, EOFError),
            ("xz -dc", "xz"), lzma.LZMADecompressor),
    Packing("bzip2", ".bz2", b"BZh", bz2.BZ2File, lambda: (OSError, EOFError), ("bzip2 -dc", "bzip2"),
            bz2.BZ2Decompressor),
    Packing("zstd", ".zst", b"\x28\xb5\x2f\xfd", _zstd, _zstd_errors, ("zstd -dc", "zstd"),
            lambda: _zstd_module().ZstdDecompressor().decompressobj()),
)
SUFFIXES = tuple(p.suffix for p in PACKINGS)
OTHERS = {b"PK\x03\x04": "zip", b"7z\xbc\xaf\x27\x1c": "7z"}  # compressed, but read by none of these


def packing_of(path: Path) -> Packing | None:
    """The packing ``path``'s name says (its last suffix), or None for a plain file."""
    return next((p for p in PACKINGS if path.name.endswith(p.suffix)), None)


def packed_by(head: bytes) -> str | None:
    """The compression a file's first bytes show (a ``PACKINGS`` name, zip or 7z), or None."""
    for p in PACKINGS:
        if head.startswith(p.magic) and (p.name != "bzip2" or head[4:10] == b"1AY&SY"):  # its block too
            return p.name
    return next((name for magic, name in OTHERS.items() if head.startswith(magic)), None)


@contextlib.contextmanager
def unpacked(path: Path) -> Iterator[tuple[io.IOBase, io.IOBase]]:
    """``(unpacked bytes, the file)`` of ``path``: the same stream twice for a plain file."""
    packing = packing_of(path)
    with open(path, "rb") as raw:
        if packing is None:
            yield raw, raw
            return
        stream = packing.open(raw)
        try:
            yield stream, raw
        finally:
            stream.close()


PROBE_CHUNK = 1 << 12  # compressed bytes fed at a time to a probe's decompressor
PROBE_OUT = 1 << 23  # unpacked bytes a probe stops at (a repetitive file unpacks a thousandfold)


def unpacked_head(path: Path, head: bytes) -> tuple[bytes, int] | None:
    """``(unpacked bytes, compressed bytes they took)`` of ``head``, a compressed file's first bytes.

    Fed ``PROBE_CHUNK`` bytes at a time until ``PROBE_OUT`` bytes come out, the stream ends or
    ``head`` is spent. The input taken is counted to the last chunk that brought output: a
    decompressor keeps what it has not used to itself, and zstd and bzip2 give a block's output
    only once the block is whole (counting every byte fed put zstd's probe 3.8 % low). ``head``
    itself for a plain file; None for one that does not unpack (its reading says why).
    """
    packing = packing_of(path)
    if packing is None:
        return head, len(head)
    try:
        unpack, out, fed, taken = packing.decompressor(), [], 0, 0
        while fed < len(head) and sum(map(len, out)) < PROBE_OUT and not getattr(unpack, "eof", False):
            out.append(unpack.decompress(head[fed:fed + PROBE_CHUNK]))
            fed = min(fed + PROBE_CHUNK, len(head))
            taken = fed if out[-1] else taken
    except (InputError, *packing.damaged(), ValueError, RuntimeError):
        return None
    return b"".join(out), taken


def damaged_errors(path: Path) -> tuple[type[BaseException], ...]:
    """The exceptions by which reading ``path`` through its packing says it is damaged (none if plain)."""
    packing = packing_of(path)
    return () if packing is None else packing.damaged()


def damaged(path: Path, error: BaseException) -> InputError:
    """The error for a compressed file that cannot be read whole (cut short, not what its name says)."""
    packing = packing_of(path)
    return InputError(f"{path} is not a complete {packing.name} file ({type(error).__name__}: {error}); "
                      "unpack it, or fix its name")
