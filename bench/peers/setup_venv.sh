#!/usr/bin/env bash
# Creates bench/peers/.venv with the peers of the comparison, pinned:
# PyTorch (eager and torch.compile), JAX (CPU) with Flax and Optax, and
# transformers: the newest releases on PyPI as of 2026-11-30 (transformers
# 5.17.0 is the GPU machine's); Pillow, whose decoding and resizing kiln's
# fixtures pin, and scikit-learn and scikit-image for their sample photos and
# the digits of the transfer experiment (bench/predict, bench/transfer). The JAX peer trains flax_vit.py, since
# transformers 5 ships no Flax models. Re-running it upgrades an older venv.
#
#   bash bench/peers/setup_venv.sh --gpu-machine
#
# creates bench/peers/.venv-gpu-machine instead, with the versions the lent
# GPU machine's python3 holds (device/KINDS.md, 2026-11: Python 3.12, torch
# 2.11.0, jax 0.11.2, transformers 5.17.0, numpy 2.5.2, safetensors 0.8.0;
# flax and optax as pip resolves them beside jax 0.11.2), so that the GPU
# check's peers are rehearsed on the CPU with the code they will meet there
# (bench/gpu/rehearse.sh). It takes python3.12 where one is on the PATH
# (Debian 12 has none; pyenv may), else python3.11; PYTHON overrides.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
if [ "${1:-}" = --gpu-machine ]; then
  venv=$here/.venv-gpu-machine
  python=${PYTHON:-$(command -v python3.12 || command -v python3.11 || command -v python3)}
  pins=("torch==2.11.0" "jax==0.11.2" "jaxlib==0.11.2" "flax==0.12.12" "optax==0.2.8"
        "transformers==5.17.0" "safetensors==0.8.0" "numpy==2.5.2" "psutil==7.2.2" "matplotlib==3.11.2"
        "pillow==13.0.0" "scikit-learn==1.9.1" "scikit-image==0.26.0")
else
  venv=$here/.venv
  python="${PYTHON:-python3}"
  pins=("torch==2.15.0" "jax[cpu]==0.10.2" "flax==0.12.8" "optax==0.2.8" "transformers==5.17.0"
        "safetensors==0.8.0" "numpy==2.4.6" "psutil==7.2.2" "matplotlib==3.11.2" "pillow==13.0.0"
        "scikit-learn==1.9.1" "scikit-image==0.26.0")
fi
if [ ! -x "$venv/bin/python" ]; then
  "$python" -m venv "$venv"
fi
"$venv/bin/pip" install -q --upgrade pip
"$venv/bin/pip" install -q "${pins[@]}"
"$venv/bin/python" -c "import sys, torch, jax, flax, optax, transformers; print('python', sys.version.split()[0], 'torch', torch.__version__, 'jax', jax.__version__, 'flax', flax.__version__, 'optax', optax.__version__, 'transformers', transformers.__version__)"
