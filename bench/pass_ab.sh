#!/usr/bin/env bash
# A/B of one compiler pass: `kiln train --mode jit` with and without
# KILN_COMPILE=SWITCH (no_epilogue, no_reduce, ...), alternating, ROUNDS times
# each, at batch 32 (f32).
#   bash bench/pass_ab.sh OUT_DIR [model] [rounds] [switch]
# Writes OUT_DIR/<model>-{on,off}-<round>.jsonl and OUT_DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/pass_ab.sh OUT_DIR [model] [rounds] [switch]}"
model="${2:-vit-small}"
rounds="${3:-3}"
switch="${4:-no_epilogue}"
mkdir -p "$out"
bash scripts/build.sh kiln-cli >/dev/null
for r in $(seq 1 "$rounds"); do
  for v in on off; do
    env_flag=""
    [ "$v" = off ] && env_flag="$switch"
    KILN_COMPILE="$env_flag" build/kiln train --model "$model" --mode jit --steps 7 --warmup 2 \
      --log-json "$out/$model-$v-$r.jsonl" > "$out/$model-$v-$r.txt" 2>&1
  done
done
python3 - "$out" "$model" "$rounds" "$switch" <<'PY'
import json, statistics, sys
out, model, rounds, switch = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
rows = ["| variant | median step per run | median of runs | peak RSS |", "|---|---|---|---|"]
for v in ["on", "off"]:
    s = [[json.loads(l) for l in open(f"{out}/{model}-{v}-{r}.jsonl")][-1] for r in range(1, rounds + 1)]
    med = [x["median"] for x in s]
    name = "pass on" if v == "on" else f"KILN_COMPILE={switch}"
    rows.append(f"| {name} | {', '.join(f'{m:.3f}' for m in med)} s | {statistics.median(med):.3f} s | "
                f"{max(x['peak_rss_mib'] for x in s) / 1024:.2f} GiB |")
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
