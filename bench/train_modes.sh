#!/usr/bin/env bash
# Step time, time to first step and peak memory of `kiln train` in every
# execution mode, one after another on this machine, at batch 32 (f32).
#   bash bench/train_modes.sh OUT_DIR [models...]
# Writes OUT_DIR/<model>-<mode>.jsonl and .txt, and OUT_DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/train_modes.sh OUT_DIR [models...]}"
shift
models=("$@")
[ $# -eq 0 ] && models=(vit-tiny vit-small vit-base)
mkdir -p "$out"
bash scripts/build.sh kiln-cli >/dev/null
for model in "${models[@]}"; do
  steps=8
  [ "$model" = vit-base ] && steps=5
  for mode in eager eager-compile lazy jit; do
    flags="--mode ${mode%-compile}"
    [ "$mode" = eager-compile ] && flags="--mode eager --compile-model"
    build/kiln train --model "$model" --steps "$steps" --warmup 2 $flags \
      --log-json "$out/$model-$mode.jsonl" > "$out/$model-$mode.txt" 2>&1
  done
done
python3 - "$out" "${models[@]}" <<'PY'
import json, sys
out, models = sys.argv[1], sys.argv[2:]
rows = ["| model | mode | median step | p90 | images/s | vs eager | time to first step | compile | peak RSS | vs eager |",
        "|---|---|---|---|---|---|---|---|---|---|"]
for m in models:
    base = None
    for mode in ["eager", "eager-compile", "lazy", "jit"]:
        s = [json.loads(l) for l in open(f"{out}/{m}-{mode}.jsonl")][-1]
        if base is None:
            base = s
        rows.append(f"| {m} | {mode} | {s['median']:.3f} s | {s['p90']:.3f} s | {s['images_per_second']:.2f} | "
                    f"{base['median'] / s['median']:.2f}x | {s['first_step_seconds']:.2f} s | "
                    f"{s.get('compile_ms', 0):.0f} ms | {s['peak_rss_mib'] / 1024:.2f} GiB | "
                    f"{s['peak_rss_mib'] / base['peak_rss_mib']:.2f}x |")
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
