"""A basis of one's own for a scan's ``subspaces``: directions as rows, named by a fingerprint.

``rs.write_subspaces(trace, basis=rows)`` measures each write's energy fraction in a subspace of the
user's (probe directions, an SAE's decoder rows, a steering vector); ``subspaces:basis=…`` does the
same over a corpus. The rows ``[k, d_model]`` come as a tensor, an array or nested lists, or a
mapping of names to such rows, each measured on its own (Python); or as a file (Python and the
command line): a ``.pt`` or ``.pth`` file holding a tensor or a dict of them (read with
``weights_only=True``), a ``.npy`` array (no pickles) or a ``.safetensors`` file. A file holding one
tensor is the basis (the subspace ``basis``); one holding several gives a subspace per tensor,
named by its key (``basis:KEY``), in the order of a ``.pt`` file's dict, or by name for safetensors.

A statistic's spec keys its results, its saved state and a merge, so it names the basis by a
fingerprint of its values (``fingerprint``: the first 12 hex digits of the sha256 of each subspace's
name, shape and float32 bytes, in order), not by a path: ``subspaces:basis=probe.pt`` is
``subspaces:basis=3f09c2…`` once made. The same directions in a copy of the file resume a scan and
merge with it; other directions never do. The spec alone (a saved scan's) holds no directions: the
accumulator takes them from the state it loads (``meta["basis"]``), whose fingerprint must match.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Mapping
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

from ..analyses.subspaces import named_bases
from ..errors import InputError

FINGERPRINT = re.compile(r"[0-9a-f]{12}")  # what a spec's basis= holds once made
FILES = (".pt", ".pth", ".npy", ".safetensors")
Basis = Tensor | dict[str, Tensor]  # rows [k, d_model], or rows by name (each its own subspace)


def fingerprint(basis: Basis) -> str:
    """The first 12 hex digits of the sha256 of each subspace's name, shape and float32 values, in order.

    In order: the subspaces are measured (and an ordered split is made) in it, so two orders are two bases.
    """
    digest = hashlib.sha256()
    for name, rows in named_bases(basis).items():
        rows = rows.detach().to("cpu", torch.float32).contiguous()
        digest.update(f"{name}\0{tuple(rows.shape)}\0".encode() + rows.numpy().tobytes())
    return digest.hexdigest()[:12]


def resolve(basis: object) -> tuple[str, Basis | None]:
    """``(fingerprint, basis)`` of ``basis`` as float32 CPU tensors; ``("", None)`` for none.

    ``basis``: rows (a tensor, an array, nested lists) or a mapping of names to rows
    (``analyses.subspaces.named_bases``), a file of them (``FILES``), or a fingerprint alone (a
    spec read back: its rows come from a loaded state, so None here). ``InputError`` for anything
    else, a file that cannot be read, and rows that are not 2-D, finite and not all zero (as
    ``write_subspaces`` checks them).
    """
    if basis is None or (isinstance(basis, str) and not basis):
        return "", None
    if isinstance(basis, str) and FINGERPRINT.fullmatch(basis) and not Path(basis).exists():
        return basis, None
    checked = load_basis(basis) if isinstance(basis, (str, Path, io.IOBase)) else _checked(basis)
    return fingerprint(checked), checked


def load_basis(source: str | Path | io.IOBase) -> Basis:
    """The basis a file holds (a path, or an open binary file), checked as ``resolve`` checks one."""
    opened = isinstance(source, io.IOBase)
    loaded = read_rows(source if opened else Path(source))  # its errors name the file
    try:
        return _checked(loaded)
    except InputError as e:
        raise InputError(f"{getattr(source, 'name', 'the file') if opened else source}: {e}") from None


def _checked(basis: object, d: int | None = None) -> Basis:
    """``basis`` as float32 CPU rows, or rows by name, each checked (``named_bases``; ``d`` wide if given)."""
    bases = named_bases(basis, d)
    if not isinstance(basis, Mapping):
        return bases["basis"].detach().cpu()
    return {name: bases[f"basis:{name}"].detach().cpu() for name in basis}


def read_rows(path: Path | io.IOBase) -> object:
    """The array a basis file holds, or its tensors by name where it holds several.

    ``InputError`` for a missing, damaged or other file. ``path`` may be an open binary file (the
    app's upload), named by its ``name``.
    """
    opened = isinstance(path, io.IOBase)
    name = Path(str(getattr(path, "name", "the file"))) if opened else path
    if name.suffix not in FILES:
        raise InputError(f"basis file {name} is not one of {', '.join(FILES)}: save the rows "
                         "[k, d_model] with torch.save, numpy.save or safetensors")
    if not opened and not path.is_file():
        raise InputError(f"no basis file at {path}: give the file of directions [k, d_model]")
    try:
        if name.suffix == ".npy":
            return np.load(path, allow_pickle=False)
        if name.suffix == ".safetensors":
            from safetensors.torch import load

            return _one_or_named(dict(sorted(load(path.read() if opened else path.read_bytes()).items())))
        return _one_or_named(torch.load(path, map_location="cpu", weights_only=True))
    except InputError:
        raise
    except Exception as e:  # noqa: BLE001 - each format's own errors for a damaged file
        raise InputError(f"basis file {name} cannot be read ({type(e).__name__}: "
                         f"{str(e).splitlines()[0][:160] if str(e) else ''}): save the rows again") from None


def _one_or_named(loaded: object) -> object:
    """A file's tensor: the one it holds, or its tensors by name where a dict holds several.

    In the dict's order: a ``.pt`` file's as saved, a safetensors file's by name (it keeps none).
    """
    return next(iter(loaded.values())) if isinstance(loaded, dict) and len(loaded) == 1 else loaded


def rows_for(model, wanted: str, given: Basis | None, saved: object) -> Basis:
    """The basis a scan of ``model`` measures against: the ``given`` one, else a loaded state's (``saved``).

    ``InputError`` for a fingerprint without rows (a spec read back, and no state holding them),
    rows saved under another fingerprint, and rows of another width than the stream's.
    """
    rows = given if given is not None else saved
    if rows is None:
        raise InputError(f"subspaces: basis={wanted} names a basis by its fingerprint, and no saved "
                         f"state holds its rows: give the directions (a tensor, or a {'/'.join(FILES)} file)")
    if fingerprint(rows) != wanted:
        raise InputError(f"subspaces: the saved basis is not basis={wanted} (its fingerprint is "
                         f"{fingerprint(rows)}): scan again")
    try:
        return _checked(rows, model.anatomy.d_model)
    except InputError as e:
        raise InputError(f"subspaces: {e} ({model.name}'s stream is {model.anatomy.d_model} wide)") from None
