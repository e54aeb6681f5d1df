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


def embeddings(module: nn.Module, end: str) -> nn.Module | None:
    """The model's ``"input"`` or ``"output"`` embeddings, or None where it has none or cannot say.

    transformers raises ``NotImplementedError`` where a class neither overrides the getter nor names its
    embeddings conventionally (OWL-ViT's text transformer).
    """
    try:
        return getattr(module, f"get_{end}_embeddings", lambda: None)()
    except NotImplementedError:
        return None


def home_device(module: nn.Module) -> torch.device:
    """Where the model's inputs go: its input embedding's device (or execution device)."""
    embed = embeddings(module, "input")
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


MAP_ADVICE = ("map every module of the model once (a module's entry covers its submodules; "
              "{'': 'cpu'} maps the whole model), or pass device_map='auto'")


def check_device_map(device_map: str | dict | int | torch.device | None) -> None:
    """``InputError`` for a ``device_map`` accelerate cannot place a model by.

    A strategy (``DEVICE_MAP_STRATEGIES``) or one device for the whole model (``"cpu"``,
    ``"cuda:0"``, an int for a CUDA device, a ``torch.device``), or a dict of module path →
    device (``"disk"`` too). A device this machine lacks, an empty dict, and ``"disk"`` on an
    entry inside another (``_disk_nested``) are refused (transformers raised these as errors of
    the model's files, or the trace met weights it could not read).
    """
    if device_map is None or device_map in DEVICE_MAP_STRATEGIES:
        return
    if isinstance(device_map, dict) and not device_map:
        raise InputError(f"device_map is an empty dict, which places no module: {MAP_ADVICE}")
    places = device_map.items() if isinstance(device_map, dict) else [(None, device_map)]
    for module, where in places:
        if where == "disk" and module is not None:
            continue
        try:
            if isinstance(where, bool) or not isinstance(where, str | int | torch.device):
                raise InputError(f"{where!r} is not a device")
            resolve_device(torch.device("cuda", where) if isinstance(where, int) else where)
        except (InputError, RuntimeError, ValueError) as e:
            at = "device_map" if module is None else f"device_map[{module!r}]"
            raise InputError(f"{at}: {e}; a device_map is one of {list(DEVICE_MAP_STRATEGIES)}, a "
                             "device, or a dict of module path → device or 'disk'") from None
    if isinstance(device_map, dict):
        _disk_nested(device_map)


def _disk_nested(device_map: dict) -> None:
    """``InputError`` for an entry inside another (``""`` holds every one) where either is ``"disk"``.

    accelerate offloads a module mapped whole, or keeps one in memory, but not a part of it
    the other way, nor a part of an offloaded module offloaded again: MiniLM with
    ``{"": "cpu", "encoder.layer.0.attention": "disk"}`` failed to load ("weight is on the meta
    device"), and with ``{"": "disk", "encoder.layer.0": "disk"}`` loaded weights no pass could read.
    """
    for inner, inner_at in device_map.items():
        parts = str(inner).split(".") if inner else []
        above = [".".join(parts[:i]) for i in range(len(parts))]  # the modules holding it, "" first
        for outer in (a for a in above if a in device_map):
            outer_at = device_map[outer]
            if "disk" in (outer_at, inner_at):
                raise InputError(f"device_map maps {inner!r} to {inner_at!r} inside {outer!r} "
                                 f"({outer_at!r}): accelerate cannot place a part of a module apart "
                                 "from it where either goes to 'disk'; give the other parts of "
                                 f"{repr(outer) if outer else 'the model'} entries of their own, or "
                                 f"drop {inner!r}")


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
