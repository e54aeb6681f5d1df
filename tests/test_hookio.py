"""How hooks see a module's tensors (``hookio``): flattened tokens viewed as ``[batch, pos, d]``."""

from __future__ import annotations

import torch

from residual_stream.contexts import edited
from residual_stream.hookio import by_token, by_token_hook, with_first_output

B, P, D = 2, 5, 3


def test_flattened_tokens_are_viewed_back_and_others_left_or_expanded():
    flat = torch.arange(B * P * D, dtype=torch.float32).view(B * P, D)
    seen = by_token(flat, (B, P))
    assert seen.shape == (B, P, D) and seen.data_ptr() == flat.data_ptr()  # a view, no copy
    assert torch.equal(seen[1, 2], flat[1 * P + 2])  # row-major: token (b, p) is row b·P + p
    whole = torch.randn(B, P, D)
    assert by_token(whole, (B, P)) is whole
    pos = torch.randn(P, D)  # a learned position embedding, broadcast over the batch
    assert by_token(pos, (B, P)) is pos
    assert torch.equal(by_token(pos, (B, P), expand=True), pos.expand(B, P, D))
    assert torch.equal(by_token(pos[None], (B, P), expand=True), pos.expand(B, P, D))


def test_an_edit_on_a_module_of_flattened_tokens_sees_batch_and_position():
    """A hook zeroing position 3 of row 1, as an analysis writes it (``[batch, pos, d]``), on a
    module that runs on ``[batch·pos, d]``: the model's own output has exactly that row zeroed,
    and a pre-hook's replacement reaches the module the same way."""
    lin = torch.nn.Linear(D, D)
    x = torch.randn(B * P, D)

    def zero(module, args, out):
        assert out.shape == (B, P, D) and args[0].shape == (B, P, D)
        out = out.clone()
        out[1, 3] = 0
        return out

    def double(module, args, kwargs):
        assert args[0].shape == (B, P, D)
        return (args[0] * 2, *args[1:]), kwargs

    with torch.no_grad(), edited(lin, [(lin, zero)], (B, P)):
        y = lin(x)
    want = torch.nn.functional.linear(x, lin.weight, lin.bias)
    want[1 * P + 3] = 0
    assert y.shape == (B * P, D) and torch.equal(y, want)
    with torch.no_grad(), edited(lin, [(lin, double, True)], (B, P)):
        assert torch.allclose(lin(x), torch.nn.functional.linear(2 * x, lin.weight, lin.bias))
    with torch.no_grad():  # the hooks are gone
        assert torch.equal(lin(x), torch.nn.functional.linear(x, lin.weight, lin.bias))


def test_a_kept_view_is_in_the_graph_and_lists_keep_their_kind():
    """A hook that only keeps the tensor it sees (attribution patching) gets a gradient there:
    the module goes on from that view. A block returning a list (GPT-1's) gets a list back."""
    lin = torch.nn.Linear(D, D)
    x = torch.randn(B * P, D, requires_grad=True)
    kept = {}
    hook = by_token_hook(lambda m, a, out: kept.__setitem__("y", out), (B, P), pre=False)
    handle = lin.register_forward_hook(hook)
    try:
        loss = lin(x)[0 * P + 4].sum()  # token (0, 4)
    finally:
        handle.remove()
    (grad,) = torch.autograd.grad(loss, kept["y"])
    assert grad.shape == (B, P, D) and torch.equal(grad[0, 4], torch.ones(D))
    assert float(grad.abs().sum()) == D
    out = with_first_output([torch.zeros(1), "attn"], torch.ones(1))
    assert isinstance(out, list) and out[1] == "attn" and torch.equal(out[0], torch.ones(1))
