#!/usr/bin/env bash
# Greedy generation with GPT-2 124M (random weights, bench/lm/gpt2_124m.json,
# saved by kiln as transformers loads it): kiln's generate (the KV cache, one
# compiled decode step) beside transformers' generate (its KV cache), fp32,
# on this CPU in one run; the same prompt ids, and the tokens of both
# compared. Writes OUT/results.jsonl and OUT/lscpu.txt.
#   PRECISION: fp32 (default) or bf16 (kiln's bf16 matmul operands: the
#     weights rounded once, at compile; transformers' model in bfloat16)
#   PYTHON: a Python with torch and transformers (default bench/peers/.venv)
#   bash bench/lm/generate.sh OUT [NEW_TOKENS]
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/lm/generate.sh OUT [NEW_TOKENS]}
new=${2:-128}
py=${PYTHON:-bench/peers/.venv/bin/python}
mkdir -p "$out"
lscpu > "$out/lscpu.txt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
"$py" - "$work/gpt2" <<'PY'
import json, sys
sys.path.insert(0, "build/python")
import kiln
with open("bench/lm/gpt2_124m.json") as f:
    cfg = json.load(f)
m = kiln.models.from_config(cfg)
m.save_pretrained(sys.argv[1], m.init(kiln.random.key(0)))
PY
ids=$("$py" -c "import numpy as np; print(','.join(map(str, np.random.default_rng(1).integers(0, 50257, 16))))")
precision=${PRECISION:-fp32}
"$py" bench/lm/kiln_generate.py "$work/gpt2" --prompt-ids "$ids" --new "$new" \
  --precision "$precision" > "$out/results.jsonl"
"$py" bench/lm/torch_generate.py "$work/gpt2" --prompt-ids "$ids" --new "$new" \
  --precision "$precision" >> "$out/results.jsonl"
"$py" - "$out/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
k, t = rows
same = k["tokens"] == t["tokens"]
print(f"kiln {k['tokens_per_second']:.1f} tokens/s per call ({k['marginal_tokens_per_second']:.1f} "
      f"marginal), transformers {t['tokens_per_second']:.1f}: "
      f"{k['tokens_per_second'] / t['tokens_per_second']:.2f}x; the same tokens: {same}")
PY
