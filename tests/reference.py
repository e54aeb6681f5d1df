"""An independent reference for decompositions: frozen-forward ablation in float64.

Run a float64 copy of the model with every norm's scale frozen at the value the original
forward computed and every write (embedding, ``z`` into each attention output projection,
MLP output) replaced by the captured one. The model's own code then computes an affine
function of the writes, so ablating one write (zeroing one head's slice of ``z``, one MLP
output, one embedding, or one norm's bias) changes the framework's ``hidden_states`` by
exactly that write's contribution. This uses the framework's forward pass, not our stream
program, so it checks the program (placement, α, which norms stand where) independently.
"""

from __future__ import annotations

import copy

import torch

from residual_stream.architectures import describe


def _hook_all(model, anatomy, cap, ablate: str):
    handles = []
    H = anatomy.n_heads
    for label, path in anatomy.modules.embeds.items():
        value = cap.embeds[label].double()
        handles.append(model.get_submodule(path).register_forward_hook(
            lambda m, a, y, v=value, lab=label: torch.zeros_like(y) if lab == ablate
            else v.reshape(y.shape) if v.numel() == y.numel() else v[:1].reshape(y.shape)))
    for L, path in enumerate(anatomy.modules.attn_out):
        z = cap.z[L].double().clone()
        if ablate.startswith(f"L{L}H"):
            h = int(ablate.split("H")[1])
            z = z.view(*z.shape[:2], H, -1).clone()
            z[:, :, h] = 0
            z = z.flatten(2)
        mod = model.get_submodule(path)
        handles.append(mod.register_forward_pre_hook(lambda m, a, k, z=z: ((z,), k),
                                                     with_kwargs=True))
        if ablate == f"L{L}.b_O":
            handles.append(mod.register_forward_hook(lambda m, a, y: y - m.bias))
    handles += _mlp_writes(model, anatomy, cap, ablate)
    calls: dict[str, list[list[str]]] = {}  # each norm module's calls in a pass, in order
    for name, spec in anatomy.norms.items():  # (a multiplier, Granite's, has no module: the model's
        if spec.constant:                     # own code applies it)
            continue
        groups = calls.setdefault(spec.module_path, [])
        same = [g for g in groups if torch.equal(cap.norm_scale[name], cap.norm_scale[g[0]])]
        if same:  # one call: one scale
            same[0].append(name)
        else:
            groups.append([name])
    for path, groups in calls.items():  # (GPT-J's ln_1, read twice in one call)
        handles.append(model.get_submodule(path).register_forward_hook(_frozen(anatomy, cap, groups, ablate)))
    return handles


def _mlp_writes(model, anatomy, cap, ablate: str) -> list:
    """Hooks putting each captured MLP write in place (zeros for the ablated one): the module's
    output, or its input where the write is that (Gemma 4's blocks of experts)."""
    handles = []
    for L, path in enumerate(anatomy.modules.mlp_out):
        v, on = cap.mlp_out[L].double(), ablate == f"L{L}.mlp"
        if anatomy.modules.mlp_out_input:
            handles.append(model.get_submodule(path).register_forward_pre_hook(
                lambda m, a, v=v, on=on: ((torch.zeros_like(v) if on else v).reshape(a[0].shape), *a[1:])))
        else:  # gpt-oss: (write, router scores)
            handles.append(model.get_submodule(path).register_forward_hook(
                lambda m, a, y, v=v, on=on: _as_output(y, torch.zeros_like(v) if on else v)))
    return handles


def _frozen(anatomy, cap, groups: list[list[str]], ablate: str):
    """A norm module's hook: its scale frozen, its ``k``-th call serving the roles ``groups[k]``
    (nanochat runs one module on the embeddings, then on the final stream); its bias ablated
    if one of them is ``ablate``."""
    count = [0]

    def hook(m, a, y):
        names = groups[count[0] % len(groups)]
        count[0] += 1
        spec, scale = anatomy.norms[names[0]], cap.norm_scale[names[0]].double().reshape(a[0].shape[:-1])
        off = any(ablate == f"{n}.bias" for n in names)  # (OPT's MLP norm: [batch·pos, d])
        return spec.apply_linear(a[0], scale) if off else spec.apply_frozen(a[0], scale)
    return hook


def _as_output(y, value):
    """``value`` in the place of a module's output ``y`` (its first element, for a tuple).

    A copy: Falcon's block adds to its MLP's output in place, and ``value`` serves every run.
    """
    value = value.clone().reshape((y[0] if isinstance(y, tuple) else y).shape)  # (OPT's: [batch·pos, d])
    return (value, *y[1:]) if isinstance(y, tuple) else value


def ablation_contributions(trace, labels: list[str]) -> dict[str, torch.Tensor]:
    """``hidden_states`` (every point) minus the same with ``label`` ablated, per label.

    Returns label -> one ``[batch, pos, d_model]`` float64 tensor per point 0..n_layers, where
    the last is the framework's final hidden state (after the final norm if there is one, and
    OPT-350m's ``project_out``: ``[batch, pos, 512]``).
    """
    model = copy.deepcopy(trace.model.module).double()
    configs = (model.config, getattr(model.config, "get_text_config", lambda: model.config)())  # Kimi K2.5's
    if {getattr(c, "_experts_implementation", None) for c in configs} - {None, "eager"}:
        model.set_experts_implementation("eager")  # grouped matmuls of experts take no float64
    anatomy = describe(model, has_lm_head=trace.anatomy.has_lm_head)
    cap = trace.captured
    tokens, mask = trace.tokens, trace.attention_mask

    def run(ablate: str) -> torch.Tensor:
        handles = _hook_all(model, anatomy, cap, ablate)
        default = torch.get_default_dtype()  # float64 while the float64 copy runs: XGLM's attention
        torch.set_default_dtype(torch.float64)  # makes torch.full((), finfo(float64).min) without a dtype
        try:
            with torch.no_grad():
                out = model(input_ids=tokens, attention_mask=mask, output_hidden_states=True)
        finally:
            torch.set_default_dtype(default)
            for h in handles:
                h.remove()
        states = out.hidden_states  # (CLIP's text model's end before the final norm; last_hidden_state after)
        return (*states[:-1], out.last_hidden_state) if anatomy.states_before_final_norm else states

    full = run("")
    return {label: [f - r for f, r in zip(full, run(label), strict=True)] for label in labels}
