"""What skipping the clean blocks saves: patched passes with and without ``SKIP_CLEAN_BLOCKS``.

IOI prompts on SmolLM2 (or ``--model``), side by side in this process, each call once with
skipping on (patched passes take the blocks before their first edit from the trace) and
once with it off (every block computed, the baseline): ``rs.path_patch`` of every head into
the logits (their direct effects: every block skipped) and into one late head's query
(``--receiver``), ``rs.patch_stream`` over every point and token, and
``rs.ablation_check(mode="patch", reads=False)`` of the last 45 heads. Prints one JSON line
and a Markdown table: times, speed-up and the largest difference of the metric.

    python benchmarks/skipping_speed.py [--model smollm2-135m] [--prompts 2] [--receiver L23H3.q]
"""

from __future__ import annotations

import argparse
import json

import torch
from patching_speed import ioi, timed

import residual_stream as rs
import residual_stream.analyses.patching as patching


def main() -> None:
    """Time each call with and without skipping; print JSON and a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--receiver", default="L23H3.q")
    args = parser.parse_args()
    model = rs.load(args.model)
    tr, other, metric = ioi(model, args.prompts)

    calls = {
        "heads → logits": lambda: rs.path_patch(tr, other, metric),
        f"heads → {args.receiver}": lambda: rs.path_patch(tr, other, metric, receivers=args.receiver),
        "stream grid": lambda: rs.patch_stream(tr, other, metric),
        "last 45 heads patched (ablation_check)": lambda: rs.ablation_check(
            tr, writes=model.anatomy.heads[-45:], mode="patch", reference=other, metric=metric, reads=False),
    }
    rs.path_patch(tr, other, metric, senders="L0H0", receivers="L1.attn")  # warm-up, and the probe
    out = {"model": args.model, "batch": list(tr.tokens.shape), "threads": torch.get_num_threads()}
    for name, call in calls.items():
        patching.SKIP_CLEAN_BLOCKS = True
        skip_s, skipped = timed(call)
        patching.SKIP_CLEAN_BLOCKS = False
        full_s, full = timed(call)
        patching.SKIP_CLEAN_BLOCKS = True
        runs = int(full.run.sum()) if hasattr(full, "run") else len(full.writes)
        out[name] = {"runs": runs, "skipped_s": skip_s, "computed_s": full_s,
                     "speedup": full_s / skip_s,
                     "max_metric_difference": float((skipped.metric - full.metric).abs().max())}
    print(json.dumps(out))
    print(f"\n{args.model}, {out['batch'][0]} prompts × {out['batch'][1]} tokens, {out['threads']} threads\n")
    print("| what | runs | every block computed | clean blocks skipped | speed-up | max metric difference |")
    print("|---|---|---|---|---|---|")
    for name in calls:
        r = out[name]
        print(f"| {name} | {r['runs']} | {r['computed_s']:.1f} s | {r['skipped_s']:.1f} s "
              f"| ×{r['speedup']:.2f} | {r['max_metric_difference']:.1e} |")


if __name__ == "__main__":
    main()
