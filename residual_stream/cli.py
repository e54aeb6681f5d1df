"""The ``residual-stream`` command line.

    residual-stream models                     the registry: what is installed, how to install the rest
    residual-stream anatomy MODEL              sizes, norms and the stream program of a model
    residual-stream check MODEL --text TEXT    trace TEXT and print the conservation report
    residual-stream summarize MODEL [--text T] headline numbers of every analysis
    residual-stream train --norm N --placement P --out DIR   train a twin (see --help)
    residual-stream app [--host H --port P]    serve the Streamlit app

Exit codes: 0 on success, 2 on a usage error, 1 on any other failure (with a one-line reason
on stderr).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from .errors import InputError, ResidualStreamError

APP = Path(__file__).resolve().parent.parent / "app" / "main.py"


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="residual-stream", description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("models", help="list the model registry (installed or not)")
    a = sub.add_parser("anatomy", help="print a model's anatomy and stream program")
    a.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    c = sub.add_parser("check", help="trace a text and print the conservation report")
    c.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    c.add_argument("--text", required=True, action="append",
                   help="text to trace (repeat for a batch)")
    c.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda ...")
    c.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, else float32), float32 ...")
    c.add_argument("--verbose", action="store_true", help="print every comparison")
    m = sub.add_parser("summarize", help="headline numbers of every analysis for a model")
    m.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    m.add_argument("--text", action="append", help="text to analyse (repeat; default: 3 built-in)")
    m.add_argument("--json", action="store_true", help="print JSON instead of a table")
    t = sub.add_parser("train", help="train a twin transformer with the shared recipe")
    t.add_argument("--norm", choices=["layernorm", "rmsnorm", "none"], required=True)
    t.add_argument("--placement", choices=["pre", "post", "sandwich", "deepnorm", "parallel"],
                   required=True)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--d-mlp", type=int, default=512)
    t.add_argument("--mlp", choices=["gelu", "swiglu"], default="gelu")
    t.add_argument("--positions", choices=["learned", "rotary"], default="learned")
    t.add_argument("--n-ctx", type=int, default=128)
    t.add_argument("--steps", type=int, default=600)
    t.add_argument("--batch", type=int, default=16)
    t.add_argument("--lr", type=float, default=1e-3)
    t.add_argument("--warmup", type=int, default=100, help="linear warm-up steps (0: none)")
    t.add_argument("--seed", type=int, default=0)
    t.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda ...")
    t.add_argument("--out", required=True, type=Path, help="folder for model.safetensors + twin.json")
    t.add_argument("--quiet", action="store_true", help="no progress bar or loss log")
    s = sub.add_parser("app", help="serve the Streamlit app")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    s.add_argument("--port", type=int, default=8501)
    s.add_argument("--allow", action="append", default=[], metavar="DIR",
                   help="allow loading local models from DIR (repeatable); none by default")
    return p


def _models(args: argparse.Namespace) -> int:
    from .registry import list_models

    print(list_models().to_string(index=False))
    return 0


def _anatomy(args: argparse.Namespace) -> int:
    from .loading import load

    model = load(args.model, device="cpu")
    for key, value in model.anatomy.summary().items():
        print(f"{key:>14}: {value}")
    print("\nstream program:\n" + model.anatomy.describe_program())
    return 0


def _check(args: argparse.Namespace) -> int:
    from .loading import load
    from .trace import trace

    model = load(args.model, device=args.device, dtype=args.dtype)
    report = trace(model, args.text).check()
    if args.verbose:
        print(report.to_frame().to_string(index=False))
    print(report)
    return 0 if report.ok else 1


def _summarize(args: argparse.Namespace) -> int:
    from .loading import load
    from .summary import DEFAULT_TEXTS, summarize

    numbers = summarize(load(args.model, device="cpu"), args.text or DEFAULT_TEXTS)
    if args.json:
        print(json.dumps(numbers, indent=1))
    else:
        for key, value in numbers.items():
            shown = f"{value:.4g}" if isinstance(value, float) else value
            print(f"{key:>45}: {shown}")
    return 0


def _train(args: argparse.Namespace) -> int:
    from .loading import resolve_device
    from .twins.data import Mix
    from .twins.model import TwinConfig
    from .twins.train import Recipe, save, train

    if args.out.exists() and any(args.out.iterdir()) and not (args.out / "twin.json").exists():
        raise InputError(f"--out {args.out} exists and is not a twin folder: choose an empty one")
    config = TwinConfig(norm=args.norm, placement=args.placement, n_layers=args.layers,
                        d_model=args.d_model, n_heads=args.heads, d_mlp=args.d_mlp, mlp=args.mlp,
                        positions=args.positions, n_ctx=args.n_ctx)
    recipe = Recipe(steps=args.steps, batch=args.batch, lr=args.lr, warmup=args.warmup,
                    seed=args.seed, mix=Mix(seq_len=min(128, args.n_ctx)))
    log = None if args.quiet else (lambda line: print(line, file=sys.stderr, flush=True))
    result = train(config, recipe, device=resolve_device(args.device), progress=not args.quiet,
                   log=log)
    if result.diverged:
        print(f"residual-stream: error: training diverged at step {len(result.losses)} (loss "
              "became NaN/inf): lower --lr or raise --warmup", file=sys.stderr)
        return 1
    save(result, recipe, args.out)
    print(json.dumps(result.evaluation | {"seconds": round(result.seconds, 1)}))
    return 0


def _app(args: argparse.Namespace) -> int:
    env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if args.allow:
        env["RESIDUAL_STREAM_ALLOWED_DIRS"] = os.pathsep.join(str(Path(p).resolve()) for p in args.allow)
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", args.host,
           "--server.port", str(args.port), "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    return subprocess.call(cmd, env=env)


COMMANDS = {"models": _models, "anatomy": _anatomy, "check": _check, "summarize": _summarize,
            "train": _train, "app": _app}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (argparse exits with 2 on usage errors)."""
    args = _parser().parse_args(argv)
    try:
        return COMMANDS[args.command](args)
    except ResidualStreamError as e:
        print(f"residual-stream: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
