"""What a loaded model must be before anything reads it.

Whole files, every weight it uses loaded and finite, a tokenizer that works.

``transformers`` loads a checkpoint that lacks a tensor by initializing it at random, with a
table on stderr as the only sign, and a folder without its tokenizer files as a tokenizer of
its few special tokens (every word ``[UNK]``). Either would give every analysis garbage that
conserves exactly, so ``loading`` refuses both here, naming what is missing.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from .anatomy import Anatomy
from .devices import embeddings
from .errors import CorruptModelFileError

TOKENIZER_PROBE = "The residual stream is read and written by every layer."
MIN_VOCAB_SHARE = 0.5  # a tokenizer with under half the model's vocabulary lacks its files


def validate_safetensors(folder: Path) -> None:
    """``CorruptModelFileError`` for a damaged ``*.safetensors`` file in ``folder``.

    An unreadable header or tensor shape, or data cut short (``check_safetensors_size``).
    """
    from safetensors import safe_open

    for f in sorted(folder.glob("*.safetensors")):
        try:
            with safe_open(str(f), framework="pt") as st:
                for key in st.keys():
                    st.get_slice(key).get_shape()
                size = f.stat().st_size
            check_safetensors_size(f, size)
        except CorruptModelFileError:
            raise
        except Exception as e:  # safetensors raises its own SafetensorError
            raise CorruptModelFileError(
                f"{f.name} in {str(folder)!r} is corrupt or truncated ({e}); re-download it") from e


def check_safetensors_size(f: Path, size: int) -> None:
    """The header's last data offset must fit in the file (catches truncation)."""
    with open(f, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    end = max((v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end > size:
        raise CorruptModelFileError(
            f"{f.name} is truncated: its header needs {8 + n + end} bytes, the file has {size}; "
            "re-download it")


def refuse_non_finite(module: nn.Module, source: str,
                      advice: str = "the file is corrupt: re-download or reinstall it") -> None:
    """``CorruptModelFileError`` naming the first parameter holding NaN or inf.

    One fused norm of every parameter first (a few kernels, one sync); the search for the
    first bad one only when that is not finite (or overflows). Offloaded (``meta``) weights
    are not here to check; they are checked on use.
    """
    params = [(n, p.detach()) for n, p in module.named_parameters()
              if p.is_floating_point() and p.device.type != "meta"]
    if len({p.device for _, p in params}) == 1 and \
            bool(torch.nn.utils.get_total_norm([p for _, p in params]).isfinite()):
        return
    for pname, p in params:
        if not bool(torch.isfinite(p).all()):
            raise CorruptModelFileError(
                f"weights of {source!r} contain NaN or inf (first in {pname}); {advice}")


def refuse_missing(module: nn.Module, anatomy: Anatomy, missing: Iterable[str], source: str) -> None:
    """``CorruptModelFileError`` when a weight the stream uses was not in the checkpoint.

    ``missing``: ``from_pretrained``'s ``missing_keys`` (initialized at random). A key is used
    when it lies in a module the anatomy names (blocks, embeddings, norms, the LM head's
    transform, the map into the unembedding and a bias beside it) or is the input embedding's
    (which OPT-350m's named embedding, ``project_in``, reads) or the unembedding's; others
    (BERT's pooler) never reach the stream.
    """
    p = anatomy.modules
    used = [*p.layers, *p.embeds.values(), *p.norms.values(),
            *(s for s in p.lm_head or () if not s.startswith("act:")),
            *filter(None, [p.unembed_in, p.unembed_bias])]
    ends = [embeddings(module, e) for e in ("input", "output")]
    used += [name for name, m in module.named_modules() if any(m is e for e in ends if e is not None)]
    bad = sorted(k for k in missing if any(k == u or k.startswith(u + ".") for u in used))
    if bad:
        more = f" and {len(bad) - 3} more" if len(bad) > 3 else ""
        raise CorruptModelFileError(
            f"the checkpoint of {source!r} lacks {len(bad)} weight(s) the model uses "
            f"({', '.join(bad[:3])}{more}): transformers would fill them at random. The file is "
            "incomplete or its config.json describes a larger model: re-download it")


def refuse_extra_layers(anatomy: Anatomy, unexpected: Iterable[str], source: str) -> None:
    """``CorruptModelFileError`` when the checkpoint holds blocks past the config's last.

    ``unexpected``: ``from_pretrained``'s ``unexpected_keys`` (weights it did not use). A
    ``config.json`` listing fewer layers than the checkpoint loaded a truncated model.
    """
    last = anatomy.modules.layers[-1]
    prefix = last.rstrip("0123456789")  # "model.layers."
    extra = sorted({k[len(prefix):].split(".")[0] for k in unexpected if k.startswith(prefix)},
                   key=lambda i: (len(i), i))
    if extra:
        raise CorruptModelFileError(
            f"the checkpoint of {source!r} holds blocks {', '.join(extra[:3])}"
            f"{'…' if len(extra) > 3 else ''} past the {anatomy.n_layers} its config.json lists: "
            "fix the config's layer count or re-download the model")


def check_tokenizer(tokenizer, vocab_size: int | None, source: str) -> None:
    """``CorruptModelFileError`` for a tokenizer that cannot be the model's.

    It raises on a probe text, gives nothing or only its unknown token for it, or holds under
    ``MIN_VOCAB_SHARE`` of the model's vocabulary (its files are missing: what is left is
    its special tokens).
    """
    advice = (f"the tokenizer of {source!r} is broken or its files are missing "
              "(tokenizer.json, vocab.txt, tokenizer.model …): re-download or reinstall it")
    try:
        ids = tokenizer(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"]
    except Exception as e:  # noqa: BLE001 - tokenizers raise plain Exceptions
        raise CorruptModelFileError(f"{advice} ({type(e).__name__}: {e})") from e
    unk = getattr(tokenizer, "unk_token_id", None)
    if not ids or all(i == unk for i in ids):
        raise CorruptModelFileError(f"{advice} (a probe text gives {len(ids)} token(s), all unknown)")
    size = len(tokenizer) if hasattr(tokenizer, "__len__") else None
    if size is not None and vocab_size and size < MIN_VOCAB_SHARE * vocab_size:
        raise CorruptModelFileError(f"{advice} (it has {size} tokens; the model has {vocab_size})")
