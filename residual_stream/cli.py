"""The ``residual-stream`` command line.

    residual-stream models                     the registry: what is installed, how to install the rest
    residual-stream anatomy MODEL              sizes, norms and the stream program of a model
    residual-stream check MODEL --text TEXT    trace TEXT and print the conservation report
    residual-stream summarize MODEL [--text T] headline numbers of every analysis
    residual-stream app [--host H --port P]    serve the Streamlit app

Exit codes: 0 on success, 2 on a usage error, 1 on any other failure (with a one-line reason
on stderr).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

from .errors import ResidualStreamError

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
    s = sub.add_parser("app", help="serve the Streamlit app")
    s.add_argument("--host", default="127.0.0.1", help="address to bind (default: localhost only)")
    s.add_argument("--port", type=int, default=8501)
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
    import json

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


def _app(args: argparse.Namespace) -> int:
    env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    cmd = [sys.executable, "-m", "streamlit", "run", str(APP), "--server.address", args.host,
           "--server.port", str(args.port), "--server.headless", "true",
           "--browser.gatherUsageStats", "false"]
    return subprocess.call(cmd, env=env)


COMMANDS = {"models": _models, "anatomy": _anatomy, "check": _check, "summarize": _summarize,
            "app": _app}


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
