"""The progress bars of the frameworks a load runs, hidden unless asked for (``progress``).

transformers' own bars (loading weights) answer to its switch; its GGUF reader's bar is a
plain ``tqdm`` that does not, so its module's name for it is swapped while a file is read.
Its load report (a table of unused weights) is held back where they are unused on purpose.
A command line shows the toolkit's own warnings as one line each (``one_line_warnings``).
"""

from __future__ import annotations

import contextlib
import functools
import sys
import threading
import warnings
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def framework_bars(shown: bool) -> Iterator[None]:
    """Hide the progress bars of transformers (loading weights) unless ``shown``."""
    from transformers.utils import logging as hf_logging

    hide = not shown and hf_logging.is_progress_bar_enabled()
    if hide:
        hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if hide:
            hf_logging.enable_progress_bar()


@contextlib.contextmanager
def quiet_load_report(quiet: bool) -> Iterator[None]:
    """Hold back transformers' load report while ``quiet``: this thread's warnings, not its errors.

    Loading a multimodal container's text LM alone (Llama 4's) leaves the vision tower's
    weights unused on purpose: the report would list each of them as unexpected. A filter on
    the logger drops only records this thread makes below ERROR, so a load on another thread
    at the same moment (the app's sessions) keeps its report, and no level is changed.
    """
    import logging

    log = logging.getLogger("transformers.modeling_utils")
    this = threading.get_ident()

    def others_or_errors(record: logging.LogRecord) -> bool:
        return record.thread != this or record.levelno >= logging.ERROR

    if quiet:
        log.addFilter(others_or_errors)
    try:
        yield
    finally:
        log.removeFilter(others_or_errors)


def terminal_bars() -> contextlib.AbstractContextManager[None]:
    """Show transformers' bars only where stderr is a terminal (the command line's loads).

    A log or a pipe then gets the command's own lines alone: a refusal is one line.
    """
    return framework_bars(sys.stderr.isatty())


def load_on_terminal(source: object, **options: object):
    """``loading.load(source, **options)`` with transformers' bars shown only on a terminal.

    How every command of the command line loads a model (``terminal_bars``).
    """
    from .loading import load

    with terminal_bars():
        return load(source, **options)


_GGUF_BAR = threading.Lock()  # held while transformers reads a GGUF file (``gguf_bar``)


@contextlib.contextmanager
def gguf_bar(shown: bool) -> Iterator[None]:
    """Hide transformers' GGUF "de-quantizing" bar unless ``shown``.

    It is a plain ``tqdm`` that ``disable_progress_bar`` does not reach: its module's name for
    it is swapped for a disabled one while the file is read, then put back. Loads of GGUF
    files take turns (``_GGUF_BAR``), so two threads cannot leave the swap in place.
    """
    from transformers import modeling_gguf_pytorch_utils as gguf_utils

    with _GGUF_BAR:
        bar = gguf_utils.tqdm
        if not shown:
            gguf_utils.tqdm = functools.partial(bar, disable=True)
        try:
            yield
        finally:
            gguf_utils.tqdm = bar


PACKAGE = Path(__file__).resolve().parent


@contextlib.contextmanager
def one_line_warnings() -> Iterator[None]:
    """Show warnings issued from the toolkit's code as ``residual-stream: warning: …`` lines.

    Others (a framework's) as Python shows them, with their file and line. Their advice is
    spelled as the command line takes it (``as_options``).
    """
    shown = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None) -> None:
        if Path(filename).resolve().is_relative_to(PACKAGE):
            print(f"residual-stream: warning: {as_options(str(message))}",
                  file=sys.stderr if file is None else file)
        else:
            shown(message, category, filename, lineno, file, line)

    with warnings.catch_warnings():  # puts showwarning back
        warnings.showwarning = show
        yield


def as_options(text: str) -> str:
    """A message's advice spelled as the command line takes it: ``--overflow chunk``.

    Not ``overflow="chunk"``; and ``--encoding-errors replace`` for ``encoding_errors='replace'``.
    How the command line shows the toolkit's errors and warnings (``cli.run_guarded``,
    ``one_line_warnings``).
    """
    from .inputs import CHUNK
    from .streaming.utf8 import REPLACE

    return text.replace(CHUNK, "--overflow chunk").replace(REPLACE, "--encoding-errors replace")
