"""The benchmark scripts that the GPU session runs (``benchmarks/gpu_rerun.sh``) run, on the CPU.

Device time comes rarely and as one short prepared call, so a script that a change in the
library broke (a renamed import, a variant gone) must fail here, not there. Each script of
``gpu_rerun.sh``'s steps runs as a subprocess, as that script calls it, on a model saved as
``gpu_setup.sh`` saves ``/tmp/smollm2-random`` (SmolLM2's config and tokenizer, random
weights; here 2 layers of width 64, float32), at tiny sizes; the variant lists are read from
``gpu_rerun.sh`` itself. Where a script checks something, its result is checked too: the
flow check's eager scans against each other on the CPU (no replay there) and the one-rank
merge of ``gpu_nccl.py`` over gloo.
"""

from __future__ import annotations

import json
import math
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch

BENCH = Path(__file__).resolve().parent.parent / "benchmarks"
RERUN = (BENCH / "gpu_rerun.sh").read_text(encoding="utf-8")
TOL = 1e-6  # relative: the flow check's scans on the CPU are the same eager float32 arithmetic
SIXTEEN_BIT = {"rs_lens_tf32"}  # lens:tf32 takes a 16-bit W_U; the tiny model here is float32

pytestmark = pytest.mark.slow


def _run(*args: str, timeout: int = 600) -> str:
    """Run a benchmark script as ``gpu_rerun.sh`` does; its stdout (it must exit 0)."""
    env = dict(os.environ, HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false")
    done = subprocess.run([sys.executable, *args], cwd=BENCH.parent, env=env, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


@pytest.fixture(scope="module")
def tiny_smollm2(smollm2, tmp_path_factory) -> str:
    """SmolLM2's architecture and tokenizer with random weights, 2 layers of width 64."""
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = smollm2.module.config.to_dict()
    cfg.update(num_hidden_layers=2, hidden_size=64, intermediate_size=128, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16)
    torch.manual_seed(0)
    path = tmp_path_factory.mktemp("smollm2-tiny")
    LlamaForCausalLM(LlamaConfig(**cfg)).save_pretrained(path)
    smollm2.tokenizer.save_pretrained(path)
    return str(path)


def test_every_benchmark_script_imports_and_has_a_main(monkeypatch):
    """Each script's imports (the library's names it reaches into) still resolve."""
    monkeypatch.syspath_prepend(str(BENCH))  # as when run as a script: its folder comes first
    scripts = sorted(BENCH.glob("*.py"))
    assert len(scripts) >= 15
    for script in scripts:
        module = runpy.run_path(str(script), run_name="benchmark_import")  # not "__main__"
        assert callable(module.get("main")) and module.get("__doc__"), script.name


def test_the_gpu_rerun_scripts_exist_and_parse():
    for script in set(re.findall(r"benchmarks/(\w+\.(?:py|sh))", RERUN)):
        assert (BENCH / script).exists(), script
    for shell in BENCH.glob("gpu_*.sh"):
        assert subprocess.run(["bash", "-n", str(shell)]).returncode == 0, shell.name


def test_the_flow_check_runs_and_its_eager_scans_agree(tiny_smollm2):
    out = _run("benchmarks/gpu_flow_check.py", "--model", tiny_smollm2, "--device", "cpu",
               "--dtype", "float32", "--batches", "2", "--batch-size", "2", "--seq-len", "32")
    got = json.loads(out.strip().splitlines()[-1])
    assert got["replays"] == got["sampled_replays"] == 0 and got["warnings"] == []
    for key in ("replayed_vs_eager", "fused_vs_eager", "sampled_replayed_vs_eager"):
        stats = {k.split(".")[0] for k in got[key]}
        assert {s.split(":")[0] for s in stats} == {"growth", "survival", "read_attribution",
                                                   "subspaces", "lens"}, key
        assert max(got[key].values()) <= TOL, key
    assert "tf32_vs_lens" not in got  # lens:tf32 takes a 16-bit model: checked in bf16
    out = _run("benchmarks/gpu_flow_check.py", "--model", tiny_smollm2, "--device", "cpu",
               "--dtype", "bfloat16", "--batches", "1", "--batch-size", "2", "--seq-len", "16")
    got = json.loads(out.strip().splitlines()[-1])
    sums = [{k.split(".", 1)[1] for k in got[key]} for key in ("tf32_vs_float32_products", "tf32_vs_lens")]
    assert sums[0] == sums[1] > {"kl", "rank_hist"}
    assert max(got["tf32_vs_float32_products"].values()) <= TOL  # the CPU: the same products


def test_scan_speed_runs_every_variant_the_gpu_steps_ask_for(tiny_smollm2, tmp_path):
    asked = [v for found in re.findall(r"--variants (\S+)", RERUN) for v in found.split(",")]
    wanted = list(dict.fromkeys(v for v in asked if v not in SIXTEEN_BIT))
    assert "hf_forward" == wanted[0] and len(wanted) >= 10
    size = ["--model", tiny_smollm2, "--device", "cpu", "--dtype", "float32", "--batches", "2",
            "--batch-size", "2", "--seq-len", "32", "--rounds", "1"]
    _run("benchmarks/scan_speed.py", *size, "--variants", ",".join(wanted),
         "--json", str(tmp_path / "speed.json"))
    timing = json.loads((tmp_path / "speed.json").read_text())["timing"]
    assert [r["variant"] for r in timing] == wanted
    assert all(math.isfinite(r["seconds_per_batch"]) and r["seconds_per_batch"] > 0 for r in timing)
    # side by side, as gpu_rerun.sh runs them: one row per variant, in the order asked for
    _run("benchmarks/scan_speed.py", *size, "--variants", "hf_forward,rs_stats,rs_survival",
         "--memory", "--memory-jobs", "2", "--json", str(tmp_path / "memory.json"))
    memory = json.loads((tmp_path / "memory.json").read_text())["memory"]
    assert [m["variant"] for m in memory] == ["hf_forward", "rs_stats", "rs_survival"], memory
    assert all(m["peak_bytes"] >= max(m["over_loaded_bytes"], 1) for m in memory), memory


def test_the_lens_tf32_study_runs_on_a_bf16_model(tiny_smollm2, tmp_path):
    """``lens_tf32.py`` scans ``lens`` and ``lens:tf32=true``: one row per point, finite changes."""
    _run("benchmarks/lens_tf32.py", "--model", tiny_smollm2, "--batches", "1", "--batch-size", "2",
         "--seq-len", "16", "--json", str(tmp_path / "tf32.json"))
    got = json.loads((tmp_path / "tf32.json").read_text())
    assert got["dtype"] == "torch.bfloat16" and len(got["points"]) == 3  # 2 blocks: 3 points
    assert all(math.isfinite(p["rel_change"]) and p["kl"] >= 0 for p in got["points"])
    # TF32 inputs move a mean KL by float32-rounding orders, not more (SmolLM2: ≤ 2.5e-5)
    assert all(abs(p["kl_tf32"] - p["kl"]) <= 1e-3 * p["kl"] + 1e-6 for p in got["points"])
    assert got["worst"]["top1_changed"] <= got["worst"]["token_points"] // 100


def test_the_reader_step_runs(tiny_smollm2, tmp_path):
    model = ["--model", tiny_smollm2, "--device", "cpu", "--dtype", "float32"]
    _run("benchmarks/corpus_speed.py", *model, "--scan", "--texts", "200", "--rounds", "1",
         "--out", str(tmp_path / "corpus"))
    rows = json.loads((tmp_path / "corpus.json").read_text())
    assert {r["corpus"] for r in rows if r["variant"] == "scan_growth"} == {"lines", "documents"}
    assert all(r["tokens"] > 0 and r["s"] > 0 for r in rows)
    _run("benchmarks/batch_order.py", *model, "--batch-size", "2", "--seq-len", "32",
         "--corpora", "lines", "--rounds", "1", "--out", str(tmp_path / "order"))
    order = json.loads((tmp_path / "order.json").read_text())
    assert [r["corpus"] for r in order] == ["lines"] and order[0]["tokens_length"] == order[0]["tokens_text"]
    _run("benchmarks/state_save.py", *model, "--batch-size", "2", "--seq-len", "32", "--batches", "2",
         "--rounds", "1", "--out", str(tmp_path / "state"))
    saves = json.loads((tmp_path / "state.json").read_text())
    assert saves and all(r["mb"] > 0 and r["save_ms"] > 0 for r in saves if "stat" in r)


def test_the_one_rank_merge_over_gloo_equals_the_scan(tiny_smollm2):
    out = _run("benchmarks/gpu_nccl.py", "--model", tiny_smollm2, "--backend", "gloo",
               "--device", "cpu")
    got = json.loads(out.strip().splitlines()[-1])
    assert got["backend"] == "gloo" and got["max_abs_diff"] == 0.0 and got["sums"] > 0
    assert got["tokens"][0] == got["tokens"][1] > 0 and got["batches"][0] == got["batches"][1]


def test_the_replay_host_script_times_each_statistic_beside_the_forward(tiny_smollm2, tmp_path):
    out = tmp_path / "host.json"
    _run("benchmarks/replay_host.py", "--model", tiny_smollm2, "--batch-size", "2", "--seq-len", "16",
         "--rounds", "2", "--stats", "growth;survival,lens", "--json", str(out))
    rows = json.loads(out.read_text())
    assert [r["what"] for r in rows] == ["hf_forward", "host of growth", "host of survival,lens"]
    assert all(r["ms"] > 0 and math.isfinite(r["ratio"]) for r in rows) and rows[0]["ratio"] == 1.0


def test_the_lens_ab_runs_an_earlier_lens_beside_the_current_one(tiny_smollm2, tmp_path, monkeypatch):
    """``lens_ab.py`` loads ``lens.py`` from git as a module of its own and times both lenses."""
    monkeypatch.syspath_prepend(str(BENCH))
    lens_at = runpy.run_path(str(BENCH / "lens_ab.py"), run_name="benchmark_import")["lens_at"]
    before = lens_at("HEAD")
    from residual_stream.streaming import lens

    assert before.LensSums is not lens.LensSums
    assert before.LensSums.logits.__globals__["__name__"] == "lens_before"  # its helpers, not ours
    _run("benchmarks/lens_ab.py", "--before", "HEAD", "--model", tiny_smollm2, "--dtype", "float32",
         "--batch-size", "2", "--seq-len", "16", "--rounds", "1", "--json", str(tmp_path / "ab.json"))
    rows = json.loads((tmp_path / "ab.json").read_text())["rows"]
    assert [r["variant"] for r in rows] == ["hf_forward", "lens at HEAD", "lens now"]
    assert all(math.isfinite(r["seconds"]) and r["seconds"] > 0 for r in rows)


def test_the_packing_benchmark_runs_and_reads_every_packing(tmp_path):
    """``packing_speed.py`` (not a GPU step): every packing read, the same texts as the plain file
    (the script asserts it), a ratio per packing."""
    _run("benchmarks/packing_speed.py", "--mb", "0.05", "--rounds", "1", "--out", str(tmp_path / "packing"))
    rows = json.loads((tmp_path / "packing.json").read_text())
    assert [r["packing"] for r in rows] == ["plain", ".gz", ".xz", ".bz2", ".zst"]
    assert rows[0]["ratio_to_plain"] == 1 and all(r["seconds"] > 0 and r["file_mb"] > 0 for r in rows)


@pytest.mark.slow
def test_the_gguf_first_load_benchmark_parses_once_and_gets_the_same_model(tmp_path):
    """``gguf_first_load.py`` on a one-block GGUF: each way's load equal to the warm-up's (the script
    asserts it), transformers' parses and name tables counted: several plain, one shared."""
    from gguf_tiny import one_block

    path = one_block(tmp_path / "one.gguf")
    _run("benchmarks/gguf_first_load.py", "--gguf", str(path), "--rounds", "1", "--out", str(tmp_path / "g"))
    plain, shared = json.loads((tmp_path / "g.json").read_text())
    assert (plain["way"], shared["way"]) == ("plain", "shared") and plain["ratio_to_plain"] == 1
    assert plain["parses"] > 1 and plain["name_maps"] > 1 and shared["parses"] == shared["name_maps"] == 1


@pytest.mark.slow
def test_the_report_reading_benchmark_reads_the_leading_texts_only(tmp_path):
    """``report_reading.py`` on 500 records (the script asserts both ways report the same
    numbers): read whole, all 500 are read; lazily, the texts the budget used and one more."""
    _run("benchmarks/report_reading.py", "--records", "500", "--models", "twin-pre-rms", "--max-tokens", "64",
         "--rounds", "1", "--out", str(tmp_path / "r"))
    whole, lazy = json.loads((tmp_path / "r.json").read_text())
    assert (whole["way"], lazy["way"]) == ("whole", "lazily") and whole["seconds_ratio"] == 1
    assert whole["texts_read"] == 500 and whole["texts_used"] == lazy["texts_used"]
    assert lazy["texts_read"] == lazy["texts_used"] + 1
