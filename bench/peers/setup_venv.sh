#!/usr/bin/env bash
# Creates bench/peers/.venv with the peers of the comparison, pinned:
# PyTorch (eager and torch.compile), JAX (CPU) with Flax and Optax, and
# transformers: the newest releases on PyPI as of 2026-11-30 (transformers
# 5.17.0 is the GPU machine's). The JAX peer trains flax_vit.py, since
# transformers 5 ships no Flax models. Re-running it upgrades an older venv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
python="${PYTHON:-python3}"
if [ ! -x "$here/.venv/bin/python" ]; then
  "$python" -m venv "$here/.venv"
fi
"$here/.venv/bin/pip" install -q --upgrade pip
"$here/.venv/bin/pip" install -q \
  "torch==2.15.0" "jax[cpu]==0.10.2" "flax==0.12.8" "optax==0.2.8" \
  "transformers==5.17.0" "safetensors==0.8.0" "numpy==2.4.6" "psutil==7.2.2" "matplotlib==3.11.2"
"$here/.venv/bin/python" -c "import torch, jax, flax, optax, transformers; print('torch', torch.__version__, 'jax', jax.__version__, 'flax', flax.__version__, 'transformers', transformers.__version__)"
