"""Write a host-bound stand-in for a launch-bound GPU: SmolLM2's depth, narrow and random.

On an H200 a 135M model's forward pass is launch-bound: its time is the host's (Python,
dispatch, one launch per operation), not arithmetic. A CPU shows the same regime when the
arithmetic is negligible: SmolLM2-135M's architecture (30 blocks, grouped-query attention,
its tokenizer and 49,152-token vocabulary) with ``d_model`` 64, random weights, on 1×16
tokens. Every hook, reduction and Python step then costs about what it costs on the GPU's
host, so the ratios track the host-side cost of each variant on a machine without a GPU (a
proxy: the GPU adds its own kernel time and the CPU its own per-operation dispatch).

    python benchmarks/narrow_model.py /tmp/smollm2-narrow
    python benchmarks/scan_speed.py --model /tmp/smollm2-narrow --batches 8 --batch-size 1
        --seq-len 16 --rounds 7 --no-tl
"""

from __future__ import annotations

import sys

import torch
from transformers import AutoModelForCausalLM

import residual_stream as rs


def main() -> None:
    """Save the narrow model and SmolLM2's tokenizer to the folder given as the argument."""
    out = sys.argv[1] if len(sys.argv) > 1 else "/tmp/smollm2-narrow"
    ref = rs.load("smollm2-135m", progress=False)
    config = ref.module.config
    config.hidden_size, config.intermediate_size, config.head_dim = 64, 128, 8
    config.num_attention_heads, config.num_key_value_heads = 8, 2
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(out)
    ref.tokenizer.save_pretrained(out)
    print(out)


if __name__ == "__main__":
    main()
