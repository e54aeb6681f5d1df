"""The ``residual-stream report`` command: its arguments, its texts, and the files it writes."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from .bars import load_on_terminal
from .errors import InputError
from .files import not_an_input, path_kind, writable

if TYPE_CHECKING:
    from .report import Leading


def add_report_command(sub) -> None:
    """Add ``report`` to the ``residual-stream`` subparsers ``sub``."""
    r = sub.add_parser("report", help="write an HTML report comparing models (plotly inlined)")
    r.add_argument("--model", action="append", default=[], help="model to compare (repeat)")
    r.add_argument("--scan", action="append", default=[], type=Path,
                   help="a scan saved whole (scan --out x.pt; repeat): its corpus statistics in a "
                   "section of their own, no model loaded (a report may hold only these)")
    src = r.add_mutually_exclusive_group()
    src.add_argument("--text", type=Path, help="a file of texts: one per non-empty line (.txt), or a JSON "
                     "Lines, Parquet or Arrow file (see --text-field), plain or .gz/.xz/.bz2/.zst")
    src.add_argument("--corpus", type=Path, help="folder of .txt files (one text per line) or JSON Lines "
                     "files (.jsonl, or .json as C4 ships them; a text per record, see --text-field), "
                     "plain or .gz/.xz/.bz2/.zst, or Parquet or Arrow files (a column of text)")
    src.add_argument("--builtin", action="store_true",
                     help="the shipped corpus of English sentences and code (the default)")
    from .streaming.cli import encoding_option, text_field_option, token_count  # the scan's parser's too

    encoding_option(r)
    text_field_option(r)

    r.add_argument("--max-tokens", type=token_count, default=1024, help="token budget per model (1024, 1e4)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--title", default="Residual-stream geometry")
    r.add_argument("--device", default="auto")
    r.add_argument("--out", type=Path, required=True, help="the HTML file to write")
    r.add_argument("--data", type=Path, help="also write the numbers as JSON here")
    r.add_argument("--quiet", action="store_true", help="no progress messages on stderr")


def _read_texts(args: argparse.Namespace) -> Leading:
    """The texts of ``--text``, ``--corpus`` or the built-in corpus, read lazily (``Leading``).

    A report reads only the leading texts that fill each model's ``--max-tokens``, so a large
    corpus is read no further than that. ``report_command`` reads the first before any model
    loads: a file that cannot be read, or an empty corpus, is said at once.
    """
    from .report import Leading
    from .streaming.corpus import Corpus

    text, corpus = _kind(args.text), _kind(args.corpus)
    if args.text is not None and text != "file":
        hint = ": it is a folder, give it as --corpus" if text == "folder" else (
            ": no such file (report reads its texts from a file, one per line; `check` and "
            "`trace` take --text as the text itself)") if text is None else f": it is {text}, not a file"
        raise InputError(f"--text {str(args.text)[:80]}{'…' if len(str(args.text)) > 80 else ''}{hint}")
    if args.corpus is not None and corpus != "folder":
        hint = ": it is a file, give it as --text" if corpus == "file" else (
            ": no such folder" if corpus is None else f": it is {corpus}, not a folder")
        raise InputError(f"--corpus {args.corpus}{hint}")
    return Leading(Corpus(args.text or args.corpus or "builtin", encoding_errors=args.encoding_errors,
                          text_field=args.text_field).texts())


def _kind(path: Path | None) -> str | None:
    """``files.path_kind``'s, or None where nothing usable is (a sentence over 255 bytes included)."""
    try:
        return None if path is None else path_kind(path, "the path")
    except InputError:
        return None


def _atomic_write(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path``, then rename: never a partial file."""
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def report_command(args: argparse.Namespace) -> int:
    """``residual-stream report``: the models analysed on the texts, the saved scans beside them."""
    from .errors import EmptyTextError
    from .report import build_report
    from .report_scans import scan_labels
    from .streaming.saved import load_scan

    for path in filter(None, (args.out, args.data)):
        writable(path)
    not_an_input({"--out": args.out, "--data": args.data},
                 {"--text": args.text, "--corpus": args.corpus,
                  **{f"--scan {i + 1}": p for i, p in enumerate(args.scan)}})
    if not args.model and not args.scan:
        raise InputError("give --model (repeat) to analyse models on texts, or --scan (a scan saved "
                         "whole, --out x.pt) to compare corpus statistics, or both")
    if not args.model and (args.text or args.corpus):
        raise InputError("--text and --corpus are the texts --model's analyses read; with --scan "
                         "alone the scans' own corpora are shown: give neither, or give --model")
    if args.max_tokens is not None and args.max_tokens < 1:
        raise InputError(f"--max-tokens must be positive, got {args.max_tokens}")
    twice = sorted({m for m in args.model if args.model.count(m) > 1})
    if twice:
        raise InputError(f"--model {twice[0]} is given twice: give each model once")
    scans = [load_scan(p) for p in args.scan]  # before any model loads: a bad file is said at once
    texts = _read_texts(args) if args.model else []
    if args.model and next(iter(texts), None) is None:  # its first text read: a bad file is said now
        raise EmptyTextError("the corpus is empty: give a file or folder with some text")
    say = None if args.quiet else (lambda m: print(f"residual-stream: {m}", file=sys.stderr, flush=True))
    models = [load_on_terminal(name, device=args.device, progress=not args.quiet) for name in args.model]
    page, data = build_report(models, texts, max_tokens=args.max_tokens, seed=args.seed,
                              title=args.title, progress=say,
                              scans=dict(zip(scan_labels(args.scan, scans), scans, strict=True)))
    _atomic_write(args.out, page)
    if args.data:
        _atomic_write(args.data, json.dumps(data, indent=1))
    if say:
        say(f"wrote {args.out}" + (f" and {args.data}" if args.data else ""))
    return 0
