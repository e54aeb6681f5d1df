"""Every version-sensitive TransformerLens call, in one place (TransformerLens 4.x).

TransformerLens 4 removed ``HookedTransformer``; its entry point is ``TransformerBridge``.
Booting a bridge switches the wrapped Hugging Face model to eager attention *in place*, and
its compatibility mode folds and centers weights in place, so this package never boots a
bridge on a user's model: it only unwraps bridges it is given, and boots one on a private
copy when a test wants TransformerLens as an independent reference.
"""

from __future__ import annotations

from torch import nn


def is_bridge(obj: object) -> bool:
    """True when ``obj`` is a TransformerLens ``TransformerBridge`` (checked without importing TL)."""
    return any(c.__name__ == "TransformerBridge" and c.__module__.startswith("transformer_lens")
               for c in type(obj).__mro__)


def wrapped(module: nn.Module) -> nn.Module:
    """The module a bridge's component wrapper (``NormalizationBridge`` …) wraps; else itself."""
    return getattr(module, "_original_component", None) or module


def unwrap_bridge(bridge: object) -> tuple[nn.Module, object]:
    """The Hugging Face model and tokenizer inside a bridge (not modified)."""
    return bridge.original_model, bridge.tokenizer


def boot_bridge(hf_model: nn.Module, tokenizer: object, name: str, device: str = "cpu") -> object:
    """Boot a ``TransformerBridge`` around ``hf_model`` offline. It mutates ``hf_model``: pass a copy."""
    from transformer_lens.model_bridge import TransformerBridge

    return TransformerBridge.boot_transformers(name, hf_model=hf_model, tokenizer=tokenizer,
                                               device=str(device))


def resid_pre_hook(layer: int) -> str:
    """TransformerLens's hook name for the stream entering block ``layer``."""
    return f"blocks.{layer}.hook_resid_pre"


def run_with_resid_cache(bridge: object, tokens, n_layers: int) -> list:
    """Run the bridge and return ``hook_resid_pre`` for each block (float32, no grad)."""
    import torch

    names = [resid_pre_hook(L) for L in range(n_layers)]
    with torch.inference_mode():
        _, cache = bridge.run_with_cache(tokens, names_filter=lambda n: n in names)
    return [cache[n].float() for n in names]


def hook_classes() -> tuple[type, type]:
    """``(HookPoint, HookedRootModule)`` for modules of our own (the twins)."""
    from transformer_lens import HookedRootModule
    from transformer_lens.hook_points import HookPoint

    return HookPoint, HookedRootModule
