"""Models spread over several devices or offloaded by accelerate (``device_map``).

A model loaded with ``device_map="auto"`` keeps each block on its own device, and weights
that did not fit are *offloaded*: the parameter is left on the ``meta`` device and
accelerate's hook (``module._hf_hook``) loads it from its ``weights_map`` (CPU memory or
disk) for the duration of each forward pass. The package works with both:

* captured activations are moved to the *home device* (where the input embeddings run),
  so a trace lives on one device whatever the split;
* weights are read through ``parameter``, which fetches an offloaded tensor from the hook's
  map, and ``Model.weights`` / ``Model.unembed`` move them to the home device.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .errors import NotAvailableError


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
