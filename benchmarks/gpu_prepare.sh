#!/usr/bin/env bash
# Recreate .gpu/ (ignored by git: add "/.gpu/" to .git/info/exclude) for the device tool, which
# carries at most 64 MiB and reaches no package index: wheels for what its Python 3.12 lacks
# (the versions installed here, transformers/transformer-lens as pinned in constraints.txt) and
# SmolLM2-135M's config and tokenizer (from the GGUF of the bundled wheel). Run in the repo root
# after `make install`; then `run` benchmarks/gpu_rerun.sh with carry [".gpu"].
set -euo pipefail
PY=.venv/bin/python
mkdir -p .gpu/whl .gpu/smollm2
PKGS="transformers transformer-lens tokenizers huggingface_hub datasets dill multiprocess beartype
      fancy_einsum typeguard httpx2 httpcore2 truststore"
SPECS=$($PY - "$PKGS" <<'PY'
import sys
from importlib.metadata import PackageNotFoundError, version
out = []
for name in sys.argv[1].split():
    try:
        out.append(f"{name}=={version(name)}")
    except PackageNotFoundError:
        pass
print(" ".join(out))
PY
)
$PY -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 -d .gpu/whl $SPECS
HF_HUB_OFFLINE=1 $PY - <<'PY'
import residual_stream as rs
m = rs.load("smollm2-135m", progress=False)
m.module.config.save_pretrained(".gpu/smollm2")
m.tokenizer.save_pretrained(".gpu/smollm2")
PY
du -sh .gpu
