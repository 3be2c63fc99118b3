#!/usr/bin/env bash
# bf16 mixed precision against fp32: `kiln train --mode jit` on random data at
# batch 32, alternating the two, ROUNDS times each.
#   bash bench/precision_ab.sh OUT_DIR [model] [rounds]
# Writes OUT_DIR/<model>-{fp32,bf16}-<round>.{jsonl,txt} and OUT_DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/precision_ab.sh OUT_DIR [model] [rounds]}"
model="${2:-vit-small}"
rounds="${3:-2}"
mkdir -p "$out"
bash scripts/build.sh kiln-cli >/dev/null
for r in $(seq 1 "$rounds"); do
  for p in fp32 bf16; do
    build/kiln train --model "$model" --mode jit --steps 6 --warmup 2 --precision "$p" \
      --log-json "$out/$model-$p-$r.jsonl" > "$out/$model-$p-$r.txt" 2>&1
  done
done
python3 - "$out" "$model" "$rounds" <<'PY'
import json, statistics, sys
out, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
rows = ["| precision | median step per run | median of runs | vs fp32 | peak RSS |", "|---|---|---|---|---|"]
base = None
for p in ["fp32", "bf16"]:
    s = [[json.loads(l) for l in open(f"{out}/{model}-{p}-{r}.jsonl")][-1] for r in range(1, rounds + 1)]
    med = statistics.median(x["median"] for x in s)
    base = base or med
    runs = ", ".join("%.3f" % x["median"] for x in s)
    rows.append(f"| {p} | {runs} s | {med:.3f} s | "
                f"{base / med:.2f}x | {max(x['peak_rss_mib'] for x in s) / 1024:.2f} GiB |")
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
