"""What patching costs: stream patching and head patching, runs one per pass vs stacked.

IOI prompts on SmolLM2 (or ``--model``). Side by side in this process: a plain forward pass of
the batch (the baseline); ``rs.patch_stream`` over every point and token with
``batch_size=1`` (one patched run per forward pass) and ``--stack`` (that many per pass);
``rs.ablation_check(mode="patch", reads=False)`` of ``--heads`` heads, likewise, and
``rs.path_patch`` of the same heads into the logits (their direct effects), and
``rs.ablation_check(mode="patch")`` of every component with every later read captured
(``reads``). Each is timed
once after a warm-up pass; the results of the two settings are compared (max difference of
the metric). ``rs.attribution_patching`` estimates the stream grid from one forward and one
backward pass: its time, and how well it agrees with the measured grid (Pearson over cells,
largest difference of the share). Prints one JSON line and a Markdown table.

    python benchmarks/patching_speed.py [--model smollm2-135m] [--prompts 6] [--heads 45] [--stack 16]
"""

from __future__ import annotations

import argparse
import json
import time

import torch

import residual_stream as rs

NAMES = [(" Mary", " John", " Anna"), (" Tom", " James", " Paul"), (" Sarah", " Emma", " Lucy")]
PLACES = [("store", "gave a drink"), ("park", "handed a ball"), ("office", "sent a letter")]


def prompts(n: int) -> tuple[list[str], list[str], list[tuple[str, str]]]:
    """``n`` clean IOI prompts, their corrupted twins (the second subject renamed), and the names."""
    clean, corrupt, pairs = [], [], []
    for i in range(n):
        (io, s, other), (place, act) = NAMES[i % 3], PLACES[(i // 3) % 3]
        clean.append(f"When{io} and{s} went to the {place},{s} {act} to")
        corrupt.append(f"When{io} and{s} went to the {place},{other} {act} to")
        pairs.append((io, s))
    return clean, corrupt, pairs


def ioi(model, n: int):
    """``(clean trace, corrupted trace, metric)`` of ``n`` IOI prompts.

    The metric: the mean logit difference (indirect object − subject) at each row's last token.
    """
    clean, corrupt, pairs = prompts(n)
    tr, other = rs.trace(model, clean), rs.trace(model, corrupt)
    ids = [[model.tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in p] for p in pairs]
    io, s = torch.tensor(ids).T
    last = tr.attention_mask.sum(1) - 1
    rows = torch.arange(len(last))

    def metric(logits):
        return (logits[rows, last, io] - logits[rows, last, s]).mean()

    return tr, other, metric


def timed(fn):
    """``(seconds, result)`` of one call."""
    t = time.perf_counter()
    out = fn()
    return time.perf_counter() - t, out


def main() -> None:
    """Time the baseline and both settings of each patching; print JSON and a table."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--prompts", type=int, default=6)
    parser.add_argument("--heads", type=int, default=45)
    parser.add_argument("--stack", type=int, default=16)
    args = parser.parse_args()
    model = rs.load(args.model)
    tr, other, metric = ioi(model, args.prompts)

    tokens, mask = tr.tokens.to(model.device), tr.attention_mask.to(model.device)
    with torch.inference_mode():
        model.module(input_ids=tokens, attention_mask=mask)  # warm-up
        forward, _ = timed(lambda: model.module(input_ids=tokens, attention_mask=mask))
    heads = model.anatomy.heads[-args.heads:]
    components = [c.name for c in model.anatomy.components]
    out = {"model": args.model, "batch": list(tr.tokens.shape), "threads": torch.get_num_threads(),
           "forward_s": forward, "stack": args.stack}
    for name, call in (
        ("stream", lambda k: rs.patch_stream(tr, other, metric, batch_size=k)),
        ("heads", lambda k: rs.ablation_check(tr, writes=heads, mode="patch", reference=other,
                                              metric=metric, reads=False, batch_size=k)),
        ("paths", lambda k: rs.path_patch(tr, other, metric, senders=list(heads), batch_size=k)),
        ("reads", lambda k: rs.ablation_check(tr, writes=components, mode="patch", reference=other,
                                              metric=metric, batch_size=k)),
    ):
        one_s, one = timed(lambda call=call: call(1))
        stacked_s, stacked = timed(lambda call=call: call(args.stack))
        runs = {"heads": len(heads), "reads": len(components)}.get(name) or int(one.run.sum())
        if name == "heads":
            every_s, every = timed(lambda: rs.attribution_patching_writes(tr, other, metric))
            est = every.total[[every.writes.index(h) for h in heads]] - every.metric_clean
            got = one.metric.double() - one.metric_clean
            out["attribution_heads"] = {"s": every_s, "heads": len(every.writes), "measured": len(heads),
                                        "pearson": float(torch.corrcoef(torch.stack([est, got]))[0, 1])}
        a, b = (one.metric, stacked.metric)
        if name == "reads":  # every later read's change, too
            a = torch.cat([a, one.effect.nan_to_num().flatten()])
            b = torch.cat([b, stacked.effect.nan_to_num().flatten()])
        out[name] = {"runs": runs, "one_s": one_s, "stacked_s": stacked_s, "speedup": one_s / stacked_s,
                     "one_per_run_vs_forward": one_s / runs / forward,
                     "stacked_per_run_vs_forward": stacked_s / runs / forward,
                     "max_metric_difference": float((a - b).abs().max())}
        if name == "stream":
            out[name]["grid"] = list(one.metric.shape)
            attr_s, attr = timed(lambda: rs.attribution_patching(tr, other, metric))
            x, y = (attr.metric - attr.metric_clean).flatten(), (one.metric - one.metric_clean).flatten()
            out["attribution"] = {"s": attr_s, "vs_forward": attr_s / forward,
                                  "vs_stacked": stacked_s / attr_s,
                                  "pearson": float(torch.corrcoef(torch.stack([x, y]))[0, 1]),
                                  "max_share_difference": float((attr.share() - one.share()).abs().max())}
    print(json.dumps(out))
    print(f"\n{args.model}, {out['batch'][0]} prompts × {out['batch'][1]} tokens, "
          f"{out['threads']} threads; plain forward {forward:.3f} s\n")
    print(f"| what | runs | one per pass | stacked ×{args.stack} | speed-up "
          "| per run / forward (one, stacked) | max metric difference |")
    print("|---|---|---|---|---|---|---|")
    for name in ("stream", "heads", "paths", "reads"):
        r = out[name]
        print(f"| {name} | {r['runs']} | {r['one_s']:.1f} s | {r['stacked_s']:.1f} s | ×{r['speedup']:.2f} | "
              f"{r['one_per_run_vs_forward']:.2f}, {r['stacked_per_run_vs_forward']:.2f} | "
              f"{r['max_metric_difference']:.1e} |")
    r = out["attribution_heads"]
    print(f"attribution patching of every head ({r['heads']}): {r['s']:.2f} s; Pearson with the measured "
          f"{r['measured']} heads {r['pearson']:.3f}")
    r = out["attribution"]
    print(f"\nattribution patching of the stream grid: {r['s']:.2f} s ({r['vs_forward']:.1f} plain forwards; "
          f"the stacked grid takes ×{r['vs_stacked']:.0f} as long); Pearson with the measured grid "
          f"{r['pearson']:.3f}, largest share difference {r['max_share_difference']:.2f}")


if __name__ == "__main__":
    main()
