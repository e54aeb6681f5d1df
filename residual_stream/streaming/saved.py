"""A finished scan saved whole and loaded back: every statistic's sums, not only its frames.

``ScanResult.save("scan.pt")`` (``--out scan.pt``) writes each accumulator's state (its float64
sums, counts, histograms, top-k lists and calibration) with the scan's token and batch counts,
as ``torch.save`` of tensors, numbers, strings and lists. ``load_scan`` reads it back with
``weights_only=True`` and rebuilds every statistic's result from its accumulator, as the scan
that wrote it did: the same ``NormGrowth``, ``Survival``, ``ReadAttribution``, ``WriteSubspaces``,
lens frames and ``Composition``, which the plotting functions and the app take. No model is
needed: a scan run by ``torchrun`` on a cluster is read in a notebook. A ``.json`` scan holds the
frames alone (for any tool), so it is not loaded back.
"""

from __future__ import annotations

import io
import os
import pickle
import zipfile
from pathlib import Path

import torch

from ..errors import InputError
from .specs import make_accumulators

FORMAT = "residual-stream scan"  # a saved scan's "format" entry
VERSION = 1
SUFFIX = ".pt"


def scan_bytes(result) -> bytes:
    """``result`` (a ``ScanResult``) whole, as a saved scan's bytes (the app's download)."""
    saved = {"format": FORMAT, "version": VERSION, "model": result.model_name, "tokens": result.tokens,
             "batches": result.batches, "seconds": result.seconds,
             "resumed_tokens": result.resumed_tokens, "config": result.fingerprinted(),
             "replaced": list(result.replaced),
             "stats": {name: acc.state_dict() for name, acc in result.accumulators.items()}}
    buffer = io.BytesIO()
    torch.save(saved, buffer)
    return buffer.getvalue()


def save_scan(result, path: Path) -> Path:
    """Write ``result`` (a ``ScanResult``) whole to ``path``, atomically."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_bytes(scan_bytes(result))
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_scan(path: str | Path | io.IOBase):
    """The ``ScanResult`` saved at ``path`` (``ScanResult.save("scan.pt")``, ``--out scan.pt``).

    ``path`` may be an open binary file (the app's upload), named by its ``name``. Each
    statistic's result is rebuilt from its saved sums, equal to the one the scan returned.
    ``InputError`` for a ``.json`` scan (its frames alone: read it with ``json`` or pandas), a
    file that is not a saved scan (a scan's resumable ``--state`` included), one saved by a newer
    version, and a damaged one; nothing is written.
    """
    from .scan_result import ScanResult

    if not isinstance(path, io.IOBase):
        path = Path(path)
    name = path if isinstance(path, Path) else Path(str(getattr(path, "name", "the file")))
    if name.suffix == ".json":
        raise InputError(f"{name} is a scan's frames as JSON, which do not load back into results: "
                         f"read it with json or pandas, or save the scan as {SUFFIX} "
                         f"(scan.save('scan{SUFFIX}'), --out scan{SUFFIX}) to load it")
    saved = _read(path, name)
    if saved.get("version", 0) > VERSION:
        raise InputError(f"{name} was saved by a newer residual-stream (scan format "
                         f"{saved['version']}, this one reads {VERSION}): upgrade to load it")
    try:
        accs = make_accumulators(list(saved["stats"]))
        for spec, acc in accs.items():
            acc.load_state_dict(saved["stats"][spec])
        stats = {spec: acc.result() for spec, acc in accs.items()}
        return ScanResult(stats, int(saved["tokens"]), int(saved["batches"]), float(saved["seconds"]),
                          str(saved["model"]), accs, int(saved["resumed_tokens"]),
                          dict(saved.get("config", {})), replaced=tuple(map(str, saved.get("replaced", ()))))
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - a missing sum, a wrong shape or type
        raise InputError(f"{name} is a damaged saved scan ({type(e).__name__}: {e}); save it "
                         "again from its scan") from None


def _read(path: Path | io.IOBase, name: Path) -> dict:
    """The dict saved at ``path`` (called ``name``), or ``InputError`` saying what it is instead."""
    try:
        saved = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise InputError(f"no saved scan at {name}: give the file a scan wrote "
                         f"(scan.save('scan{SUFFIX}'), --out scan{SUFFIX})") from None
    except IsADirectoryError:
        raise InputError(f"{name} is a folder: give the file a scan wrote") from None
    except (pickle.UnpicklingError, zipfile.BadZipFile, RuntimeError, EOFError, ValueError) as e:
        raise InputError(f"{name} is not a saved scan, or a damaged one ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:200]})") from None
    if isinstance(saved, dict) and saved.get("format") == FORMAT:
        return saved
    if isinstance(saved, dict) and {"config", "next", "stats"} <= saved.keys():
        raise InputError(f"{name} is a scan's resumable state (--state), not a saved scan: resume the "
                         "scan with it, and save the result with --out scan.pt")
    raise InputError(f"{name} is not a saved scan (a torch file of something else): give the file a "
                     f"scan wrote (scan.save('scan{SUFFIX}'), --out scan{SUFFIX})")
