"""The scan's command line, in one process or several (entry: ``python -m residual_stream.scan``).

    residual-stream scan MODEL CORPUS --stats growth,survival --out scan.json [--state scan.pt]
    python -m residual_stream.scan MODEL CORPUS ...                 (the same)
    torchrun --nproc-per-node 2 -m residual_stream.scan MODEL CORPUS ... --out scan.json

Under ``torchrun`` (``WORLD_SIZE > 1``) each process scans every ``WORLD_SIZE``-th segment of
the corpus (``--segment-chars`` of text each; it tokenizes no other: with ``--max-tokens``
the processes' reader threads exchange their segments' token counts, ``ledger``) and the
accumulators are merged across processes (gloo on the CPU, nccl
on the GPU, one GPU per process by ``LOCAL_RANK``); rank 0 writes ``--out``. ``--state`` gets
a ``.rank{r}`` suffix per process, so an interrupted multi-process scan resumes with the same
command. Process 0 alone shows the progress bar and warns of a file's bytes that are not UTF-8
(``--encoding-errors replace``): every process reads every text.
"""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path


def token_count(text: str) -> int:
    """A whole number of tokens, written ``1000000``, ``1_000_000`` or ``1e6``."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value.is_integer():
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number of tokens (e.g. 1000000 or 1e6)")
    digits = text.strip().lstrip("+-").replace("_", "").isdigit()
    return int(text) if digits else int(value)  # digits: exact past float's 2^53


def encoding_option(p: argparse.ArgumentParser) -> None:
    """``--encoding-errors``: ``Corpus.encoding_errors`` (its choices ``utf8.ENCODING_ERRORS``)."""
    from .utf8 import ENCODING_ERRORS

    p.add_argument("--encoding-errors", choices=ENCODING_ERRORS, default="strict",
                   help="bytes of a corpus file that are not UTF-8: strict (default) stops at the "
                        "first, naming it; replace reads them as U+FFFD, warning once per file")


def text_field_option(p: argparse.ArgumentParser) -> None:
    """``--text-field``: ``Corpus.text_field``, the field or column that holds each record's text."""
    p.add_argument("--text-field", default="text",
                   help="the field of a JSON Lines record (.jsonl, or .json as C4 ships them), or "
                        "the column of a Parquet or Arrow file, that holds its text (default: text)")


def add_arguments(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """The scan's arguments (shared by ``residual-stream scan`` and ``-m residual_stream.scan``)."""
    from . import STATS
    from .batching import ORDERS
    from .corpus import SEGMENT_CHARS

    p.add_argument("model", help="registry name, HF folder, .gguf file or cached hub id")
    p.add_argument("corpus", help="'builtin', a text file (one text per line), a JSON Lines file (.jsonl "
                                  "or .json, a text per record, see --text-field), either compressed "
                                  "(.gz, .xz, .bz2, .zst), a Parquet or Arrow file (its --text-field "
                                  "column), a folder of them, or hf:NAME, a 🤗 dataset streamed as it "
                                  "downloads (hf:HuggingFaceFW/fineweb-edu, or a local dataset folder; "
                                  "see --dataset-config, --split)")
    p.add_argument("--stats", default="growth",
                   help=f"comma-separated statistics: {','.join(STATS)} (default: growth); "
                        "options follow a colon, e.g. lens:every=16 (one token in 16; also "
                        "survival, read_attribution, subspaces), survival:granularity=head, "
                        "subspaces:pca_k=8:unembed_k=16, subspaces:basis=probe.pt (directions "
                        "[k, d_model] of your own, .pt/.npy/.safetensors), growth:top_k=100")
    p.add_argument("--batch-size", type=int, default=8, help="rows per forward pass (default: 8)")
    p.add_argument("--seq-len", type=int, help="tokens per row (default: min(context, 128))")
    p.add_argument("--max-tokens", type=token_count, help="stop after this many tokens (1000000 or 1e6)")
    p.add_argument("--order", choices=list(ORDERS), default="length",
                   help="length (default): each batch takes rows of about one length, sorted "
                        "longest first within every 32 batches, so it holds little padding; "
                        "text: rows in corpus order. The statistics are the same, but for "
                        "subspaces, whose stream PCs come from the first batch")
    text_field_option(p)
    p.add_argument("--dataset-config", help="an hf: corpus's configuration (hf:HuggingFaceFW/fineweb-edu "
                   "--dataset-config sample-10BT)")
    p.add_argument("--split", help="an hf: corpus's split (default: train)")
    encoding_option(p)
    p.add_argument("--segment-chars", type=int, default=SEGMENT_CHARS,
                   help="characters of text per corpus segment, the unit processes share and a "
                        f"resumed scan skips; batches never span two (default: {SEGMENT_CHARS})")
    p.add_argument("--state", type=Path,
                   help="save the scan state here (every --save-seconds) and resume from it")
    p.add_argument("--save-seconds", type=float, default=60.0,
                   help="seconds of scanning between state saves (default: 60; 0: every batch)")
    p.add_argument("--save-every", type=int,
                   help="save the state after every this many batches instead of by time")
    p.add_argument("--calibration", type=Path,
                   help="a scan saved whole (.pt) whose subspaces basis this scan takes instead of "
                        "fixing its own from its first batch, so that scans of a corpus's parts merge")
    p.add_argument("--out", type=Path, required=True,
                   help="the results: JSON (their frames, for any tool), or a .pt file (whole: "
                   "rs.load_scan reads it back without the model)")
    p.add_argument("--device", default="auto", help="auto (cuda, mps, cpu), cpu, cuda ...")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on cuda, else float32), float32 ...")
    p.add_argument("--no-graphs", action="store_true",
                   help="never replay the lean pass from CUDA graphs (default: replay on a CUDA "
                        "device when every statistic can be: all but per-head survival and "
                        "read_attribution)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    return p


def _distributed(requested: str) -> tuple[int, int, str | None]:
    """``(rank, world_size, device)``: joins the process group when launched by torchrun.

    ``requested`` (``--device``): ``auto`` (a GPU per process by ``LOCAL_RANK`` if there are
    GPUs, else the CPU), ``cuda`` or ``cpu``; a numbered device is refused, as every process
    would take the same one.
    """
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return 0, 1, None
    import torch
    import torch.distributed as dist

    from ..errors import InputError

    if requested not in ("auto", "cuda", "cpu"):
        raise InputError(f"under torchrun each process takes its own device: --device auto, cuda "
                         f"(cuda:LOCAL_RANK) or cpu, not {requested!r}")
    if requested == "cuda" and not torch.cuda.is_available():
        raise InputError("device 'cuda' is not on this machine: use --device cpu (or auto)")
    cuda = requested != "cpu" and torch.cuda.is_available()
    local = int(os.environ.get("LOCAL_RANK", "0"))
    if cuda and local >= torch.cuda.device_count():
        raise InputError(f"{os.environ.get('LOCAL_WORLD_SIZE', local + 1)} processes on this machine "
                         f"but {torch.cuda.device_count()} GPUs: --nproc-per-node at most that, or "
                         "--device cpu")
    device = f"cuda:{local}" if cuda else "cpu"
    if cuda:
        torch.cuda.set_device(device)
    dist.init_process_group("nccl" if cuda else "gloo")
    return dist.get_rank(), world, device


def _source(args: argparse.Namespace):
    """The corpus argument: a path or ``"builtin"``, or for ``hf:NAME`` the dataset, streamed."""
    from ..errors import InputError
    from .hf_datasets import HUB_PREFIX, open_stream

    if args.corpus.startswith(HUB_PREFIX):
        return open_stream(args.corpus[len(HUB_PREFIX):], args.dataset_config, args.split or "train")
    for option, value in (("--dataset-config", args.dataset_config), ("--split", args.split)):
        if value is not None:
            raise InputError(f"{option} is for a corpus hf:NAME (a 🤗 dataset), not {args.corpus!r}: "
                             f"leave {option} out")
    return args.corpus


def run(args: argparse.Namespace) -> int:
    """Run the scan the arguments describe; rank 0 writes the JSON. Returns the exit code."""
    from ..bars import load_on_terminal
    from ..files import not_an_input
    from .calibration import calibration_source
    from .corpus import Corpus
    from .runner import scan
    from .specs import make_accumulators
    from .utf8 import ReplacedBytesWarning

    not_an_input({"--state": args.state, "--out": args.out},
                 {"corpus": args.corpus, "--calibration": args.calibration})
    rank, world, device = _distributed(args.device)
    if rank > 0:  # every process reads every text: process 0 tells of each file's bad bytes
        warnings.filterwarnings("ignore", category=ReplacedBytesWarning)
    try:
        from ..files import writable

        if rank == 0:
            writable(args.out)  # before the scan, not after it
        if args.state is not None:
            writable(args.state)
        corpus = Corpus(_source(args), args.segment_chars, args.text_field,  # refused before loading
                        args.encoding_errors)
        # so is an unknown statistic or a bad option; the scan takes these accumulators
        accs = make_accumulators([s.strip() for s in args.stats.split(",") if s.strip()])
        calibration = None if args.calibration is None else calibration_source(args.calibration, accs)
        model = load_on_terminal(args.model, device=device or args.device, dtype=args.dtype,
                                 progress=not args.quiet)
        state = args.state if args.state is None or world == 1 else \
            args.state.with_name(f"{args.state.name}.rank{rank}")
        result = scan(model, corpus, list(accs.values()),
                      batch_size=args.batch_size, seq_len=args.seq_len, max_tokens=args.max_tokens,
                      order=args.order, state=state, save_every=args.save_every,
                      save_seconds=args.save_seconds, progress=not args.quiet,
                      rank=rank, world_size=world, graphs=False if args.no_graphs else "auto",
                      calibration=calibration)
        if rank == 0:
            result.save(args.out)
            print(f"residual-stream: scanned {result.tokens} tokens in {result.batches} batches "
                  f"({result.tokens_per_second:.0f} tokens/s this run); wrote {args.out}",
                  file=sys.stderr)
    finally:
        if world > 1:
            import torch.distributed as dist

            dist.destroy_process_group()
    return 0


def add_merge_command(sub) -> None:
    """Add ``merge`` (scans of disjoint corpus parts, saved whole, as one) to the subparsers ``sub``."""
    m = sub.add_parser("merge", help="merge scans of disjoint parts of a corpus, each saved whole "
                       "(scan --out part.pt), into one scan over all their tokens")
    m.add_argument("scans", nargs="+", type=Path, help="scans saved whole (.pt), of one model and "
                   "the same statistics and --seq-len")
    m.add_argument("--out", type=Path, required=True,
                   help="the merged scan: JSON (its frames) or a .pt file (whole)")


def merge_command(args: argparse.Namespace) -> int:
    """``residual-stream merge``: the scans merged (``merging.merge_scans``), written to ``--out``."""
    from ..files import not_an_input, writable
    from .merging import merge_scans

    not_an_input({"--out": args.out}, {f"scan {i}": p for i, p in enumerate(args.scans)})
    writable(args.out)
    merged = merge_scans(args.scans)
    merged.save(args.out)
    print(f"residual-stream: merged {len(args.scans)} scans: {merged.tokens} tokens in {merged.batches} "
          f"batches; wrote {args.out}", file=sys.stderr)
    return 0


def main(argv: list[str] | None = None) -> int:
    """``python -m residual_stream.scan``: parse, run, map errors to exit codes like the CLI."""
    from ..cli import run_guarded

    parser = add_arguments(argparse.ArgumentParser(prog="residual_stream.scan", description=__doc__))
    return run_guarded(run, parser.parse_args(argv))
