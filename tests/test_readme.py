"""The README's code, run as written: its API block, its scan example and every line of its
command-line block (the README is the truth for a new user; these fail when it drifts).

Only what the code needs to run here changes: ``corpus.txt`` is written first (the first 40
lines of the built-in corpus), every output goes to a temporary folder, the placeholders
``A``/``B`` of the report line become the two twins of the Reports section, options in
``[...]`` are left out (each is tested where its command is), and ``torchrun`` gets a free
port. A line the test does not run is named in ``NOT_RUN`` with where it is tested instead,
and a new line that is neither run nor named fails the test.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from conftest import REL_F32, max_rel_error

import residual_stream as rs
from residual_stream.cli import main
from residual_stream.streaming.sources import builtin_corpus

README = Path(__file__).resolve().parent.parent / "README.md"
NOT_RUN = {  # command → where it is tested instead
    "app": "test_browser.py serves the app with this command and clicks through every page",
    "train": "test_twins.py::test_cli_trains_a_twin_that_loads (at its defaults it trains for minutes)",
    "merge": "test_merging.py::test_cli_merges_saved_parts_and_refuses_a_part_given_twice (it needs "
             "the parts' scans)",
}
PLACEHOLDERS = {"A": "twin-pre-rms", "B": "twin-post-ln"}


def block(after_heading: str, language: str, nth: int = 0) -> str:
    """The ``nth`` fenced ``language`` block of the README's section ``after_heading``."""
    text = README.read_text("utf-8")
    section = text.split(f"\n## {after_heading}\n", 1)[1].split("\n## ", 1)[0]
    return re.findall(rf"```{language}\n(.*?)```", section, re.S)[nth]


def command_lines() -> list[list[str]]:
    """The CLI block's commands as argument lists: comments and ``[...]`` options dropped."""
    lines = []
    for line in block("The CLI", "bash").splitlines():
        line = re.sub(r"\[[^\]]*\]", "", re.split(r"\s+#\s", line)[0]).strip()
        if line:
            lines.append(shlex.split(line))
    return lines


@pytest.fixture(scope="module")
def workdir(tmp_path_factory) -> Path:
    """A folder holding ``corpus.txt`` and ``part-0.txt``: where the README's relative paths are read
    and written."""
    folder = tmp_path_factory.mktemp("readme")
    (folder / "corpus.txt").write_text("\n".join(builtin_corpus()[:40]) + "\n", "utf-8")
    (folder / "part-0.txt").write_text("\n".join(builtin_corpus()[40:52]) + "\n", "utf-8")
    return folder


@pytest.fixture(scope="module")
def api() -> dict:
    """The namespace of the README's API block, run as written."""
    names: dict = {}
    exec(compile(block("The API in five lines", "python"), "README: the API in five lines", "exec"),
         names)
    return names


def test_the_api_in_five_lines_does_what_its_comments_say(api):
    """``parts.total()`` is ``trace.stream(12)`` to 1e-4 of the stream's RMS, and the
    conservation report passes, as the README's comments say."""
    trace, parts = api["trace"], api["parts"]
    assert max_rel_error(parts.total(), trace.stream(12), trace.attention_mask) <= REL_F32
    assert "L3H5" in parts.labels and "embed" in parts.labels
    assert trace.check().ok


def test_the_scan_example_runs_as_written(api, workdir, monkeypatch):
    """The scan block, on ``corpus.txt``: its statistics, its state and its JSON file."""
    monkeypatch.chdir(workdir)
    names = dict(api)
    exec(compile(block("Corpora at scale: `rs.scan`", "python"), "README: rs.scan", "exec"), names)
    scan = names["scan"]
    lens = scan.stats["lens:every=16"]
    points = names["model"].anatomy.n_layers + 1
    assert scan.tokens > 0 and list(lens["point"]) == list(range(points))
    assert (lens["tokens"] > 0).all() and np.isfinite(lens["kl"]).all()
    assert (workdir / "scan.pt").is_file()
    assert json.loads((workdir / "scan.json").read_text())["tokens"] == scan.tokens
    assert names["saved"].to_dict() == json.loads((workdir / "scan.json").read_text())
    lines = list(names["load_dataset"]("text", data_files="corpus.txt", split="train")["text"])  # unstripped
    want = names["rs"].scan(names["model"], lines, "growth", progress=False)
    assert names["rows"].tokens == want.tokens and names["rows"].batches == want.batches
    budget = names["rs"].scan(names["model"], lines, "growth", max_tokens=500, progress=False)
    assert names["first"].tokens == budget.tokens == 500
    assert names["first"].stats["growth"].to_frame().equals(budget.stats["growth"].to_frame())


def test_the_report_line_runs_as_written(workdir, monkeypatch, capsys):
    """The Reports section's command: both files written."""
    monkeypatch.chdir(workdir)
    argv = shlex.split(block("Reports", "bash").strip())
    assert argv[0] == "residual-stream" and main(argv[1:]) == 0, capsys.readouterr().err
    assert (workdir / "report.html").stat().st_size > 0
    assert set(json.loads((workdir / "report.json").read_text())["models"]) >= set(PLACEHOLDERS.values())


def test_every_line_of_the_cli_block_runs(workdir, monkeypatch, capsys):
    """Each ``residual-stream`` line exits 0 (in this process); the ``torchrun`` line writes its
    scan; the lines not run are the ones ``NOT_RUN`` names."""
    monkeypatch.chdir(workdir)
    ran, skipped = [], []
    for argv in command_lines():
        if argv[0] == "torchrun":
            continue
        assert argv[0] == "residual-stream", argv
        if argv[1] in NOT_RUN:
            skipped.append(argv[1])
            continue
        argv = [PLACEHOLDERS.get(a, a) for a in argv]
        code = main(argv[1:])
        assert code == 0, (argv, capsys.readouterr().err[-2000:])
        ran.append(argv[1])
    capsys.readouterr()
    assert sorted(skipped) == sorted(NOT_RUN), "a line named in NOT_RUN is gone from the README"
    assert {"models", "families", "anatomy", "check", "summarize", "heads", "composition", "report",
            "trace", "scan"} <= set(ran), ran
    assert (workdir / "stats.safetensors").is_file() and (workdir / "r.html").is_file()
    assert json.loads((workdir / "scan.json").read_text())["tokens"] > 0
    bases = [rs.load_scan(workdir / name).accumulators["subspaces"].meta["pca_basis"]
             for name in ("calibration.pt", "part-0.pt")]
    assert torch.equal(*bases)  # the part took the calibration's basis, of other texts


def test_the_torchrun_line_runs_as_written(workdir, monkeypatch):
    """``torchrun --nproc-per-node 2 -m residual_stream.scan ...`` (with a free port): two
    processes write one scan, of the same tokens as one process's."""
    argv = next(a for a in command_lines() if a[0] == "torchrun")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--master-port", str(port),
                          *argv[1:]], cwd=workdir, capture_output=True, text=True, timeout=600,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert out.returncode == 0, out.stderr[-3000:]
    two = json.loads((workdir / "scan.json").read_text())
    monkeypatch.chdir(workdir)
    args = argv[argv.index("-m") + 2:]
    out_at = args.index("--out")
    assert main(["scan", *args[:out_at], *args[out_at + 2:], "--out", "one.json"]) == 0
    one = workdir / "one.json"
    assert two["tokens"] == json.loads(one.read_text())["tokens"] > 0
