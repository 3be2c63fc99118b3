#!/usr/bin/env bash
# A/B of two variants of `kiln train` at batch 32 (f32), alternating, ROUNDS
# times each, 7 steps (2 untimed) per run.
#   bash bench/ab.sh OUT_DIR MODEL ROUNDS MODE LABEL_A "SPEC_A" LABEL_B "SPEC_B"
# A SPEC is extra `kiln train` flags; leading NAME=VALUE words are set in the
# environment instead (e.g. "KILN_COMPILE=no_epilogue" or "--attention unfused").
# MODE "-" passes no --mode, for specs that give their own (eager against jit).
# KILN_BIN runs another build of kiln (e.g. build-avx2/kiln) instead of
# building and running build/kiln; a leading KILN_BIN=PATH word in a SPEC runs
# that variant on PATH (two builds against each other, e.g. before and after
# a change).
# Writes OUT_DIR/<model>-<label>-<round>.{jsonl,txt} and OUT_DIR/summary.md.
set -euo pipefail
cd "$(dirname "$0")/.."
usage="usage: bench/ab.sh OUT_DIR MODEL ROUNDS MODE LABEL_A SPEC_A LABEL_B SPEC_B"
out="${1:?$usage}" model="${2:?$usage}" rounds="${3:?$usage}" mode="${4:?$usage}"
labels=("${5:?$usage}" "${7:?$usage}")
specs=("${6?$usage}" "${8?$usage}")
mkdir -p "$out"
bin=${KILN_BIN:-build/kiln}
[ -n "${KILN_BIN:-}" ] || bash scripts/build.sh kiln-cli >/dev/null
mode_flags=(--mode "$mode")
[ "$mode" = - ] && mode_flags=()
for r in $(seq 1 "$rounds"); do
  for i in 0 1; do
    envs=() flags=() run_bin=$bin
    for w in ${specs[$i]}; do
      if [[ ${#flags[@]} -eq 0 && "$w" == KILN_BIN=* ]]; then run_bin=${w#KILN_BIN=}
      elif [[ ${#flags[@]} -eq 0 && "$w" == [A-Za-z_]*=* ]]; then envs+=("$w"); else flags+=("$w"); fi
    done
    env "${envs[@]}" "$run_bin" train --model "$model" "${mode_flags[@]}" --steps 7 --warmup 2 \
      "${flags[@]}" --log-json "$out/$model-${labels[$i]}-$r.jsonl" \
      > "$out/$model-${labels[$i]}-$r.txt" 2>&1
  done
done
python3 - "$out" "$model" "$rounds" "${labels[0]}" "${specs[0]}" "${labels[1]}" "${specs[1]}" <<'PY'
import json, statistics, sys
out, model, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
variants = [(sys.argv[4], sys.argv[5]), (sys.argv[6], sys.argv[7])]
rows = ["| variant | flags | median step per run | median of runs | peak RSS |", "|---|---|---|---|---|"]
for label, spec in variants:
    s = [[json.loads(l) for l in open(f"{out}/{model}-{label}-{r}.jsonl")][-1] for r in range(1, rounds + 1)]
    med = [x["median"] for x in s]
    rows.append(f"| {label} | `{spec}` | {', '.join(f'{m:.3f}' for m in med)} s | "
                f"{statistics.median(med):.3f} s | {max(x['peak_rss_mib'] for x in s) / 1024:.2f} GiB |")
open(f"{out}/summary.md", "w").write("\n".join(rows) + "\n")
print("\n".join(rows))
PY
