#!/usr/bin/env bash
# The reference experiment's peers on an NVIDIA GPU, for a machine where
# PyTorch, JAX, flax, optax, transformers and matplotlib are already installed
# (nothing is downloaded): PyTorch eager, torch.compile and JAX jit, tf32
# matmuls, batch 32, 20 timed steps, for vit-base (the reference experiment's
# model, first), vit-small and vit-tiny. kiln's CUDA modes join once they
# exist. Writes bench/results/<date>-cuda-<model>.{json,md,png} (+ -logs/),
# with MFU against the GPU's measured tf32 matmul rate (bench/peers/gpu_peak.py).
#
#   bash bench/gpu_peers.sh [python]
#
# It keeps to a time budget (GPU_PEERS_BUDGET_S, default 480 s, for the device
# tool's 10-minute calls): each program may run at most 240 s and what is left,
# and a model is skipped when under 60 s are left. Where $OUT is set (the
# device tool brings back only that folder), it packs the results there after
# every model as gpu-results.tar.gz, beside summary.md (every table, the
# versions) and nvidia-smi.txt, so that a run cut short still returns what it
# measured. GPU_PEERS_DEVICE=cpu rehearses the whole script on a machine
# without a GPU (peers only, on the CPU); GPU_PEERS_MODELS, GPU_PEERS_STEPS and
# GPU_PEERS_WARMUP shorten it, and GPU_PEERS_RESULTS (default bench/results)
# puts its reports elsewhere.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${1:-python3}"
device="${GPU_PEERS_DEVICE:-cuda}"
budget="${GPU_PEERS_BUDGET_S:-480}"
models="${GPU_PEERS_MODELS:-vit-base vit-small vit-tiny}"
steps="${GPU_PEERS_STEPS:-22}"
warmup="${GPU_PEERS_WARMUP:-2}"
results="${GPU_PEERS_RESULTS:-bench/results}"
start=$(date +%s)
case "$device" in cuda | cpu) ;; *) echo "bench/gpu_peers.sh: GPU_PEERS_DEVICE is '$device', expected cuda or cpu" >&2; exit 2 ;; esac

"$py" -c "import torch, jax, flax, optax, transformers, matplotlib"
versions=$("$py" -c "import torch, jax, flax, optax, transformers; print(f'torch {torch.__version__}, jax {jax.__version__} ({jax.devices()[0].platform}), flax {flax.__version__}, optax {optax.__version__}, transformers {transformers.__version__}')")
echo "bench/gpu_peers.sh: $versions"
peak_flag=()
if [ "$device" = cuda ]; then
  "$py" -c "import torch; assert torch.cuda.is_available(), 'no CUDA device visible to PyTorch'"
  peak=$("$py" bench/peers/gpu_peak.py)
  echo "bench/gpu_peers.sh: tf32 matmul peak $peak GFLOP/s"
  peak_flag=(--peak-gflops "$peak")
fi
# Rehearsing on the CPU: the peers only (kiln's CPU modes are not this script's).
skip_flag=()
[ "$device" = cpu ] && skip_flag=(--skip "kiln eager,kiln eager + compile-model,kiln lazy,kiln jit")

date_stamp=$(date +%Y-%m-%d)
pack() {
  [ -n "${OUT:-}" ] || return 0
  mkdir -p "$OUT"
  local files=("$results/$date_stamp-$device"-*)
  [ -e "${files[0]}" ] || return 0
  tar czf "$OUT/gpu-results.tar.gz.tmp" -C "$results" "${files[@]#"$results"/}" &&
    mv "$OUT/gpu-results.tar.gz.tmp" "$OUT/gpu-results.tar.gz"
  { echo "# bench/gpu_peers.sh, $(date -u '+%Y-%m-%d %H:%M UTC')"; echo; echo "- $versions"
    [ "${#peak_flag[@]}" -gt 0 ] && echo "- tf32 matmul peak (bench/peers/gpu_peak.py): ${peak_flag[1]} GFLOP/s"
    for f in "$results/$date_stamp-$device"-*.md; do [ -e "$f" ] && { echo; cat "$f"; }; done
    true
  } > "$OUT/summary.md.tmp" && mv "$OUT/summary.md.tmp" "$OUT/summary.md"
}
if [ -n "${OUT:-}" ] && [ "$device" = cuda ]; then
  mkdir -p "$OUT"
  nvidia-smi > "$OUT/nvidia-smi.txt" 2>&1 || true
fi

for model in $models; do
  left=$((budget - ($(date +%s) - start)))
  if [ "$left" -lt 60 ]; then
    echo "bench/gpu_peers.sh: $model skipped, ${left} s of the ${budget} s budget left"
    continue
  fi
  per_run=$((left < 240 ? left : 240))
  "$py" bench/compare.py --python "$(command -v "$py")" --device "$device" --model "$model" \
    --steps "$steps" --warmup "$warmup" --run-timeout "$per_run" --out "$results" "${peak_flag[@]}" "${skip_flag[@]}" ||
    echo "bench/gpu_peers.sh: bench/compare for $model failed"
  pack
done
echo "bench/gpu_peers.sh: done in $(($(date +%s) - start)) s"
