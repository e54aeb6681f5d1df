"""Models spread over several devices or offloaded by accelerate (``device_map``).

A model loaded with ``device_map="auto"`` keeps each block on its own device, and weights
that did not fit are *offloaded*: the parameter is left on the ``meta`` device and
accelerate's hook (``module._hf_hook``) loads it from its ``weights_map`` (CPU memory or
disk) for the duration of each forward pass. The package works with both:

* captured activations are moved to the *home device* (where the input embeddings run),
  so a trace lives on one device whatever the split;
* weights are read through ``parameter``, which fetches an offloaded tensor from the hook's
  map, and ``Model.weights`` / ``Model.unembed`` move them to the home device.

``resolve_device`` and ``resolve_dtype`` read a ``load``'s ``device`` and ``dtype``, and
refuse a device this machine lacks or a dtype no model runs in.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .errors import InputError, NotAvailableError


def parameter(module: nn.Module, name: str = "weight") -> Tensor | None:
    """``module.<name>`` as a real tensor, also when accelerate offloaded it (None if absent)."""
    t = getattr(module, name, None)
    if t is None or not isinstance(t, Tensor) or t.device.type != "meta":
        return t
    weights_map = getattr(getattr(module, "_hf_hook", None), "weights_map", None)
    if weights_map is None:
        raise NotAvailableError(
            f"{type(module).__name__}.{name} is on the meta device with no offload map to read "
            "it from; load the model with its weights (or with accelerate's device_map)")
    return weights_map[name]


def home_device(module: nn.Module) -> torch.device:
    """Where the model's inputs go: its input embedding's device (or execution device)."""
    embed = module.get_input_embeddings() if hasattr(module, "get_input_embeddings") else None
    if embed is not None:
        w = getattr(embed, "weight", None)
        if isinstance(w, Tensor) and w.device.type != "meta":
            return w.device
        hook_device = getattr(getattr(embed, "_hf_hook", None), "execution_device", None)
        if hook_device is not None:
            return torch.device(hook_device)
    return next((p.device for p in module.parameters() if p.device.type != "meta"),
                torch.device("cpu"))


DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16,
          "float64": torch.float64}


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """``"auto"`` picks cuda, then mps, then cpu; a named device must exist on this machine."""
    if str(device) != "auto":
        try:
            dev = torch.device(device)
        except (RuntimeError, TypeError):
            raise InputError(f"device {device!r} is not a device name: use auto, cpu, cuda, "
                             "cuda:N or mps") from None
        _check_present(dev)
        return dev
    if torch.cuda.is_available():
        return torch.device("cuda")
    if getattr(torch.backends, "mps", None) and torch.backends.mps.is_available():
        return torch.device("mps")
    return torch.device("cpu")


DEVICE_MAP_STRATEGIES = ("auto", "balanced", "balanced_low_0", "sequential")


def check_device_map(device_map: str | dict | None) -> None:
    """``InputError`` for a ``device_map`` accelerate cannot place a model by.

    A strategy that is none of ``DEVICE_MAP_STRATEGIES``, or a module mapped to a device this
    machine lacks (transformers raised these as errors of the model's files). ``"cpu"`` and
    ``"disk"`` are always there; an integer is a CUDA device.
    """
    if device_map is None:
        return
    if isinstance(device_map, str):
        if device_map not in DEVICE_MAP_STRATEGIES:
            raise InputError(f"device_map {device_map!r} is not one of {list(DEVICE_MAP_STRATEGIES)} "
                             "nor a dict of module path → device")
        return
    if not isinstance(device_map, dict):
        raise InputError(f"device_map must be a strategy name or a dict, not a {type(device_map).__name__}")
    for module, where in device_map.items():
        if where in ("cpu", "disk"):
            continue
        dev = torch.device("cuda", where) if isinstance(where, int) else where
        try:
            resolve_device(dev)
        except InputError as e:
            raise InputError(f"device_map[{module!r}]: {e}") from None


def _check_present(dev: torch.device) -> None:
    """``InputError`` unless ``dev`` is the CPU or an accelerator this machine has."""
    count = {"cpu": 1, "cuda": torch.cuda.device_count() if torch.cuda.is_available() else 0,
             "mps": int(bool(getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()))}
    if dev.type not in count:
        raise InputError(f"device {str(dev)!r} is not supported: use auto, cpu, cuda, cuda:N or mps")
    if (dev.index or 0) >= count[dev.type]:
        have = f"{count[dev.type]} {dev.type} device(s)" if count[dev.type] else f"no {dev.type} device"
        raise InputError(f"device {str(dev)!r} is not on this machine ({have}): use auto or cpu")


def resolve_dtype(dtype: str | torch.dtype, device: torch.device) -> torch.dtype:
    """``"auto"`` is bfloat16 on cuda and float32 otherwise; else one of ``DTYPES``."""
    if dtype == "auto":
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    if dtype in DTYPES.values():
        return dtype
    if dtype not in DTYPES:
        raise InputError(f"dtype {dtype!r} is not a model dtype: use auto or one of {list(DTYPES)}")
    return DTYPES[dtype]
