#!/usr/bin/env bash
# Greedy generation with GPT-2 124M (random weights, bench/lm/gpt2_124m.json,
# saved by kiln as transformers loads it): kiln generate (the KV cache, one
# compiled decode step) beside transformers' generate (its KV cache), fp32,
# on this CPU in one run; the same prompt ids, the same new tokens. kiln's
# rate is taken per call (compile included) and per marginal token (calls
# of N and 2N new tokens: prefill and compile cancel). Writes OUT/.
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
# The model folder: GPT-2 124M drawn by kiln, the Jargon File's tokenizer for text.
"$py" - "$work/gpt2" <<'PY'
import json, sys
sys.path.insert(0, "build/python")
import kiln
with open("bench/lm/gpt2_124m.json") as f:
    cfg = json.load(f)
m = kiln.models.from_config(cfg)
m.save_pretrained(sys.argv[1], m.init(kiln.random.key(0)))
PY
cp bench/results/2026-12-06-gpt-jargon/tokenizer.json "$work/gpt2/"
prompt="The Jargon File is a comprehensive compendium of hacker slang illuminating"
ids=$("$py" -c "import sys; sys.path.insert(0, 'build/python'); import kiln; t = kiln.data.Tokenizer.from_folder('$work/gpt2'); print(','.join(map(str, t.encode('$prompt'))))")
: > "$out/results.jsonl"
for n in "$new" "$((2 * new))"; do
  for rep in 1 2 3; do
    build/kiln generate --model "$work/gpt2" --prompt "$prompt" --max-new-tokens "$n" \
      --ignore-eos > "$work/kiln-$n.txt" 2> "$work/kiln-$n.err"
    grep "kiln generate" "$work/kiln-$n.err" | tee -a "$out/kiln.txt"
  done
done
"$py" bench/lm/torch_generate.py "$work/gpt2" --prompt-ids "$ids" --new "$new" >> "$out/results.jsonl"
"$py" - "$out" "$new" <<'PY'
import json, re, statistics, sys
out, new = sys.argv[1], int(sys.argv[2])
runs = {}
for line in open(f"{out}/kiln.txt"):
    m = re.search(r"(\d+) new in ([0-9.]+) (ms|s)", line)
    n, t = int(m[1]), float(m[2]) / (1000 if m[3] == "ms" else 1)
    runs.setdefault(n, []).append(t)
t1, t2 = statistics.median(runs[new]), statistics.median(runs[2 * new])
row = {"peer": "kiln generate (jit)", "new": new, "seconds": t1, "tokens_per_second": new / t1,
       "marginal_tokens_per_second": new / (t2 - t1), "times": runs}
with open(f"{out}/results.jsonl", "a") as f:
    f.write(json.dumps(row) + "\n")
print(open(f"{out}/results.jsonl").read())
PY
