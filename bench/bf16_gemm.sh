#!/usr/bin/env bash
# kiln's bf16 GEMMs beside PyTorch's on the ViT-S/16 training shapes at batch
# 32 (forward X·Wᵀ, dX = dY·W, dW = dYᵀ·X of the qkv, proj, fc1 and fc2
# linears), on all cores, alternating ROUNDS times: kiln's matmul with a
# bf16 result (oneDNN's matmul primitive on AMX or AVX512-BF16), oneMKL's
# cblas_gemm_bf16bf16f32 (f32 result; kiln's attention GEMMs), and
# PyTorch's bf16 matmul (bench/peers/torch_matmul.py), with the CPU's AMX
# tile-loop peak for scale.
#   bash bench/bf16_gemm.sh OUT_DIR [rounds]
set -euo pipefail
cd "$(dirname "$0")/.."
out="${1:?usage: bench/bf16_gemm.sh OUT_DIR [rounds]}"
rounds="${2:-2}"
py="${PEER_PYTHON:-bench/peers/.venv-gpu-machine/bin/python}"
mkdir -p "$out"
cmake -S . -B build -DKILN_BUILD_BENCH=ON >/dev/null
ninja -C build -j"${KILN_JOBS:-2}" kiln-bench-ops kiln-cli >/dev/null
lscpu | grep -E "Model name|^CPU\(s\)" > "$out/cpu.txt"
build/kiln info | grep -E "bf16 GEMM|CPU ISA" >> "$out/cpu.txt"
for r in $(seq 1 "$rounds"); do
  build/kiln-bench-ops --benchmark_filter='matmul_bf16_vit_small' --benchmark_repetitions=5 \
    --benchmark_report_aggregates_only=true --benchmark_format=json > "$out/kiln-$r.json"
  "$py" bench/peers/torch_matmul.py > "$out/torch-$r.jsonl"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
rate = {}  # (shape, who) -> [GFLOP/s per round]
for r in range(1, rounds + 1):
    for b in json.load(open(f"{out}/kiln-{r}.json"))["benchmarks"]:
        if b.get("aggregate_name") != "median":
            continue
        _, shape, who = b["run_name"].split("/")[:3]
        rate.setdefault((shape, "kiln " + who if who != "kiln" else "kiln"), []).append(b["GFLOP/s"])
    for line in open(f"{out}/torch-{r}.jsonl"):
        j = json.loads(line)
        rate.setdefault((j["name"], "torch"), []).append(j["gflops"])
shapes = list(dict.fromkeys(s for s, _ in rate))
whos = list(dict.fromkeys(w for _, w in rate))
rows = ["| shape | " + " | ".join(f"{w} TFLOP/s" for w in whos) + " |",
        "|---|" + "---|" * len(whos)]
total = {w: 0.0 for w in whos}
M = 32 * 197
dims = {"qkv": (384, 1152), "proj": (384, 384), "fc1": (384, 1536), "fc2": (1536, 384)}
for s in shapes:
    i, o = dims[s.split("_")[0]]
    flops = 2.0 * M * i * o
    cells = []
    for w in whos:
        v = statistics.median(rate[(s, w)]) / 1e3
        total[w] += flops / (v * 1e12)
        cells.append(f"{v:.2f} ({', '.join('%.2f' % (x / 1e3) for x in rate[(s, w)])})")
    rows.append(f"| {s} | " + " | ".join(cells) + " |")
flops_all = sum(2.0 * M * dims[s.split('_')[0]][0] * dims[s.split('_')[0]][1] for s in shapes)
rows.append("| all twelve (time-weighted) | " +
            " | ".join(f"{flops_all / total[w] / 1e12:.2f}" for w in whos) + " |")
text = "\n".join(rows) + "\n"
open(f"{out}/summary.md", "w").write(text)
print(text)
PY
