#!/usr/bin/env bash
# ResNet-50 and ConvNeXt-T training steps (batch 32, 224x224, random images,
# SGD) of kiln beside PyTorch eager and torch.compile (transformers' models)
# on this CPU, one after the other in one run. Writes OUT/results.jsonl and
# OUT/lscpu.txt.
#   PYTHON: a Python with torch and transformers (default bench/peers/.venv)
#   MODELS: which (default "resnet-50 convnext-tiny")
#   PRECISION: fp32 (default) or bf16 (kiln --precision bf16, PyTorch's autocast)
#   bench/cnn/run.sh OUT [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/cnn/run.sh OUT [STEPS]}
steps=${2:-6}
precision=${PRECISION:-fp32}
py=${PYTHON:-bench/peers/.venv/bin/python}
"$py" -c "import torch, transformers" || { echo "bench/cnn/run.sh: $py lacks torch or transformers (set PYTHON)" >&2; exit 2; }
mkdir -p "$out"
lscpu > "$out/lscpu.txt"
: > "$out/results.jsonl"
for model in ${MODELS:-resnet-50 convnext-tiny}; do
  for mode in jit eager; do
    log="$out/kiln-$model-$mode.jsonl"
    build/kiln train --model "$model" --batch-size 32 --steps "$steps" --warmup 2 --mode "$mode" \
      --precision "$precision" --log-json "$log" > "$out/kiln-$model-$mode.txt"
    tail -1 "$log" | "$py" -c "import json,sys; s=json.load(sys.stdin); print(json.dumps({'peer': 'kiln $mode', 'model': '$model', 'precision': '$precision', 'median': s['median'], 'first_step': s['first_step_seconds'], 'peak_rss_mib': s['peak_rss_mib']}))" >> "$out/results.jsonl"
  done
  for flags in "" "--channels-last" "--compile --channels-last"; do
    "$py" bench/peers/torch_cnn.py --model "$model" --steps "$steps" --precision "$precision" $flags >> "$out/results.jsonl"
  done
done
cat "$out/results.jsonl"
