"""How long the default report takes: two twins on the built-in corpus.

The target is under a minute on the 2-core CPU. The baseline, run side by side in this
process, is a plain forward pass of both models over the same texts; the ratio is what the
analyses cost on top of it.

    python benchmarks/report_speed.py [--models twin-pre-rms twin-post-ln] [--repeats 2]
"""

from __future__ import annotations

import argparse
import time

import torch

import residual_stream as rs
from residual_stream.inputs import encode
from residual_stream.report import build_report, select_texts
from residual_stream.streaming.corpus import builtin_corpus


def main() -> None:
    """Time the report and the baseline; print one Markdown table row."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--models", nargs="+", default=["twin-pre-rms", "twin-post-ln"])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    models = [rs.load(m) for m in args.models]
    texts = builtin_corpus()
    report_s, forward_s = [], []
    for _ in range(args.repeats):
        t = time.perf_counter()
        for m in models:
            batch = encode(m, select_texts(m, texts, 1024), overflow="chunk")
            with torch.inference_mode():
                m.module(batch.tokens, attention_mask=batch.attention_mask)
        forward_s.append(time.perf_counter() - t)
        t = time.perf_counter()
        build_report(models, texts)
        report_s.append(time.perf_counter() - t)
    r, f = min(report_s), min(forward_s)
    print(f"| {' + '.join(args.models)} | built-in corpus, 1024 tokens each | {torch.get_num_threads()} "
          f"threads | report {r:.1f} s | forward {f:.2f} s | ×{r / f:.0f} |")


if __name__ == "__main__":
    main()
