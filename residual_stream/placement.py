"""A load's ``device_map`` and ``offload_folder``: checked before a file is read, their failures named.

``check_offload_folder`` refuses, before loading, an ``offload_folder`` that cannot be a folder
(``devices.check_device_map`` the map itself); ``placement_error`` turns a failure of accelerate's or
transformers' placement (a module no entry maps, an offload folder that cannot be made) into an
``InputError`` saying what to change, where it would otherwise read as a corrupt model file.
``named_placement`` refuses a ``device_map`` key that names no module of the model (accelerate
ignored it). ``moved`` names a device's memory running out as the model is moved there whole.
``offload_missing`` puts the weights a checkpoint lacks (transformers initializes them; the stream
never reads them, or ``integrity.refuse_missing`` refused the load) into accelerate's map where
their module is offloaded: accelerate's map of a safetensors checkpoint holds only the file's
tensors, so the first forward pass failed on them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import nn

from .devices import MAP_ADVICE
from .errors import InputError

MAP_HINT = f"; if it loads without device_map, the map is at fault: {MAP_ADVICE}"


def check_offload_folder(offload_folder: object) -> None:
    """``InputError`` for an ``offload_folder`` that is no folder.

    The folder need not exist (accelerate makes it); a path to a file, or not a path at all, is refused.
    """
    if offload_folder is None:
        return
    if not isinstance(offload_folder, str | os.PathLike) or not str(offload_folder).strip():
        raise InputError(f"offload_folder is the path of a folder for the weights mapped to 'disk', "
                         f"not {offload_folder!r}")
    path = Path(offload_folder).expanduser()
    if path.exists() and not path.is_dir():
        raise InputError(f"offload_folder {str(offload_folder)!r} is a file: give the path of a folder "
                         "(it is made if missing) for the weights mapped to 'disk'")


def placement_error(error: BaseException, folder: Path, placement: dict) -> InputError | None:
    """The ``InputError`` a failed load of ``folder`` is, or None where the model's files are at fault.

    Too little memory, or a failure of ``placement`` (``from_pretrained``'s ``device_map`` and
    ``offload_folder``): a module no entry maps, an offload folder that cannot be made or written.
    """
    if isinstance(error, MemoryError | torch.OutOfMemoryError):
        return InputError(f"not enough memory to load the model in {str(folder)!r} ({type(error).__name__}): "
                          "load it in a smaller dtype ('bfloat16'), or with device_map='auto', which "
                          "offloads what does not fit to the CPU and disk")
    if not placement:
        return None
    device_map, offload = placement.get("device_map"), placement.get("offload_folder")
    text = str(error).splitlines()[0][:300] if str(error) else type(error).__name__
    if isinstance(error, ValueError) and "device_map provided does not give any device" in text:
        # accelerate's check_device_map and transformers' own: the model's parameters no entry covers
        unplaced = text.rsplit(":", 1)[-1].strip()
        return InputError(f"device_map {device_map!r} gives no device for {unplaced}: {MAP_ADVICE}")
    if offload is not None and isinstance(error, OSError) and error.filename is not None:
        target, where = Path(os.fspath(error.filename)).resolve(), Path(offload).expanduser().resolve()
        if target == where or where in target.parents:
            return InputError(f"offload_folder {str(offload)!r} cannot be made or written "
                              f"({type(error).__name__}: {error.strerror or text}): give a folder "
                              "this process can write, with room for the weights mapped to 'disk'")
    return None


def named_placement(placement: dict, cls: type, config: object) -> dict:
    """``placement``, once each key of its ``device_map`` dict names a module or weight of ``cls(config)``.

    A key naming nothing (a typo, ``encoder.layers.0`` for ``encoder.layer.0``) was ignored by
    accelerate, and its module placed by another entry (``""``) without a word. The model is
    built on ``meta`` to list its names (no memory, no weights read); where it cannot be, the
    load itself says what is wrong.
    """
    device_map = placement.get("device_map")
    if not isinstance(device_map, dict) or set(device_map) <= {""}:
        return placement
    from accelerate import init_empty_weights

    try:
        with init_empty_weights():
            skeleton = (getattr(cls, "from_config", None) or cls._from_config)(config)
    except Exception:  # noqa: BLE001 - remote code, a config its class refuses: the load names it
        return placement
    names = {n for kind in ("modules", "parameters", "buffers")
             for n, _ in getattr(skeleton, f"named_{kind}")()}
    unknown = [k for k in device_map if k and k not in names]
    if unknown:
        top = ", ".join(n for n, _ in skeleton.named_children())
        raise InputError(f"device_map names {', '.join(map(repr, unknown[:3]))}, which "
                         f"{'is' if len(unknown) == 1 else 'are'} no module of {type(skeleton).__name__} "
                         f"(its modules: {top}, and the modules inside them): {MAP_ADVICE}")
    return placement


def moved(model: nn.Module, device: torch.device, folder: Path) -> nn.Module:
    """``model`` moved to ``device``; ``placement_error``'s ``InputError`` where its memory runs out.

    The parameters moved before the failure are moved back to the CPU first, so the device's
    memory is given back (the error's traceback holds the model).
    """
    try:
        return model.to(device)
    except (MemoryError, torch.OutOfMemoryError) as e:
        model.to("cpu")
        if device.type == "cuda":
            torch.cuda.empty_cache()
        raise placement_error(e, folder, {}) from e


def offload_missing(model: nn.Module, missing: Iterable[str]) -> None:
    """Put the missing weights of offloaded modules in accelerate's map, initialized as transformers does.

    ``missing``: ``from_pretrained``'s ``missing_keys``. transformers initializes them, then accelerate
    moves an offloaded module's tensors to ``meta`` and reads them back, on each pass, from a map of the
    checkpoint's own tensors, which lacks them. Each is initialized again here by the model's
    ``_init_weights`` (as a load onto one device does) and kept in the map's CPU memory. A weight
    tied to another (read from the other's entry) is left alone.
    """
    tied = getattr(model, "all_tied_weights_keys", None) or {}
    for key in missing:
        owner_name, _, attr = key.rpartition(".")
        try:
            owner = model.get_submodule(owner_name)
        except AttributeError:
            continue
        tensor = owner._parameters.get(attr)
        loader = _offload_map(model, owner_name)
        if tensor is None or tensor.device.type != "meta" or loader is None or key in tied \
                or key in loader.state_dict or key in loader.index:
            continue
        value = nn.Parameter(torch.zeros(tensor.shape, dtype=tensor.dtype), requires_grad=False)
        owner._parameters[attr] = value
        try:
            if hasattr(model, "_init_weights"):
                model._init_weights(owner)  # its loaded tensors are on meta: untouched
        finally:
            owner._parameters[attr] = tensor
        loader.state_dict[key] = value.data
        loader.all_keys.append(key)


def _offload_map(model: nn.Module, module_name: str):
    """The ``OffloadedWeightsLoader`` behind the hook of ``module_name`` or a module above it."""
    parts = module_name.split(".") if module_name else []
    for depth in range(len(parts), -1, -1):
        module = model.get_submodule(".".join(parts[:depth]))
        weights_map = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
        loader = getattr(weights_map, "dataset", weights_map)  # a PrefixedDataset over the loader
        if all(hasattr(loader, a) for a in ("state_dict", "index", "all_keys")):
            return loader
    return None
