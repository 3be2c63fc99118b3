#!/usr/bin/env bash
# Greedy generation with GPT-2 124M (random weights, bench/lm/gpt2_124m.json,
# saved by kiln as transformers loads it): kiln's generate (the KV cache, one
# compiled decode step) beside transformers' generate (its KV cache), fp32,
# on this CPU in one run; the same prompt ids, and the tokens of both
# compared; ROUNDS (default 3) rotated rounds of the two, medians reported.
# Writes OUT/results.jsonl and OUT/lscpu.txt.
#   PRECISION: fp32 (default) or bf16 (kiln's bf16 matmul operands: the
#     weights rounded once before the calls, Model.inference_params;
#     transformers' model in bfloat16)
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
: > "$out/results.jsonl"
for round in $(seq "${ROUNDS:-3}"); do  # rotated: a slow spell of the machine hits both
  "$py" bench/lm/kiln_generate.py "$work/gpt2" --prompt-ids "$ids" --new "$new" \
    --precision "$precision" >> "$out/results.jsonl"
  "$py" bench/lm/torch_generate.py "$work/gpt2" --prompt-ids "$ids" --new "$new" \
    --precision "$precision" >> "$out/results.jsonl"
done
"$py" - "$out/results.jsonl" <<'PY'
import json, statistics, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
k = [r for r in rows if r["peer"] == "kiln generate"]
t = [r for r in rows if r["peer"] == "transformers generate"]
rate = lambda rs, f="tokens_per_second": statistics.median(r[f] for r in rs)
same = all(r["tokens"] == t[0]["tokens"] for r in k)
print(f"kiln {rate(k):.1f} tokens/s per call ({rate(k, 'marginal_tokens_per_second'):.1f} "
      f"marginal), transformers {rate(t):.1f}: {rate(k) / rate(t):.2f}x (medians of {len(k)} "
      f"rotated rounds; kiln {min(r['tokens_per_second'] for r in k):.1f}-"
      f"{max(r['tokens_per_second'] for r in k):.1f}, transformers "
      f"{min(r['tokens_per_second'] for r in t):.1f}-{max(r['tokens_per_second'] for r in t):.1f}); "
      f"the same tokens: {same}")
PY
