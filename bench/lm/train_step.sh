#!/usr/bin/env bash
# GPT-2 124M training steps (batch 4 x 1024 random tokens, AdamW, no dropout:
# bench/lm/gpt2_124m.json) of kiln beside PyTorch eager and torch.compile
# (transformers' GPT2LMHeadModel) on this CPU, one after the other in one run.
# Writes OUT/results.jsonl and OUT/lscpu.txt.
#   PYTHON: a Python with torch and transformers (default bench/peers/.venv)
#   PRECISION: fp32 (default) or bf16 (kiln --precision bf16, PyTorch's autocast)
#   MODES: kiln's modes (default "jit")
#   bash bench/lm/train_step.sh OUT [STEPS]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/lm/train_step.sh OUT [STEPS]}
steps=${2:-6}
precision=${PRECISION:-fp32}
py=${PYTHON:-bench/peers/.venv/bin/python}
"$py" -c "import torch, transformers" || { echo "bench/lm/train_step.sh: $py lacks torch or transformers (set PYTHON)" >&2; exit 2; }
mkdir -p "$out"
lscpu > "$out/lscpu.txt"
: > "$out/results.jsonl"
tokens="$(mktemp --suffix=.bin)"
trap 'rm -f "$tokens"' EXIT
# Random GPT-2 tokens, nanoGPT's format (uint16): 64 blocks of 1024.
"$py" -c "import numpy as np; np.random.default_rng(0).integers(0, 50257, 65536).astype(np.uint16).tofile('$tokens')"
for mode in ${MODES:-jit}; do
  log="$out/kiln-$precision-$mode.jsonl"
  build/kiln train --config bench/lm/gpt2_124m.json --data "tokens:$tokens" --seq-len 1024 \
    --batch-size 4 --optimizer adamw --lr 1e-4 --weight-decay 0 --steps "$steps" --warmup 2 \
    --mode "$mode" --precision "$precision" --log-json "$log" > "$out/kiln-$precision-$mode.txt"
  tail -1 "$log" | "$py" -c "import json,sys; s=json.load(sys.stdin); print(json.dumps({'peer': 'kiln $mode', 'model': 'gpt2-124m', 'precision': '$precision', 'median': s['median'], 'first_step': s['first_step_seconds'], 'peak_rss_mib': s['peak_rss_mib']}))" >> "$out/results.jsonl"
done
for flags in "" "--compile"; do
  "$py" bench/lm/torch_gpt2.py --steps "$steps" --precision "$precision" $flags >> "$out/results.jsonl"
done
cat "$out/results.jsonl"
