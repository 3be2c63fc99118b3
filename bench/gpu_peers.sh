#!/usr/bin/env bash
# The reference experiment's peers on an NVIDIA GPU, for a machine where
# PyTorch, JAX, flax, optax and transformers are already installed (nothing is
# downloaded): PyTorch eager, torch.compile and JAX jit, tf32 matmuls, batch
# 32, for vit-tiny, vit-small and vit-base. kiln's CUDA modes join once they
# exist. About 8 minutes on an H100-class GPU (torch.compile and XLA compile
# times included). Writes bench/results/<date>-cuda-<model>.{json,md,png}.
#   bash bench/gpu_peers.sh [python]
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python3}"
"$py" -c "import torch, jax, flax, optax, transformers; assert torch.cuda.is_available(), 'no CUDA device'"
for spec in "vit-tiny 22 2" "vit-small 22 2" "vit-base 22 2"; do
  set -- $spec
  timeout 300 "$py" bench/compare.py --python "$(command -v "$py")" --device cuda --model "$1" \
    --steps "$2" --warmup "$3" || \
    echo "bench/gpu_peers.sh: $1 did not finish within 5 minutes"
done
