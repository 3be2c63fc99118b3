#!/usr/bin/env bash
# Creates bench/peers/.venv with the peers of the comparison, pinned:
# PyTorch (eager and torch.compile), JAX (CPU) with Flax and Optax, and a
# transformers 4.x that still ships FlaxViTForImageClassification.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$here/.venv/bin/python" ]; then
  "$python" -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install -q --upgrade pip
"$here/.venv/bin/pip" install -q \
  "torch==2.5.1" "jax[cpu]==0.4.35" "flax==0.10.2" "optax==0.2.4" \
  "transformers==4.46.3" "safetensors==0.4.5" "numpy<2.2" "psutil==6.1.0" "matplotlib==3.9.2"
"$here/.venv/bin/python" -c "import torch, jax, flax, optax, transformers; print('torch', torch.__version__, 'jax', jax.__version__, 'flax', flax.__version__, 'transformers', transformers.__version__)"
