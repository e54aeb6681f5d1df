# Sourced by the device scripts (gpu_rerun.sh): the carried wheels onto
# PYTHONPATH, and SmolLM2-135M's architecture with random weights saved to /tmp/smollm2-random.
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .gpu/whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  TORCHINDUCTOR_CACHE_DIR=/tmp/inductor
python3 - <<'PY'
import torch
from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
torch.manual_seed(0)
m = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(".gpu/smollm2"), dtype=torch.bfloat16)
m.save_pretrained("/tmp/smollm2-random"); AutoTokenizer.from_pretrained(".gpu/smollm2").save_pretrained("/tmp/smollm2-random")
PY
