#!/usr/bin/env bash
# GPT-2 124M training steps of llm.c's CPU trainer (train_gpt2.c, built from
# its public source with its Makefile's flags: -Ofast -march=native -fopenmp)
# beside kiln's, at llm.c's shape (batch 4 x 64 tokens, AdamW lr 1e-4, no
# dropout), the same weights (drawn by kiln, written in llm.c's format) and
# random tokens, on this CPU in one run. llm.c's code is fetched to a
# temporary folder and not kept. Writes OUT/.
#   LLMC: a checkout of github.com/karpathy/llm.c (default: cloned)
#   PYTHON: a Python 3.11 with numpy for kiln's module (default .venv/bin/python)
#   bash bench/lm/llmc.sh OUT
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:?usage: bench/lm/llmc.sh OUT}
mkdir -p "$out"
lscpu > "$out/lscpu.txt"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
if [ -n "${LLMC:-}" ]; then
  git -C "$LLMC" archive HEAD | tar -x -C "$work"
  git -C "$LLMC" rev-parse HEAD > "$out/llmc_commit.txt"
else
  git clone -q https://github.com/karpathy/llm.c "$work"
  git -C "$work" rev-parse HEAD > "$out/llmc_commit.txt"
fi
make -C "$work" train_gpt2 2>&1 | tail -3 | tee "$out/llmc_build.txt"
"${PYTHON:-.venv/bin/python}" bench/lm/llmc_files.py "$work"
(cd "$work" && OMP_NUM_THREADS=$(nproc) ./train_gpt2) > "$out/llmc.txt" 2>&1
# kiln at the same shape, from the same weights.
build/kiln train --init-from "$work/kiln_gpt2" \
  --data "tokens:$work/dev/data/tinyshakespeare/tiny_shakespeare_train.bin" --seq-len 64 \
  --batch-size 4 --optimizer adamw --lr 1e-4 --weight-decay 0 --steps 41 --warmup 2 \
  --mode jit --log-json "$out/kiln.jsonl" > "$out/kiln.txt"
"${PYTHON:-.venv/bin/python}" - "$out" <<'PY'
import json, re, statistics, sys
out = sys.argv[1]
llmc = [float(m[1]) / 1000 for m in re.finditer(r"step \d+: train loss [0-9.]+ \(took ([0-9.]+) ms\)",
                                               open(f"{out}/llmc.txt").read())]
kiln = json.loads(open(f"{out}/kiln.jsonl").read().splitlines()[-1])
rows = [{"peer": "llm.c train_gpt2.c", "median": statistics.median(llmc[2:]), "steps": len(llmc),
         "first_step": llmc[0]},
        {"peer": "kiln jit", "median": kiln["median"], "first_step": kiln["first_step_seconds"]}]
with open(f"{out}/results.jsonl", "w") as f:
    for r in rows:
        f.write(json.dumps(r) + "\n")
print(open(f"{out}/results.jsonl").read())
PY
