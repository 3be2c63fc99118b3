#!/usr/bin/env bash
# kiln's main job: the reference experiment (ViT-Base/16, batch 32, SGD,
# random images) in jit mode (the reference script's default, --mode jax) with
# the default schedule. Arguments go to
# `kiln train`, e.g. `bash scripts/run.sh --model vit-tiny --steps 20`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh kiln-cli
exec build/kiln train "$@"
