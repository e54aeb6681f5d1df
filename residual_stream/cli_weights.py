"""The commands that read a model's weights, not a text: ``heads`` and ``composition``."""

from __future__ import annotations

import argparse
import json
import math

from .bars import load_on_terminal
from .errors import InputError

MODEL_HELP = "registry name, HF folder, .gguf file or cached hub id"


def add_weight_commands(sub) -> None:
    """Add ``heads`` and ``composition`` to the ``residual-stream`` subparsers ``sub``."""
    h = sub.add_parser("heads", help="previous-token, duplicate-token and induction score of every "
                       "head, on repeated random tokens")
    h.add_argument("model", help=MODEL_HELP)
    h.add_argument("--top", type=int, default=5, help="heads listed per score (default 5)")
    h.add_argument("--length", type=int, help="random tokens per copy (default: 50, or what fits)")
    h.add_argument("--rows", type=int, default=4, help="random sequences (default 4)")
    h.add_argument("--seed", type=int, default=0, help="seed of the random tokens (default 0)")
    h.add_argument("--json", action="store_true", help="print every head's scores as JSON")
    c = sub.add_parser("composition", help="Q/K/V composition between heads (and head-MLP) from the "
                       "weights: the strongest pairs, or the writers a reader composes with")
    c.add_argument("model", help=MODEL_HELP)
    c.add_argument("--kind", help="q, k or v (heads reading heads), mlp_q/mlp_k/mlp_v (heads reading "
                   "MLPs) or in (MLPs reading heads); default k, or in for an MLP --reader")
    c.add_argument("--reader", help="list the writers this reader (L5H3, L5.mlp) composes with")
    c.add_argument("--top", type=int, default=10, help="pairs or writers listed (default 10)")
    c.add_argument("--weights-only", action="store_true",
                   help="score the weights alone, without the norms between writer and reader "
                   "(post-norm and DeepNorm models; changes nothing in pre-norm ones)")
    c.add_argument("--json", action="store_true", help="print the listed rows as JSON")


def heads_command(args: argparse.Namespace) -> int:
    """``residual-stream heads``: each score's top heads, and the next-token losses."""
    from .analyses.heads import KINDS, head_scores

    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    model = load_on_terminal(args.model)
    scores = head_scores(model, length=args.length, rows=args.rows, seed=args.seed)
    if args.json:
        losses = {k: None if math.isnan(v) else v  # JSON has no NaN
                  for k, v in (("loss_first", scores.loss_first), ("loss_repeat", scores.loss_repeat))}
        print(json.dumps({"model": model.name, "length": scores.length, "rows": args.rows, "seed": args.seed,
                          **losses, "heads": scores.to_frame().to_dict(orient="records")}, indent=1))
        return 0
    print(f"{model.name}: {args.rows} rows of {scores.length} random tokens, repeated once "
          f"(seed {args.seed})\n")
    for kind in KINDS:
        print(f"{kind.replace('_', '-')} score, top {args.top}:")
        print(scores.top(kind, args.top)[["head", kind]].to_string(index=False), end="\n\n")
    if math.isnan(scores.loss_first):
        print("no next-token loss: the model has no next-token LM head")
    else:
        print(f"next-token loss on the first copy {scores.loss_first:.3g} nats, on the repeat "
              f"{scores.loss_repeat:.3g}")
    return 0


def composition_command(args: argparse.Namespace) -> int:
    """``residual-stream composition``: the strongest pairs of a kind, or one reader's writers.

    Rows as ``Composition.to_frame`` / ``top`` give them, with the random baseline.
    """
    from .analyses.composition import KINDS, TITLES, composition
    from .errors import check_choice

    if args.kind is not None:
        check_choice("--kind", args.kind, tuple(TITLES))
    if args.top < 1:
        raise InputError(f"--top must be at least 1, got {args.top}")
    model = load_on_terminal(args.model)
    comp = composition(model, through_norms=not args.weights_only)
    if args.reader is not None:
        kind = args.kind or ("in" if args.reader in comp.mlps else "k")
        rows = comp.top(args.reader, kind, args.top)
        empty = f"(no writer before {args.reader}: nothing composes into it)"
    else:
        kind = args.kind or "k"
        if kind not in KINDS and not comp.mlps:
            raise InputError(f"{model.name} has no MLPs: --kind {kind} has nothing to score; use q, k or v")
        frame = comp.to_frame()
        rows = frame[frame.kind == kind].sort_values("score", ascending=False, kind="stable").head(args.top)
        empty = "(no pair: no reader reads after a writer)"
    folded = "weights alone" if args.weights_only else "writes as they reach the reader"
    baseline = comp.baseline[kind]
    if args.json:
        print(json.dumps({"model": model.name, "kind": kind, "reader": args.reader,
                          "through_norms": comp.through_norms, "baseline": baseline,
                          "rows": rows[["writer", "reader", "score"]].to_dict(orient="records")}, indent=1))
        return 0
    into = f" into {args.reader}" if args.reader else ""
    print(f"{model.name}: {TITLES[kind]} composition{into}, {folded} (random baseline {baseline:.3f})\n")
    shown = rows[["writer", "reader", "score"]]
    print(shown.to_string(index=False) if len(shown) else empty)
    return 0
