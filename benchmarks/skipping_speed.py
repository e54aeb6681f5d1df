"""What skipping the clean blocks, and unembedding only the metric's token, save in patched passes.

IOI prompts on SmolLM2 (or ``--model``), side by side in this process, each call three
ways: with every block computed (``SKIP_CLEAN_BLOCKS`` off, the baseline); with skipping on
(patched passes take the blocks before their first edit from the trace); and with skipping
and ``logits_at=-1`` as well (the unembedding computes the last token only, the one the
logit-difference metric reads), for the calls that take it. The calls: ``rs.path_patch`` of
every head into the logits (their direct effects: every block skipped) and into one late
head's query (``--receiver``), ``rs.patch_stream`` over every point and token, and
``rs.ablation_check(mode="patch", reads=False)`` of the last 45 heads (its KL reads every
token: no ``logits_at``). Prints one JSON line and a Markdown table: times, speed-ups and
the largest difference of the metric from the baseline.

    python benchmarks/skipping_speed.py [--model smollm2-135m] [--prompts 2] [--receiver L23H3.q]
"""

from __future__ import annotations

import argparse
import json
from functools import partial

import torch
from patching_speed import ioi, timed

import residual_stream as rs
import residual_stream.analyses.patching as patching


def main() -> None:
    """Time each call every way; print JSON and a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--receiver", default="L23H3.q")
    args = parser.parse_args()
    model = rs.load(args.model)
    tr, other, metric = ioi(model, args.prompts)

    calls = {  # name: (call taking extra keywords, whether it takes logits_at)
        "heads → logits": (lambda **kw: rs.path_patch(tr, other, metric, **kw), True),
        f"heads → {args.receiver}": (lambda **kw: rs.path_patch(tr, other, metric, receivers=args.receiver,
                                                                 **kw), True),
        "stream grid": (lambda **kw: rs.patch_stream(tr, other, metric, **kw), True),
        "last 45 heads patched (ablation_check)": (lambda **kw: rs.ablation_check(
            tr, writes=model.anatomy.heads[-45:], mode="patch", reference=other, metric=metric,
            reads=False, **kw), False),
    }
    rs.path_patch(tr, other, metric, senders="L0H0", receivers="L1.attn")  # warm-up, and the probe
    out = {"model": args.model, "batch": list(tr.tokens.shape), "threads": torch.get_num_threads()}
    for name, (call, narrows) in calls.items():
        patching.SKIP_CLEAN_BLOCKS = False
        full_s, full = timed(call)
        patching.SKIP_CLEAN_BLOCKS = True
        skip_s, skipped = timed(call)
        last_s, last = timed(partial(call, logits_at=-1)) if narrows else (None, None)
        runs = int(full.run.sum()) if hasattr(full, "run") else len(full.writes)
        out[name] = {"runs": runs, "computed_s": full_s, "skipped_s": skip_s, "last_token_s": last_s,
                     "speedup": full_s / skip_s, "speedup_last_token": last_s and full_s / last_s,
                     "max_metric_difference": max(float((r.metric - full.metric).abs().max())
                                                  for r in (skipped, last) if r is not None)}
    print(json.dumps(out))
    print(f"\n{args.model}, {out['batch'][0]} prompts × {out['batch'][1]} tokens, {out['threads']} threads\n")
    print("| what | runs | every block computed | clean blocks skipped | and logits_at=-1 | speed-ups "
          "| max metric difference |")
    print("|---|---|---|---|---|---|---|")
    for name in calls:
        r = out[name]
        last = f"{r['last_token_s']:.1f} s" if r["last_token_s"] else "—"
        ups = f"×{r['speedup']:.2f}" + (f", ×{r['speedup_last_token']:.2f}" if r["last_token_s"] else "")
        print(f"| {name} | {r['runs']} | {r['computed_s']:.1f} s | {r['skipped_s']:.1f} s | {last} | {ups} "
              f"| {r['max_metric_difference']:.1e} |")


if __name__ == "__main__":
    main()
