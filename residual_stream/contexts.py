"""The context managers a pass on a user's model runs in: the model is left as it was.

``model_lock``: one pass with hooks at a time per model object (threads share the app's
models). ``untouched``: train/eval modes restored and hooks others add meanwhile dropped.
``edited``: intervention hooks for one call. ``eager_attention``: eager attention for one call
(attention patterns), switched back after.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from torch import nn

from .hookio import by_token_hook

_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The lock that one forward pass with hooks holds on ``model``, per module object.

    A model shared by threads (the app's sessions; a rerun of a page starts while the run
    it replaces still computes) would otherwise see one pass's hooks, or ``untouched``'s
    undoing of them, land in another's pass. Re-entrant: a pass may nest ``untouched`` and
    ``hooked``.
    """
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def untouched(model: nn.Module, *, hooks: bool = True) -> Iterator[None]:
    """Leave ``model`` as it was: restore train/eval modes and drop hooks others add meanwhile.

    Used around forward passes on a user's model: we run in eval mode (no dropout), and
    ``transformers``' ``output_hidden_states`` / ``output_attentions`` install capture hooks
    of their own, once and for good; both are undone on exit. ``hooks=False`` skips the hook
    bookkeeping (a snapshot of every module's hook dicts, ~3 ms of host time per call on
    SmolLM2) for a forward pass that asks for neither output. The pass holds ``model_lock``.
    """
    with model_lock(model):
        yield from _untouched(model, hooks)


def _untouched(model: nn.Module, hooks: bool) -> Iterator[None]:
    modules = list(model.modules())
    modes = [m.training for m in modules]
    hook_dicts = ("_forward_hooks", "_forward_pre_hooks")
    before = {(m, d): set(getattr(m, d)) for m in modules for d in hook_dicts} if hooks else {}
    flag = "_output_capturing_hooks_installed"  # set by transformers on the module it hooked
    flagged = {m for m in modules if flag in m.__dict__} if hooks else set()
    if any(modes):
        model.eval()
    try:
        yield
    finally:
        for (m, d), keys in before.items():
            for key in set(getattr(m, d)) - keys:
                for extra in ("", "_with_kwargs", "_always_called"):
                    getattr(m, d + extra, {}).pop(key, None)
        for m in modules if hooks else ():
            if m not in flagged:
                m.__dict__.pop(flag, None)
        for m, mode in zip(modules, modes, strict=True):
            if m.training != mode:  # nn.Module.__setattr__ is slow: only what eval() changed
                m.training = mode


@contextmanager
def edited(model: nn.Module, edits: Sequence[tuple], shape: tuple[int, int] | None = None) -> Iterator[None]:
    """Attach intervention hooks for the duration of the block, and remove them on any exit.

    Each edit is ``(module path, forward hook)``, or ``(module path, hook, True)`` for a forward
    pre-hook taking ``(module, args, kwargs)`` (one that changes a block's input); the module
    itself may stand for its path. ``shape``: the pass's ``(batch, pos)``; each hook then sees
    a module's flattened tokens as ``[batch, pos, ...]`` (``hookio.by_token_hook``).
    """
    handles = []
    try:
        for path, hook, *pre in edits:
            module = model.get_submodule(path) if isinstance(path, str) else path
            is_pre = bool(pre and pre[0])
            hook = hook if shape is None else by_token_hook(hook, shape, is_pre)
            handles.append(module.register_forward_pre_hook(hook, with_kwargs=True) if is_pre
                           else module.register_forward_hook(hook))
        yield
    finally:
        for h in handles:
            h.remove()


@contextmanager
def eager_attention(model: nn.Module, on: bool) -> Iterator[None]:
    """Switch a Hugging Face model to eager attention (needed for patterns), then switch back."""
    before = getattr(getattr(model, "config", None), "_attn_implementation", None)
    switch = on and hasattr(model, "set_attn_implementation") and before != "eager"
    if switch:
        restore = _implementations(model.config)  # each sub-config's own: a tower's may take no SDPA
        unset = _unset(model.config)  # (switching sets these too)
        _set_attention(model, "eager")
    try:
        yield
    finally:
        if switch:
            _set_attention(model, restore)
            for config in unset:
                config._attn_implementation = None


def _sub_configs(config) -> dict:
    """``config``'s sub-configs that are set, by name (a container's text and vision configs)."""
    return {k: getattr(config, k) for k in getattr(config, "sub_configs", {})
            if getattr(config, k, None) is not None}


def _implementations(config) -> dict:
    """``config``'s attention implementation and its sub-configs', as ``set_attn_implementation`` takes them.

    A vision tower's may differ from the text model's: Apertus 1.5's vision tokenizer takes no SDPA.
    Configs without one of their own (DBRX's ``attn_config``) are left out.
    """
    own = getattr(config, "_attn_implementation", None)
    subs = {k: _implementations(sub) for k, sub in _sub_configs(config).items()}
    return {**({"": own} if own else {}), **{k: v for k, v in subs.items() if v}}


def _unset(config) -> list:
    """The sub-configs, at any depth, without an attention implementation (DBRX's ``attn_config``)."""
    return [c for sub in _sub_configs(config).values()
            for c in ([sub] if getattr(sub, "_attn_implementation", None) is None else []) + _unset(sub)]


def _set_attention(model: nn.Module, implementation: str | dict) -> None:
    """Set a Hugging Face model's attention implementation.

    transformers switches only models whose attention goes through its ``AttentionInterface``;
    another (Falcon) keeps SDPA's boolean mask, which its eager arithmetic then adds to the
    scores: attention to later tokens, hidden states 0.07 off. Its attention reads the
    config on every call, so the config is switched directly.
    """
    can_set = getattr(type(model), "_can_set_attn_implementation", lambda: True)
    if can_set():
        model.set_attn_implementation(implementation)
    else:
        model.config._attn_implementation = implementation if isinstance(implementation, str) else (
            implementation[""])
