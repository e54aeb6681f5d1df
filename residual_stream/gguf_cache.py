"""GGUF files: dequantized once into a cached safetensors folder, keyed by the file's sha256.

``loading`` loads that folder as any other; the copy is checked (finite weights, none
missing) before it is written, written to a temporary folder and renamed into place, and
made again when it is found damaged.

transformers reads a GGUF file three times to make that copy (the config, the weights, the
tokenizer: ``load_gguf_checkpoint``, each parsing every metadata field with ``gguf.GGUFReader``,
4 s for SmolLM2's 49,152-token vocabulary on 2 CPU cores) and builds gguf's table of tensor names
once per module (``gguf.get_tensor_name_map``, 397 times for SmolLM2). Both give read-only
objects that depend on their arguments alone, so ``reads_once`` lets the three readings share
one parse and the modules one table: SmolLM2's first load went from 17.8–25.6 s to 9.6 s
(``benchmarks/gguf_first_load.py``), with every tensor, the config and the tokenizer equal.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from torch import nn

from .architectures import describe, has_lm_head
from .bars import gguf_bar
from .errors import CorruptModelFileError, UnsupportedArchitectureError
from .files import sha256
from .integrity import refuse_missing, refuse_non_finite, validate_safetensors


def cache_root() -> Path:
    """The package's cache folder: ``$RESIDUAL_STREAM_CACHE``, default ``~/.cache/residual_stream``."""
    return Path(os.environ.get("RESIDUAL_STREAM_CACHE", "~/.cache/residual_stream")).expanduser()


def gguf_cache(path: Path, progress: bool) -> Path:
    """A dequantized safetensors copy of a GGUF file, made once and keyed by its sha256."""
    with open(path, "rb") as fh:
        if fh.read(4) != b"GGUF":
            raise CorruptModelFileError(f"{str(path)!r} is not a GGUF file (bad magic bytes)")
    target = cache_root() / "gguf" / sha256(path)[:24]
    if (target / "config.json").exists():
        try:
            validate_safetensors(target)
            return target
        except CorruptModelFileError as e:  # the cache is ours: made again, not a dead end
            print(f"residual-stream: the cached copy is damaged ({e}); making it again",
                  file=sys.stderr, flush=True)
            shutil.rmtree(target, ignore_errors=True)
    if progress:
        print(f"residual-stream: first load of {path.name}: dequantizing (about 10 s); the float "
              f"copy is cached in {target}", file=sys.stderr, flush=True)
    with gguf_bar(progress), reads_once():  # (the bar's lock: loads of GGUF files take turns)
        model, tok, missing = from_gguf(path)
    refuse_non_finite(model, str(path))  # before the copy: a refused model leaves no cache
    refuse_missing(model, describe(model, has_lm_head=has_lm_head(model)), missing, str(path))
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".partial-"))
    try:
        save_float_copy(model, tok, tmp)
        os.replace(tmp, target)
    except BaseException as e:  # interrupted or failed: no partial copy is left behind
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(e, OSError) or not (target / "config.json").exists():
            raise  # (an OSError with the target there: another process made it first)
    if progress:
        print("residual-stream: cached.", file=sys.stderr, flush=True)
    return target


def rebuilt_copy(path: Path, folder: Path, error: str, progress: bool) -> Path:
    """The copy of GGUF file ``path`` made again, after its cached ``folder`` failed to load (``error``).

    The copy is keyed by the GGUF's hash, so nothing else would repair it (re-downloading the GGUF
    finds the same folder); the GGUF is read again and checked (``gguf_cache``), so a GGUF that is
    itself damaged is named as such.
    """
    print(f"residual-stream: the cached copy does not load ({error}); making it again from {path.name}",
          file=sys.stderr, flush=True)
    shutil.rmtree(folder, ignore_errors=True)
    return gguf_cache(path, progress)


def save_float_copy(model: nn.Module, tok: object, folder: Path) -> None:
    """Save a dequantized model as safetensors + config (``save_pretrained`` refuses GGUF-loaded models)."""
    import copy

    from safetensors.torch import save_model

    config = copy.deepcopy(model.config)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.architectures = [type(model).__name__]
    config.save_pretrained(folder)
    save_model(model, str(folder / "model.safetensors"), metadata={"format": "pt"})
    tok.save_pretrained(folder)


@contextlib.contextmanager
def reads_once() -> Iterator[None]:
    """While a GGUF file is dequantized, its three readings share one parse (see the module docstring).

    ``gguf``'s names ``GGUFReader`` and ``get_tensor_name_map``, which transformers imports at each
    call, are swapped for memoized ones (keyed by their arguments) and put back on exit, however the
    load ends; the parsed files are let go then. Held inside ``gguf_bar``'s lock, so two loads do not
    interleave their swaps. A ``gguf`` without either name is left as it is.
    """
    import gguf

    reader_cls, name_map = getattr(gguf, "GGUFReader", None), getattr(gguf, "get_tensor_name_map", None)
    if reader_cls is None or name_map is None:
        yield
        return
    readers: dict = {}

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader_cls(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = reader, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader_cls, name_map


def from_gguf(path: Path):
    """Dequantize a GGUF file with transformers: (float32 model, tokenizer, missing weights' names).

    An architecture transformers cannot read is ``UnsupportedArchitectureError``; anything
    else that fails is ``CorruptModelFileError``.
    """
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        model, info = AutoModelForCausalLM.from_pretrained(
            path.parent, gguf_file=path.name, dtype=torch.float32, local_files_only=True,
            output_loading_info=True)
        tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name, local_files_only=True)
    except Exception as e:  # gguf raises ValueError, struct.error, KeyError, IndexError ...
        if isinstance(e, ValueError) and "is not supported yet" in str(e):  # transformers' words
            raise UnsupportedArchitectureError(
                f"{str(path)!r} is a well-formed GGUF file, but transformers cannot read its "
                f"architecture ({str(e).splitlines()[0][:200]}); see rs.list_models() and the "
                "README for the supported families, or convert the model to a Hugging Face "
                "folder of a supported one") from e
        raise CorruptModelFileError(
            f"could not read GGUF file {str(path)!r} ({type(e).__name__}: "
            f"{str(e).splitlines()[0][:200] if str(e) else ''}); it is corrupt or truncated: "
            "reinstall or re-download it") from e
    return model, tok, info.get("missing_keys", ())
