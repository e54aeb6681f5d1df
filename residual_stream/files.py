"""Files the library writes and checks.

Whether a path can be written, the permissions a file gets, and the hash that names (the
GGUF float cache) or checks (a twin's weights) one.
"""

from __future__ import annotations

import hashlib
import os
import stat
from pathlib import Path

from .errors import InputError


def look_up(path: Path, what: str) -> os.stat_result | None:
    """``path``'s status, or None when nothing is there.

    ``InputError`` naming ``what`` when the system cannot look (a name over 255 bytes, a
    folder on the way that cannot be read, a loop of links, a NUL byte), where
    ``Path.exists`` raises some of these as a bare ``OSError`` and reads others as absent.
    """
    try:
        return path.stat()
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        why = getattr(e, "strerror", None) or str(e)
        raise InputError(f"{what} {str(path)[:120]!r}{'…' if len(str(path)) > 120 else ''} cannot "
                         f"be looked up ({why}): give a usable path") from None


def path_kind(path: Path, what: str) -> str | None:
    """``"folder"``, ``"file"`` (a regular one) or None (nothing there) for ``path``, from one ``look_up``.

    Anything else is named in words (``"a named pipe (FIFO)"``, ``"a socket"``, ``"a device"``):
    not a file to read, since a FIFO blocks its reader and none can be read twice.
    """
    found = look_up(path, what)
    if found is None:
        return None
    mode = found.st_mode
    if stat.S_ISDIR(mode) or stat.S_ISREG(mode):
        return "folder" if stat.S_ISDIR(mode) else "file"
    if stat.S_ISFIFO(mode):
        return "a named pipe (FIFO)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) else "a special file"


def writable(path: Path) -> None:
    """``InputError`` unless ``path`` can be written as a file: checked before any work."""
    look_up(path, "the file")
    parent = path.resolve().parent
    if path.is_dir():
        raise InputError(f"cannot write {path}: it is a folder; give a file name")
    if not parent.is_dir() or not os.access(parent, os.W_OK):
        raise InputError(f"cannot write {path}: {parent} is not a writable folder")


def not_an_input(outputs: dict[str, Path | None], inputs: dict[str, Path | str | None]) -> None:
    """``InputError`` where an output file is one of the inputs or another output: checked before any work.

    Keys are the options' names (``"--out"``), as the message gives them. An input that is no
    existing path (``"builtin"``, a text given inline) is passed over; one reached through
    another name (a link, ``./``) is still the same file.
    """
    named = [(k, Path(v)) for k, v in inputs.items() if v is not None and _exists(Path(v))]
    seen: list[tuple[str, Path]] = []
    for key, out in ((k, v) for k, v in outputs.items() if v is not None):
        for other, path in named + seen:
            same = out.resolve() == path.resolve() or out.exists() and os.path.samefile(out, path)
            if same:
                what = "read" if (other, path) in named else "written"
                raise InputError(f"{key} {out} is the file {other} names, which is {what} by this "
                                 f"command: writing there would overwrite it; give {key} another name")
        seen.append((key, out))


def _exists(path: Path) -> bool:
    """Whether ``path`` names something: False, not an error, for a name too long to be a path."""
    try:
        return path.exists()
    except OSError:
        return False


def usual_permissions(path: Path) -> None:
    """Give ``path`` the permissions a new file gets here (0666 less the umask).

    ``safetensors`` creates its files readable by their owner only (0600), unlike every
    other file the library writes: a twin or a trace's statistics shared on a machine could
    not be read by the others.
    """
    os.chmod(path, 0o666 & ~_umask())


def _umask() -> int:
    """This process's umask, read where Linux shows it.

    Elsewhere set and restored (which changes it for every thread for a moment).
    """
    try:
        status = Path("/proc/self/status").read_text()
        return int(next(line.split()[1] for line in status.splitlines() if line.startswith("Umask:")), 8)
    except (OSError, StopIteration, ValueError, IndexError):
        mask = os.umask(0)
        os.umask(mask)
        return mask


def sha256(path: Path) -> str:
    """The SHA-256 of ``path``'s bytes (hex), read 4 MiB at a time."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            digest.update(block)
    return digest.hexdigest()
