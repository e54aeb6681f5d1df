"""Operations dispatched per batch: a device-independent measure of launch overhead.

On a GPU a small model's forward pass is bound by kernel launches, not arithmetic (an H200
runs SmolLM2-135M over 1,024 tokens in ~27 ms, ~600 launches), so what a hook or a reduction
costs there is roughly the number of operations it dispatches. This script counts, for each
variant of ``scan_speed.py``, the ATen operations that compute something (views, reshapes and
other aliasing operations excluded: they launch nothing) over one batch, beside the plain
forward pass's count, in the same process:

    python benchmarks/op_count.py [--model smollm2-135m] [--batch-size 8] [--seq-len 128]
        [--variants hf_forward,rs_capture,rs_stats,...]

``rs_stats_replayed`` is growth as a replayed CUDA graph runs it (emulated here); a
``fusion.fused`` function counts as one operation, as it is one kernel on a GPU.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter

from scan_speed import _batches, variants
from torch.utils._python_dispatch import TorchDispatchMode

import residual_stream as rs

_FREE = {"detach", "alias", "lift_fresh", "_to_copy_noop", "empty", "resolve_conj", "resolve_neg"}


class _Count(TorchDispatchMode):
    """Counts every dispatched ATen operation that is not a view.

    A ``fusion.fused`` function counts as one operation, ``fused`` (on a GPU it compiles to
    one kernel; here it runs eagerly, and its own operations are not counted).
    """

    active: _Count | None = None

    def __init__(self) -> None:
        super().__init__()
        self.ops: Counter = Counter()
        self.inside_fused = 0

    def __enter__(self):
        _Count.active = self
        return super().__enter__()

    def __exit__(self, *exc):
        _Count.active = None
        return super().__exit__(*exc)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if not self.inside_fused and not func.is_view and name not in _FREE:
            self.ops[name] += 1
        return func(*args, **(kwargs or {}))


def _one_op_each(fn):
    def run(*args):
        c = _Count.active
        if c is None:
            return fn(*args)
        c.ops["fused"] += not c.inside_fused
        c.inside_fused += 1
        try:
            return fn(*args)
        finally:
            c.inside_fused -= 1
    return run


def count_fused_as_one() -> None:
    """Wrap every ``fusion.fused`` function the package's modules hold (see ``_Count``)."""
    for name, module in list(sys.modules.items()):
        if name.startswith("residual_stream"):
            for attr, value in list(vars(module).items()):
                if callable(value) and hasattr(value, "fused"):
                    setattr(module, attr, _one_op_each(value))


def replayed(model, names: list[str], seq_len: int):
    """What a replayed scan runs per batch (``streaming.graphs``), emulated.

    The graph's operations (the lean pass with ``replayable`` reducers) and the reduction
    after it.
    """
    from residual_stream.streaming import make_accumulators
    from residual_stream.streaming.graphs import Replayed

    accs = make_accumulators(names)
    for a in accs.values():
        a.prepare(model, None)
    r = Replayed(model, accs, width=seq_len, emulate=True)
    return r.add


def count(fn, batch) -> Counter:
    """The operations ``fn(batch)`` dispatches (after one warm-up call)."""
    fn(batch)
    with _Count() as c:
        fn(batch)
    return c.ops


def main() -> None:
    """Print a Markdown table: operations per batch and the ratio to the plain forward."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--variants", default="hf_forward,hf_headless,rs_capture,rs_stats,"
                                         "rs_stats_replayed,rs_survival,rs_read,rs_stats_flow,"
                                         "rs_decompose")
    args = p.parse_args()
    model = rs.load(args.model, device=args.device, dtype=args.dtype, progress=False)
    batch = _batches(model, 1, args.batch_size, args.seq_len)[0]
    count_fused_as_one()
    fns = variants(model, use_tl=False)
    fns["rs_stats_replayed"] = replayed(model, ["growth"], args.seq_len)
    names = args.variants.split(",")
    counts = {n: count(fns[n], batch) for n in names}
    base = sum(counts["hf_forward"].values())
    n_layers = model.anatomy.n_layers
    print(f"model {model.name}, {model.device}, {model.dtype}, one batch of "
          f"{args.batch_size}×{args.seq_len}\n")
    print("| variant | operations per batch | × plain forward | extra per block | most frequent extra |")
    print("|---|---|---|---|---|")
    for n in names:
        total = sum(counts[n].values())
        extra = counts[n] - counts["hf_forward"]
        top = ", ".join(f"{k} {v}" for k, v in extra.most_common(4))
        print(f"| {n} | {total:,} | ×{total / base:.2f} | {(total - base) / n_layers:.0f} | {top} |")


if __name__ == "__main__":
    main()
