"""The ``residual-stream`` command line.

    residual-stream models                     the registry: what is installed, how to install the rest
    residual-stream families                   every supported config.model_type and its family
    residual-stream anatomy MODEL              sizes, placement, each norm's ε/γ/β and the stream program
    residual-stream check MODEL --text TEXT    trace TEXT and print the conservation report
    residual-stream summarize MODEL [--text T] headline numbers of every analysis
    residual-stream heads MODEL [--top N]      induction, previous- and duplicate-token heads
    residual-stream composition MODEL [--kind k] [--reader L5H3]   Q/K/V composition from the weights
    residual-stream report --model A --model B [--builtin] --out report.html   compare models
    residual-stream trace MODEL --text T --out stats.safetensors   save a trace's statistics
    residual-stream train --norm N --placement P --out DIR   train a twin (see --help)
    residual-stream scan MODEL CORPUS --stats growth,lens --out scan.json   corpus statistics
    residual-stream merge A.pt B.pt --out all.pt   scans of disjoint corpus parts, as one scan
    residual-stream app [--host H --port P]    serve the Streamlit app

Exit codes: 0 on success, 2 on a usage error, 1 on a refused input or a file error (with a
one-line reason on stderr), 130 when interrupted (Ctrl-C); anything else is a bug and shows
its traceback.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import get_args, get_type_hints

from .bars import as_options, load_on_terminal, one_line_warnings
from .cli_report import add_report_command, report_command
from .cli_weights import add_weight_commands, composition_command, heads_command
from .errors import InputError, ResidualStreamError
from .files import usual_permissions, writable
from .inputs import Overflow

# the app's entry point: the copy a wheel carries (see setup.py), else the checkout's app/
APPS = (Path(__file__).resolve().parent / "_app" / "main.py",
        Path(__file__).resolve().parent.parent / "app" / "main.py")


def app_path() -> Path:
    """The Streamlit app's ``main.py``: the installed copy, else the source checkout's.

    Raises:
        InputError: neither is there (a package built without the app).
    """
    for path in APPS:
        if path.is_file():
            return path
    raise InputError(f"the app is not here (looked for {' and '.join(map(str, APPS))}): install "
                     "residual-stream from a wheel or a source checkout (`pip install .`), or clone "
                     "the repository and run `make app` from it")


def _overflow_option(parser: argparse.ArgumentParser) -> None:
    """``--overflow``: ``rs.trace``'s ``overflow``, its choices ``inputs.Overflow``'s."""
    parser.add_argument("--overflow", choices=get_args(Overflow), default="error",
                        help="a text longer than the context: refused (error) or split into rows (chunk)")


def _parser() -> argparse.ArgumentParser:
    intro, _, rest = __doc__.partition("\n\n")
    p = argparse.ArgumentParser(prog="residual-stream", description=intro.replace("``", ""),
                                epilog=rest.replace("``", ""),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    sub.add_parser("models", help="list the model registry (installed or not)")
    sub.add_parser("families", help="list the supported architectures (config.model_type and family)")
    a = sub.add_parser("anatomy", help="print a model's sizes, norms (ε, gain, bias) and stream program")
    a.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    c = sub.add_parser("check", help="trace a text and print the conservation report")
    c.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    c.add_argument("--text", required=True, action="append",
                   help="text to trace (repeat for a batch)")
    c.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda ...")
    c.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, else float32), float32 ...")
    c.add_argument("--verbose", action="store_true", help="print every comparison")
    _overflow_option(c)
    m = sub.add_parser("summarize", help="headline numbers of every analysis for a model")
    m.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    m.add_argument("--text", action="append", help="text to analyse (repeat; default: 3 built-in)")
    m.add_argument("--json", action="store_true", help="print JSON instead of a table")
    _overflow_option(m)
    add_weight_commands(sub)
    add_report_command(sub)
    tr = sub.add_parser("trace", help="save a trace's statistics (safetensors + JSON metadata)")
    tr.add_argument("model")
    tr.add_argument("--text", action="append", required=True, help="text to trace (repeat)")
    tr.add_argument("--out", type=Path, required=True, help="a .safetensors file")
    tr.add_argument("--device", default="auto")
    _overflow_option(tr)
    from .twins.model import TwinConfig
    from .twins.train import TWIN_RECIPE

    t = sub.add_parser("train", help="train a twin transformer with the shared recipe "
                       "(defaults: the bundled twins' recipe)")
    choices = {name: get_args(kind) for name, kind in get_type_hints(TwinConfig).items()}  # its Literals
    t.add_argument("--norm", choices=choices["norm"], required=True)
    t.add_argument("--placement", choices=choices["placement"], required=True)
    t.add_argument("--layers", type=int, default=4)
    t.add_argument("--d-model", type=int, default=128)
    t.add_argument("--heads", type=int, default=4)
    t.add_argument("--d-mlp", type=int, default=0, help="MLP width (default 0: 4 × --d-model)")
    t.add_argument("--mlp", choices=choices["mlp"], default="gelu")
    t.add_argument("--positions", choices=choices["positions"], default="learned")
    t.add_argument("--n-ctx", type=int, default=128)
    t.add_argument("--steps", type=int, default=TWIN_RECIPE.steps)
    t.add_argument("--batch", type=int, default=TWIN_RECIPE.batch)
    t.add_argument("--lr", type=float, default=TWIN_RECIPE.lr, help="peak learning rate")
    t.add_argument("--warmup", type=int, default=None,
                   help=f"linear warm-up steps (0: none; default {TWIN_RECIPE.warmup}, at most --steps)")
    t.add_argument("--synthetic-fraction", type=float, default=TWIN_RECIPE.mix.synthetic_fraction,
                   help="share of rows that are repeated random segments")
    t.add_argument("--seed", type=int, default=TWIN_RECIPE.seed)
    t.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda ...")
    t.add_argument("--out", required=True, type=Path, help="folder for model.safetensors + twin.json")
    t.add_argument("--quiet", action="store_true", help="no progress bar or loss log")
    from .streaming.cli import add_arguments, add_merge_command

    add_arguments(sub.add_parser("scan", help="streaming statistics over a corpus (resumable; "
                                 "torchrun -m residual_stream.scan for several processes)"))
    add_merge_command(sub)
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


def _families(args: argparse.Namespace) -> int:
    from .architectures import supported_architectures
    from .families import ARCHITECTURES, CONTAINERS, TEXT_LMS, WHOLE_TEXT_MODELS
    from .tower_families import TEXT_TOWERS

    for model_type in supported_architectures():
        path = CONTAINERS.get(model_type) or WHOLE_TEXT_MODELS.get(model_type)
        alone = ", loaded alone" if model_type in {*TEXT_LMS, *TEXT_TOWERS} else (
            ", analysed alone" if model_type in WHOLE_TEXT_MODELS else "")
        print(f"{model_type:<16} " + (ARCHITECTURES[model_type].family if model_type in ARCHITECTURES else
                                      f"the text model ({path}) of a multimodal model, described by its "
                                      f"text config's row{alone}"))
    return 0


def _anatomy(args: argparse.Namespace) -> int:
    model = load_on_terminal(args.model, device="cpu")
    for key, value in model.anatomy.summary().items():
        print(f"{key:>14}: {value}")
    norms = model.anatomy.norms_frame().to_string(index=False, float_format="{:.4g}".format)
    print(f"\nnorms (gain: γ + offset; bias_norm: ‖β‖):\n{norms}")
    print("\nstream program:\n" + model.anatomy.describe_program())
    return 0


def _check(args: argparse.Namespace) -> int:
    from .trace import trace

    model = load_on_terminal(args.model, device=args.device, dtype=args.dtype)
    report = trace(model, args.text, overflow=args.overflow).check()
    if args.verbose:
        print(report.to_frame().to_string(index=False))
    print(report)
    return 0 if report.ok else 1


def _summarize(args: argparse.Namespace) -> int:
    from .summary import DEFAULT_TEXTS, summarize

    model = load_on_terminal(args.model, device="cpu")
    numbers = summarize(model, args.text or DEFAULT_TEXTS, overflow=args.overflow)
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
    from .twins.train import TWIN_RECIPE, Recipe, save, train

    if args.out.exists() and not args.out.is_dir():
        raise InputError(f"--out {args.out} is a file: give a folder for the twin")
    if args.out.exists() and any(args.out.iterdir()) and not (args.out / "twin.json").exists():
        raise InputError(f"--out {args.out} exists and is not a twin folder: choose an empty one")
    config = TwinConfig(norm=args.norm, placement=args.placement, n_layers=args.layers,
                        d_model=args.d_model, n_heads=args.heads, d_mlp=args.d_mlp, mlp=args.mlp,
                        positions=args.positions, n_ctx=args.n_ctx)
    warmup = min(TWIN_RECIPE.warmup, args.steps) if args.warmup is None else args.warmup
    recipe = Recipe(steps=args.steps, batch=args.batch, lr=args.lr, warmup=warmup,
                    seed=args.seed, mix=Mix(seq_len=min(128, args.n_ctx),
                                            synthetic_fraction=args.synthetic_fraction))
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


def _trace_stats(args: argparse.Namespace) -> int:
    import torch
    from safetensors.torch import save_file

    from .trace import trace

    writable(args.out)
    model = load_on_terminal(args.model, device=args.device)
    tr = trace(model, args.text, overflow=args.overflow)
    n = model.anatomy.n_layers
    tensors = {
        "tokens": tr.tokens, "attention_mask": tr.attention_mask,
        "stream_norm": torch.stack([tr.stream(L).norm(dim=-1) for L in range(n + 1)]).cpu(),
        "attn_write_norm": torch.stack([tr.attn_write(L).norm(dim=-1) for L in range(n)]).cpu(),
        **{f"norm_scale.{k}": v.cpu() for k, v in tr.captured.norm_scale.items()},
    }
    if tr.captured.mlp_out:
        tensors["mlp_write_norm"] = torch.stack([tr.mlp_write(L).norm(dim=-1) for L in range(n)]).cpu()
    meta = {"model": model.name, "anatomy": json.dumps(model.anatomy.summary()),
            "str_tokens": json.dumps(tr.str_tokens), "texts": json.dumps(args.text)}
    tmp = args.out.with_name(f".{args.out.name}.partial")
    try:
        save_file({k: v.contiguous().float() if v.is_floating_point() else v.contiguous()
                   for k, v in tensors.items()}, str(tmp), metadata=meta)
        usual_permissions(tmp)
        os.replace(tmp, args.out)
    finally:
        tmp.unlink(missing_ok=True)
    print(f"wrote {args.out}: {', '.join(sorted(tensors))}")
    return 0


def _app(args: argparse.Namespace) -> int:
    app = app_path()
    if not 1 <= args.port <= 65535:
        raise InputError(f"--port {args.port} is not a port: give one from 1 to 65535")
    try:
        socket.getaddrinfo(args.host, args.port)
    except (socket.gaierror, UnicodeError):
        raise InputError(f"--host {args.host} does not resolve to an address: give 127.0.0.1 "
                         "(this machine only) or 0.0.0.0 (every interface)") from None
    missing = [p for p in args.allow if not Path(p).is_dir()]
    if missing:
        what = "a file, not a folder" if Path(missing[0]).exists() else "no such folder"
        raise InputError(f"--allow {missing[0]}: {what}; give a folder that exists")
    env = dict(os.environ, HF_HUB_OFFLINE=os.environ.get("HF_HUB_OFFLINE", "1"))
    if args.allow:
        env["RESIDUAL_STREAM_ALLOWED_DIRS"] = os.pathsep.join(str(Path(p).resolve()) for p in args.allow)
    cmd = [sys.executable, "-m", "streamlit", "run", str(app), "--server.address", args.host,
           "--server.port", str(args.port), "--server.headless", "true",
           "--browser.gatherUsageStats", "false", "--client.toolbarMode", "minimal"]
    if os.name == "posix":  # become the server: a signal sent to this process reaches it
        sys.stdout.flush()
        sys.stderr.flush()
        os.execve(sys.executable, cmd, env)
    return subprocess.call(cmd, env=env)


def _scan(args: argparse.Namespace) -> int:
    from .streaming.cli import merge_command, run

    return (merge_command if args.command == "merge" else run)(args)


COMMANDS = {"models": _models, "families": _families, "anatomy": _anatomy, "check": _check,
            "summarize": _summarize, "heads": heads_command, "composition": composition_command,
            "train": _train, "report": report_command, "trace": _trace_stats, "scan": _scan, "merge": _scan,
            "app": _app}


def main(argv: list[str] | None = None) -> int:
    """Entry point; returns the exit code (argparse exits with 2 on usage errors)."""
    args = _parser().parse_args(argv)
    return run_guarded(COMMANDS[args.command], args)


def run_guarded(command, args: argparse.Namespace) -> int:
    """Run ``command(args)``: library errors and file errors become exit code 1 and one line.

    The toolkit's warnings (a corpus byte read as U+FFFD, say) are one line on stderr too.
    """
    try:
        with one_line_warnings():
            return command(args)
    except ResidualStreamError as e:
        print(f"residual-stream: error: {as_options(str(e))}", file=sys.stderr)
        return 1
    except BrokenPipeError:  # whoever read the output stopped (``| head``): end quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no error at exit's flush
        return 0
    except OSError as e:  # unreadable or unwritable files found late
        print(f"residual-stream: error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
