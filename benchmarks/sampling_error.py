"""How far a statistic on sampled tokens (``every=k``) lands from the same statistic on every token.

One scan of ``--model`` over the built-in corpus (``--max-tokens``) computes the lens,
survival, read attribution and write subspaces on every token, a second the same on one token in
``--every`` (the flow statistics share one pass, so each ``every`` needs its own scan);
both read the same batches. Printed per statistic: the tokens each mean is over and the
largest difference from the full value (for the lens also in units of its stated standard
error ``kl_se``).

    python benchmarks/sampling_error.py [--model smollm2-135m] [--max-tokens 4096] [--every 16]
"""

from __future__ import annotations

import argparse
import json

import numpy as np
import torch

import residual_stream as rs


def _max_diff(a, b) -> float:
    """Largest ``|a − b|`` (tensors or pandas columns), NaN entries (no token) left out."""
    diff = torch.as_tensor(np.asarray(a, dtype=float) - np.asarray(b, dtype=float))
    return float(diff.abs().nan_to_num().max())


def main() -> None:
    """Scan twice (every token, then one in ``--every``) and print the differences."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--max-tokens", type=int, default=4096)
    p.add_argument("--every", type=int, default=16)
    p.add_argument("--json", help="write the figures here too")
    args = p.parse_args()
    model = rs.load(args.model, progress=False)
    kw = dict(batch_size=8, seq_len=128, max_tokens=args.max_tokens, progress=False)
    k = args.every
    full = rs.scan(model, "builtin", ["lens", "survival", "read_attribution", "subspaces"], **kw)
    part = rs.scan(model, "builtin", [f"lens:every={k}", f"survival:every={k}",
                                      f"read_attribution:every={k}", f"subspaces:every={k}"], **kw)
    lens, slens = full.stats["lens"], part.stats[f"lens:every={k}"]
    z = ((slens.kl - lens.kl) / slens.kl_se).abs()[:-1].to_numpy()  # last point: KL 0 ± rounding
    read, sread = full.stats["read_attribution"], part.stats[f"read_attribution:every={k}"]
    sub, ssub = full.stats["subspaces"], part.stats[f"subspaces:every={k}"]
    surv, ssurv = full.stats["survival"], part.stats[f"survival:every={k}"]
    out = {
        "model": args.model, "tokens": full.tokens, "every": k,
        "sampled_tokens": part.to_dict()["tokens_measured"],
        "lens_kl_max_abs": _max_diff(slens.kl, lens.kl),
        "lens_kl_max_rel": float(((slens.kl - lens.kl).abs() / lens.kl)[:-1].max()),
        "lens_kl_max_in_se": float(z.max()), "lens_kl_median_in_se": float(np.median(z)),
        "lens_top1_max_abs": _max_diff(slens.top1_agreement, lens.top1_agreement),
        "survival_share_max_abs": _max_diff(ssurv.share, surv.share),
        "survival_share_largest": float(surv.share.nan_to_num().abs().max()),
        "survival_retention_max_abs": _max_diff(ssurv.retention, surv.retention),
        "survival_retention_max_rel": float(((ssurv.retention - surv.retention).abs()
                                             / surv.retention.abs()).nan_to_num().max()),
        "read_share_max_abs": _max_diff(sread.share, read.share),
        "read_share_largest": float(read.share.abs().max()),
        "subspaces_named_max_abs": _max_diff(ssub.named, sub.named),
        "subspaces_read_fraction_max_abs": _max_diff(ssub.read_fraction, sub.read_fraction),
        "seconds_full": full.seconds, "seconds_sampled": part.seconds,
    }
    for key, value in out.items():
        print(f"{key}: {value}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
