#!/usr/bin/env bash
# kiln's main job. For now: a demo of the engine (the ViT issue replaces it
# with `kiln train`, the reference experiment). Arguments go to `kiln demo`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh kiln-cli
exec build/kiln demo "$@"
