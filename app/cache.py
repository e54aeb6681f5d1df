"""Every cache of the app, in one place.

``st.cache_resource`` for models and traces (large, shared, never mutated);
``st.cache_data`` for small CPU results (registry table, analysis results, experiments).
All keys are plain strings, so any page asking for the same (model, text) reuses the work.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import tempfile
import threading
from collections import OrderedDict
from pathlib import Path

import pandas as pd
import streamlit as st
import torch

import residual_stream as rs
import residual_stream.experiments as ex
from residual_stream.errors import InputError

TEXT_RESULTS = 64  # (model, text) results each cache keeps: a served app meets many texts


@st.cache_resource(show_spinner="Loading the model (the first SmolLM2 load dequantizes, ~10 s)…",
                   max_entries=4)
def model(name: str) -> rs.Model:
    """A loaded model, shared by every session (read-only); the 4 last used stay loaded."""
    return rs.load(name, progress=False)


@st.cache_resource(show_spinner="Tracing…", max_entries=16)
def trace(name: str, text: str) -> rs.Trace:
    """One trace (with attention patterns) of ``text`` on model ``name``."""
    return rs.trace(model(name), text, patterns=True)


@st.cache_data(show_spinner=False)
def registry() -> pd.DataFrame:
    """The registry table."""
    return rs.list_models()


@st.cache_data(show_spinner="Checking conservation…", max_entries=TEXT_RESULTS)
def conservation(name: str, text: str) -> pd.DataFrame:
    """The conservation report as a table."""
    return trace(name, text).check().to_frame()


@st.cache_data(show_spinner="Measuring norm growth…", max_entries=TEXT_RESULTS)
def norm_growth(name: str, text: str):
    """``rs.norm_growth``."""
    return rs.norm_growth(trace(name, text))


Basis = tuple[str, bytes] | None  # an uploaded basis file: (its name, its bytes)


@st.cache_data(show_spinner="Splitting every write into subspaces…", max_entries=TEXT_RESULTS)
def write_subspaces(name: str, text: str, basis: Basis = None):
    """``rs.write_subspaces`` for every attention total and MLP; ``basis``: an upload's (``basis_rows``)."""
    return rs.write_subspaces(trace(name, text), basis=basis_rows(basis))


@st.cache_data(show_spinner=False, max_entries=8)
def basis_rows(basis: Basis, d_model: int | None = None):
    """The rows ``[k, d_model]`` an uploaded file holds, or rows by name (``streaming.basis.load_basis``).

    None for none. ``InputError`` for a file that is no basis, or (given ``d_model``) one of another
    width: the page says why.
    """
    import io

    from residual_stream.analyses.subspaces import named_bases
    from residual_stream.streaming.basis import load_basis

    if basis is None:
        return None
    upload = io.BytesIO(basis[1])
    upload.name = basis[0]
    rows = load_basis(upload)
    if d_model is not None:
        named_bases(rows, d_model)  # the width checked
    return rows


@st.cache_data(show_spinner="Attributing every read…", max_entries=TEXT_RESULTS)
def read_matrix(name: str, text: str, level: str) -> pd.DataFrame:
    """Mean |share| read-attribution matrix at ``level``."""
    return rs.read_attribution(trace(name, text)).matrix(level, absolute=True)


@st.cache_resource(show_spinner="Computing composition scores (SmolLM2: about 5 s)…", max_entries=4)
def composition(name: str, through_norms: bool = True):
    """``rs.composition`` of the model: weights only, computed once per model and setting."""
    return rs.composition(model(name), through_norms=through_norms)


@st.cache_data(show_spinner="Scoring every head on repeated random tokens…")
def head_scores(name: str):
    """``rs.head_scores``: previous-token, duplicate-token and induction scores per head."""
    return rs.head_scores(model(name))


@st.cache_data(show_spinner="Following every write…", max_entries=TEXT_RESULTS)
def survival(name: str, text: str):
    """``rs.survival`` at component granularity."""
    return rs.survival(trace(name, text))


@st.cache_data(show_spinner="Running the logit lens…", max_entries=TEXT_RESULTS)
def logit_lens(name: str, text: str):
    """``rs.logit_lens``."""
    return rs.logit_lens(trace(name, text))


@st.cache_data(show_spinner="Attributing the logits…", max_entries=TEXT_RESULTS)
def logit_attribution(name: str, text: str, target: str | int, baseline: int | None):
    """``rs.direct_logit_attribution`` at every token (``target``: ``"top"``, ``"next"`` or an id)."""
    return rs.direct_logit_attribution(trace(name, text), target=target, baseline=baseline)


@st.cache_data(show_spinner="Patching the stream at every point and token (SmolLM2: about 10 s measured, "
                            "under a second estimated)…",
               max_entries=TEXT_RESULTS)
def stream_patching(name: str, text: str, corrupted: str, pos: int, target: int, baseline: int | None,
                    estimate: bool = False):
    """``rs.patch_stream`` from ``corrupted`` into ``text`` (``estimate``: ``rs.attribution_patching``).

    The metric: the ``target``'s logit (minus the ``baseline``'s) at token ``pos``, the only
    position the measured runs unembed (``logits_at``).
    """
    args = trace(name, text), trace(name, corrupted), _logit_metric(pos, target, baseline)
    return rs.attribution_patching(*args) if estimate else rs.patch_stream(*args, logits_at=pos)


def _logit_metric(pos: int, target: int, baseline: int | None):
    """The target's logit (minus the baseline's) at token ``pos`` of the first text, as a tensor."""
    def metric(logits):
        base = logits[0, pos, baseline] if baseline is not None else torch.zeros((), device=logits.device)
        return logits[0, pos, target] - base
    return metric


@st.cache_data(show_spinner="Estimating every head's patch (one backward pass)…", max_entries=TEXT_RESULTS)
def head_patching(name: str, text: str, corrupted: str, pos: int, target: int, baseline: int | None):
    """``rs.attribution_patching_writes`` of every head, as ``stream_patching``'s metric."""
    return rs.attribution_patching_writes(trace(name, text), trace(name, corrupted),
                                          _logit_metric(pos, target, baseline))


@st.cache_data(show_spinner="Patching each head in a run of its own…", max_entries=TEXT_RESULTS)
def head_patching_measured(name: str, text: str, corrupted: str, pos: int, target: int,
                           baseline: int | None, heads: tuple[str, ...]) -> pd.DataFrame:
    """``ablation_check(mode="patch", reads=False)`` of ``heads``: each one's measured metric change."""
    check = rs.ablation_check(trace(name, text), writes=list(heads), mode="patch",
                              reference=trace(name, corrupted), metric=_logit_metric(pos, target, baseline),
                              reads=False)
    return check.outputs()[["write", "metric_change"]]


@st.cache_data(show_spinner="Patching each head's path into the receivers (a run each)…",
               max_entries=TEXT_RESULTS)
def path_patching(name: str, text: str, corrupted: str, pos: int, target: int, baseline: int | None,
                  receivers: tuple[str, ...]):
    """``rs.path_patch`` of every head into each of ``receivers``, as ``stream_patching``'s metric."""
    return rs.path_patch(trace(name, text), trace(name, corrupted), _logit_metric(pos, target, baseline),
                         receivers=list(receivers), logits_at=pos)


@st.cache_data(show_spinner=False)  # the page's spinner says how long each one takes
def experiment(kind: str):
    """One norm-lab experiment at sizes that keep the app responsive."""
    runs = {
        "forward": lambda: ex.forward_norms_at_init(n_layers=24, d_model=64),
        "gradients": lambda: ex.gradient_norms_at_init(n_layers=12, d_model=64, depths=(4, 8, 16)),
        "deepnorm": lambda: ex.deepnorm_update(n_layers=48, d_model=16, steps=10, batch=4),
        "norms": lambda: ex.layernorm_vs_rmsnorm(d_models=(576,), tokens=2048, repeats=10),
        "warmup": lambda: ex.warmup_sensitivity(steps=150, warmup=50, n_layers=6, d_model=48,
                                                lrs=(1e-3,), batch=8),
    }
    return runs[kind]()


@st.cache_resource(show_spinner="Collecting every write…", max_entries=4)
def writes(name: str, text: str) -> dict:
    """Every head, attention total and MLP write as added, for the text: label → [pos, d_model]."""
    from residual_stream.analyses.subspaces import writes_as_added

    tr = trace(name, text)
    labels = {lab for c in tr.anatomy.components for lab in
              ([c.name] + [f"L{c.layer}H{h}" for h in range(tr.anatomy.n_heads)]
               if c.kind == "attn" else [c.name])}
    return {k: v[0] for k, v in writes_as_added(tr, labels).items()}


@st.cache_resource(show_spinner="Building subspaces…", max_entries=4)
def subspaces(name: str, text: str, basis: Basis = None) -> list:
    """The ordered subspaces of the Writes page: mean, unembedding (if any), stream PCs, an upload's."""
    from residual_stream.analyses.subspaces import named_subspaces, pca_subspace

    return named_subspaces(model(name), pca_subspace(trace(name, text), k=16), basis=basis_rows(basis))


@st.cache_data(show_spinner=False, max_entries=256)
def split(name: str, text: str, write: str, pos: int, basis: Basis = None):
    """``orthogonal_split`` of one write at one token: ``(names, fractions [part])``."""
    from residual_stream.analyses.subspaces import orthogonal_split

    names, fractions = orthogonal_split(writes(name, text)[write][pos], subspaces(name, text, basis))
    return names, fractions


@st.cache_data(show_spinner=False)
def builtin_tokens(name: str) -> int:
    """How many tokens model ``name`` reads in the built-in corpus (its texts as a scan reads them)."""
    from residual_stream.streaming import Corpus
    from residual_stream.streaming.batching import segment_tokens

    return sum(segment_tokens(model(name), s) for s in Corpus("builtin").segments())


SCANS = 8  # finished scans kept


def _with_basis(stats: tuple[str, ...], rows) -> list:
    """``stats``, its ``subspaces`` spec made an accumulator measuring ``rows`` too (None: as they are)."""
    from residual_stream.streaming import SubspaceStats
    from residual_stream.streaming.specs import parse_spec

    if rows is None:
        return list(stats)
    return [SubspaceStats(**{k: getattr(a, k) for k in a.OPTIONS if k != "basis"}, basis=rows)
            if isinstance(a := parse_spec(s), SubspaceStats) else s for s in stats]


@st.cache_resource
def _scans() -> tuple[OrderedDict, threading.Lock]:
    """The scans every session shares (oldest first) and the lock that guards the dict."""
    return OrderedDict(), threading.Lock()


def scan(name: str, corpus: str, max_tokens: int, stats: tuple[str, ...], encoding_errors: str = "strict",
         on_batch=None, basis: Basis = None, text_field: str = "text") -> rs.streaming.ScanResult:
    """``rs.scan`` of ``corpus`` (``"builtin"``, a checked path or an upload's) up to ``max_tokens`` tokens.

    ``encoding_errors``, ``text_field``: ``rs.Corpus``'s (``"replace"`` reads bytes that are not
    UTF-8 as U+FFFD; the JSON Lines field or Parquet/Arrow column holding each text).
    ``basis``: an uploaded file of directions, which the ``subspaces`` statistic takes
    (``SubspaceStats(basis=)``; refused as ``basis_rows`` refuses it).

    Kept by the corpus's ``Corpus.fingerprint()`` too (a path's files as they are now: files
    edited or replaced at the same path are scanned again). ``on_batch(key, tokens)`` after
    each batch of a scan that runs (not on a kept one). Kept by hand, not by
    ``st.cache_resource``: that replays the elements a call drew on the next hit, and a
    progress bar drawn outside the call cannot be replayed (``CacheReplayClosureError`` on
    every rerun after a scan). Two sessions asking for one scan at once wait for a single run.
    """
    asked = _with_basis(stats, basis_rows(basis, model(name).anatomy.d_model))
    source = rs.streaming.Corpus(corpus, encoding_errors=encoding_errors, text_field=text_field)
    version = "" if corpus == "builtin" else source.fingerprint()
    key = (name, corpus, max_tokens, tuple(getattr(s, "spec", s) for s in asked), encoding_errors, version,
           text_field)
    kept, lock = _scans()
    with lock:
        entry = kept.setdefault(key, [threading.Lock(), None])  # [its run's lock, its result]
        kept.move_to_end(key)
    with entry[0], st.spinner("Scanning the corpus, batch by batch…"):
        try:  # the first to ask runs it
            if entry[1] is None:
                entry[1] = rs.scan(model(name), source, asked, batch_size=8, seq_len=128,
                                   max_tokens=max_tokens, progress=False, on_batch=on_batch)
        except BaseException:  # nothing kept: the next to ask runs it again
            with lock:
                if kept.get(key) is entry:
                    del kept[key]
            raise
    with lock:
        while len(kept) > SCANS:
            kept.popitem(last=False)
    return entry[1]


UPLOADS = "residual-stream-uploads"  # the folder, in the system's temporary folder, of uploaded corpora
UPLOADS_KEPT = 16  # uploads kept there, the last used (each at most Streamlit's server.maxUploadSize)


def stored_upload(files) -> str:
    """The path a scan reads uploaded corpus files from: the one file, or a folder holding several.

    ``files``: Streamlit's uploaded files (``.name``, ``.getvalue()``), or ``(name, bytes)``
    pairs. Written once per content to ``<temp>/residual-stream-uploads/<sha256 prefix>/``: a
    scan reads its corpus from a path, more than once (its first batch, a resumed scan); a
    folder's files are read in name order. Each name keeps its suffixes (they say how the file
    is read: ``.jsonl.gz``), reduced to its last part and to letters, digits, ``.``, ``_`` and
    ``-`` (the browser sends it); two files of one name are refused (``InputError``). Each is
    written to a ``.part`` file and renamed, so a session never reads half of one; the same
    files uploaded again reuse the copy. Only the ``UPLOADS_KEPT`` last used are kept, so a
    served app does not fill its disk.
    """
    pairs = [(f.name, f.getvalue()) if hasattr(f, "getvalue") else tuple(f) for f in files]
    named = [(_safe_name(name), data) for name, data in pairs]
    if not named:
        raise InputError("no corpus file was uploaded: upload one or more")
    twice = sorted({n for n, _ in named if [m for m, _ in named].count(n) > 1})
    if twice:
        raise InputError(f"two uploaded files are named {twice[0]!r}: rename one, or upload them apart")
    digest = hashlib.sha256()
    for name, data in sorted(named):
        digest.update(name.encode() + b"\0" + hashlib.sha256(data).digest())
    root = uploads()
    folder = root / digest.hexdigest()[:24]
    with _uploads_lock():
        for name, data in named:
            path = folder / name
            if not (path.is_file() and path.stat().st_size == len(data)):
                folder.mkdir(parents=True, exist_ok=True)
                part = folder / f".{name}.{os.getpid()}.{threading.get_ident()}.part"
                part.write_bytes(data)
                os.replace(part, path)
        os.utime(folder)  # used now
        for old in sorted(root.iterdir(), key=_used, reverse=True)[UPLOADS_KEPT:]:
            shutil.rmtree(old, ignore_errors=True)
    return str(folder / named[0][0] if len(named) == 1 else folder)


def _safe_name(name: str) -> str:
    """An uploaded file's name as stored: its last part, in letters, digits, ``.``, ``_`` and ``-``."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", Path(name.replace("\\", "/")).name).lstrip("._") or "corpus.txt"


def uploads() -> Path:
    """The folder of uploaded corpora (``stored_upload``), in the system's temporary folder."""
    return Path(tempfile.gettempdir(), UPLOADS)


def _used(folder: Path) -> int:
    """When an upload's folder was last used (0: gone already, dropped by another app's process)."""
    try:
        return folder.stat().st_mtime_ns
    except OSError:
        return 0


@st.cache_resource
def _uploads_lock() -> threading.Lock:
    """The lock every session takes to store an upload or drop an old one."""
    return threading.Lock()
