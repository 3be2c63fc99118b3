#!/usr/bin/env bash
# kiln's bf16 mixed precision beside PyTorch's autocast on the CPU: the
# reference experiment's training step (random images, batch 32, SGD) of
# transformers' ViTForImageClassification (eager attention), alternating
# kiln jit bf16, kiln jit fp32, PyTorch eager with torch.autocast("cpu",
# dtype=torch.bfloat16), and, with COMPILE=1, torch.compile under autocast,
# ROUNDS times each, on all cores.
#   bash bench/bf16_vs_autocast.sh OUT_DIR [model] [rounds]
# Writes OUT_DIR/<model>-<peer>-<round>.{jsonl,txt} and OUT_DIR/summary.md
# (median step of each run, the median of the runs, ratios, peak RSS, the
# CPU, the peer's PyTorch version). PyTorch comes from bench/peers/.venv
# (bench/peers/setup_venv.sh: PyTorch 2.15, issue #26's peer), or from the
# Python that PEER_PYTHON names (with transformers).
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/bf16_vs_autocast.sh OUT_DIR [model] [rounds]}"
model="${2:-vit-small}"
rounds="${3:-2}"
steps="${STEPS:-8}"
warmup="${WARMUP:-3}"
py="${PEER_PYTHON:-bench/peers/.venv/bin/python}"
[ -x "$py" ] || { echo "bench/bf16_vs_autocast.sh: no peer Python at $py (bash bench/peers/setup_venv.sh, or PEER_PYTHON=...)" >&2; exit 1; }
mkdir -p "$out"
bash scripts/build.sh kiln-cli >/dev/null
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/cpu.txt"
echo "bf16 flags: $(lscpu | grep -o 'amx_bf16\|avx512_bf16' | sort -u | tr '\n' ' ')" >> "$out/cpu.txt"
build/kiln info | grep -E "bf16 GEMM|CPU ISA" >> "$out/cpu.txt"
"$py" -c 'import torch, transformers; print("peer: torch", torch.__version__, "transformers", transformers.__version__)' >> "$out/cpu.txt"
peers="kiln-bf16 kiln-fp32 torch-bf16"
[ "${COMPILE:-0}" = 1 ] && peers="$peers torch.compile-bf16"
for r in $(seq 1 "$rounds"); do
  for p in $peers; do
    log="$out/$model-$p-$r"
    case "$p" in
      kiln-*)
        build/kiln train --model "$model" --mode jit --steps "$steps" --warmup "$warmup" \
          --precision "${p#kiln-}" --log-json "$log.jsonl" > "$log.txt" 2>&1 ;;
      torch-bf16)
        "$py" bench/peers/torch_vit.py --model "$model" --steps "$steps" --warmup "$warmup" \
          --precision bf16 --log-json "$log.jsonl" > "$log.txt" 2>&1 ;;
      torch.compile-bf16)
        "$py" bench/peers/torch_vit.py --model "$model" --steps "$steps" --warmup "$warmup" \
          --precision bf16 --compile --log-json "$log.jsonl" > "$log.txt" 2>&1 ;;
    esac
  done
done
python3 - "$out" "$model" "$rounds" "$peers" <<'PY'
import json, statistics, sys
out, model, rounds, peers = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split()
rows = ["| run | median step per round | median of rounds | vs PyTorch autocast eager | peak RSS |",
        "|---|---|---|---|---|"]
med = {}
for p in peers:
    s = [[json.loads(l) for l in open(f"{out}/{model}-{p}-{r}.jsonl")][-1] for r in range(1, rounds + 1)]
    med[p] = (statistics.median(x["median"] for x in s), s)
base = med["torch-bf16"][0]
for p in peers:
    m, s = med[p]
    rows.append(f"| {p} | {', '.join('%.3f' % x['median'] for x in s)} s | {m:.3f} s | "
                f"{base / m:.2f}x | {max(x['peak_rss_mib'] for x in s):.0f} MiB |")
rows.append("")
rows.append(f"kiln bf16 against kiln fp32: {med['kiln-fp32'][0] / med['kiln-bf16'][0]:.2f}x")
text = "\n".join(rows) + "\n"
open(f"{out}/summary.md", "w").write(text)
print(text)
PY
