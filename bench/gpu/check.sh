#!/usr/bin/env bash
# kiln's GPU check (issue #16), one run of at most ~8 minutes on a machine
# with an NVIDIA GPU, leaving everything in one folder ($OUT where set, else
# bench/results/<date>-gpu-check):
#   1. the machine (nvidia-smi, the CUDA libraries found);
#   2. the GPU tests: the operator table on CUDA against the CPU backend
#      (forward and VJP, eager and jit, every primitive), fused programs,
#      Fill/Random, the code generator compiled by NVRTC for this GPU;
#   3. kiln jit on ViT-B/16, batch 32, tf32: first with an empty kernel cache
#      (cold), then again (warm: time to first step), in bf16, and in tf32
#      with every gradient bucket through NCCL (issue #17's path, one rank);
#   4. the reference experiment beside the peers (bench/compare.py: kiln
#      eager, lazy and jit, PyTorch eager, torch.compile, JAX jit) in tf32,
#      then bf16 as far as the time allows;
#   5. summary.md with every table.
# kiln comes from build-gpu/bundle.tar.xz (bench/gpu/bundle.sh; carried by
# the device tool) or, failing that, from build/. GPU_CHECK_BUDGET_S (default 470)
# bounds the whole run; each program gets a timeout from what is left.
# GPU_CHECK_DEVICE=cpu rehearses every step on a machine without a GPU (a
# tiny model on the cpu, the peers on the CPU), so that the real run cannot
# fail for a silly reason.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-470}
device=${GPU_CHECK_DEVICE:-cuda}
out=${OUT:-$root/bench/results/$(date +%Y-%m-%d)-gpu-check}
mkdir -p "$out"
exec > >(tee -a "$out/check.log") 2>&1
left() { echo $((budget - ($(date +%s) - start))); }
step() { echo; echo "=== gpu-check [$(($(date +%s) - start)) s of $budget] $*"; }
cap() {  # cap SECONDS: at most SECONDS, and never past the budget
  local l; l=$(left); [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5))
}

step "the machine"
date -u
nvidia-smi > "$out/nvidia-smi.txt" 2>&1 && head -15 "$out/nvidia-smi.txt" || echo "no nvidia-smi"
nproc; uname -a

# kiln: the carried bundle (unpacked here), else this tree's build.
if [ -f build-gpu/bundle.tar.xz ] && [ ! -x build-gpu/bundle/kiln ]; then
  tar -C build-gpu -xJf build-gpu/bundle.tar.xz || echo "gpu-check: could not unpack build-gpu/bundle.tar.xz"
fi
if [ -x build-gpu/bundle/kiln ]; then
  bin=$root/build-gpu/bundle
  src_dir=$(cat "$bin/source_dir")
  # The tests look for fixtures and the kiln command by the build's paths.
  if [ "$src_dir" != "$root" ] && [ ! -e "$src_dir" ]; then
    mkdir -p "$(dirname "$src_dir")" && ln -s "$root" "$src_dir"
  fi
  mkdir -p "$src_dir/build-gpu" && ln -sf "$bin/kiln" "$src_dir/build-gpu/kiln"
  export LD_LIBRARY_PATH="$bin:$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  bin=$root/build
fi
[ -x "$bin/kiln" ] || { echo "gpu-check: no kiln in $bin (run bench/gpu/bundle.sh or scripts/build.sh)"; exit 1; }
# cuBLASLt and NVRTC: CUDA's own folder, and the ones PyTorch's wheels bring.
py=${GPU_CHECK_PYTHON:-python3}
extra=$("$py" - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}/usr/local/cuda/lib64${extra:+:$extra}"
export KILN_CACHE_DIR="$out/kernel-cache"
rm -rf "$KILN_CACHE_DIR"
echo "kiln from $bin; LD_LIBRARY_PATH=$LD_LIBRARY_PATH"
"$bin/kiln" info 2>&1 | head -20

step "GPU tests (kiln-tests, gpu-labeled and CUDA compile checks)"
filter='*Gpu*:CudaCodegen*:CudaBackend*'
# Rehearsing: the GPU tests run on the reference backend (tests/gpu_device.h).
[ "$device" = cuda ] || export KILN_GPU_TESTS_ON=ref
timeout "$(cap 170)" "$bin/kiln-tests" --gtest_filter="$filter" \
  --gtest_output="xml:$out/gpu-tests.xml" > "$out/gpu-tests.log" 2>&1
echo "kiln-tests exit status $?"
grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests? ran|FAILED TEST" "$out/gpu-tests.log" | tail -40
grep -B2 -A12 "Failure" "$out/gpu-tests.log" | head -120
# A kernel that faults leaves the process's CUDA context broken, and every
# test after it fails too: the failed tests (or, after a crash, the rest)
# run again one process each, so that the real failures stand out.
"$bin/kiln-tests" --gtest_filter="$filter" --gtest_list_tests 2>/dev/null | awk '
  /^[^ ]/ {suite = $1} /^  / {print suite $1}' > "$out/gpu-tests.list"
grep -oE "^\[ +(OK|SKIPPED) \] [^ ]+" "$out/gpu-tests.log" | awk '{print $NF}' > "$out/gpu-tests.done"
grep -vxF -f "$out/gpu-tests.done" "$out/gpu-tests.list" | head -60 > "$out/gpu-tests.rerun"
if [ -s "$out/gpu-tests.rerun" ]; then
  echo "re-running $(wc -l < "$out/gpu-tests.rerun") tests that failed or did not run, one process each"
  while read -r t; do
    [ "$(left)" -gt 300 ] || { echo "(stopped: time)"; break; }
    if timeout 30 "$bin/kiln-tests" --gtest_filter="$t" > "$out/rerun.log" 2>&1; then
      echo "  passes alone: $t"
    else
      echo "  FAILS alone:  $t"
      grep -A8 "Failure\|what()\|exception" "$out/rerun.log" | head -12 | sed 's/^/      /'
    fi
  done < "$out/gpu-tests.rerun" | tee "$out/gpu-tests-rerun.txt"
fi

# The kernels most likely to go out of bounds or race, under compute-sanitizer
# (memcheck, then racecheck), where the machine has it.
if [ "$device" = cuda ] && command -v compute-sanitizer > /dev/null; then
  step "compute-sanitizer on attention, reductions, layout and row kernels"
  sfilter='*GpuForwardMatchesCpu/*attention*:*GpuForwardMatchesCpu/*sum*:*GpuForwardMatchesCpu/*transpose*:*GpuForwardMatchesCpu/*layer_norm*:*GpuForwardMatchesCpu/*softmax*'
  for tool in memcheck racecheck; do
    timeout "$(cap 60)" compute-sanitizer --tool "$tool" --print-limit 20 "$bin/kiln-tests" \
      --gtest_filter="$sfilter" > "$out/sanitizer-$tool.log" 2>&1
    echo "compute-sanitizer $tool: exit status $?; $(grep -cE '^========= (Invalid|Race|Error)' \
      "$out/sanitizer-$tool.log") reports" | tee -a "$out/sanitizer-summary.txt"
    grep -E "^========= " "$out/sanitizer-$tool.log" | head -15
  done
fi

if [ "$device" = cuda ]; then
  model=vit-base steps=22 warmup=2 kdev=cuda
else
  model=vit-tiny steps=4 warmup=1 kdev=cpu
fi
train() {  # train NAME SECONDS FLAGS...: one kiln run, its log and JSON kept
  local name=$1 secs=$2
  shift 2
  echo "--- kiln $name: kiln train --model $model --batch-size 32 --steps $steps --warmup $warmup --device $kdev $*"
  timeout "$(cap "$secs")" "$bin/kiln" train --model "$model" --batch-size 32 --steps "$steps" \
    --warmup "$warmup" --device "$kdev" --log-json "$out/kiln-$name.jsonl" "$@" > "$out/kiln-$name.txt" 2>&1
  echo "exit status $?"
  grep -E "^(device|median|time to first|peak|model FLOP|kiln:)" "$out/kiln-$name.txt"
}
tf32=(--precision tf32)
[ "$device" = cuda ] || tf32=()
step "kiln jit, tf32: cold kernel cache, then warm (time to first step)"
train jit-tf32-cold 120 --mode jit "${tf32[@]}"
train jit-tf32-warm 90 --mode jit "${tf32[@]}"
step "kiln jit, bf16"
# (KILN_DEBUG=1: the compiler verifies every pass and says if the step could
# not be recorded as a graph; only the first step, untimed, pays for it.)
KILN_DEBUG=1 train jit-bf16 90 --mode jit --precision bf16
grep -h "could not record" "$out"/kiln-*.txt | head -3
step "kiln jit, tf32, gradients averaged through NCCL (data-parallel path, one rank)"
# The same run as jit-tf32-warm with every gradient bucket through an
# all-reduce (a communicator of one rank): the same losses, and the cost.
train jit-tf32-nccl 90 --mode jit "${tf32[@]}" --all-reduce always
grep -h '"loss"' "$out/kiln-jit-tf32-warm.jsonl" | tail -1
grep -h '"loss"' "$out/kiln-jit-tf32-nccl.jsonl" | tail -1

if [ "$device" = cuda ]; then
  peak_tf32=$(timeout "$(cap 60)" "$py" bench/peers/gpu_peak.py --dtype tf32 2>>"$out/gpu-peak.log")
  peak_bf16=$(timeout "$(cap 60)" "$py" bench/peers/gpu_peak.py --dtype bf16 2>>"$out/gpu-peak.log")
  echo "measured matmul rate: tf32 ${peak_tf32:-?} GFLOP/s, bf16 ${peak_bf16:-?} GFLOP/s"
  cat "$out/gpu-peak.log"
fi
for prec in tf32 bf16; do
  l=$(left)
  if [ "$l" -lt 60 ]; then
    step "the reference experiment in $prec: skipped, ${l} s left"
    continue
  fi
  step "the reference experiment in $prec beside the peers (bench/compare.py)"
  peak_flag=()
  p=$([ "$prec" = tf32 ] && echo "${peak_tf32:-}" || echo "${peak_bf16:-}")
  [ -n "$p" ] && peak_flag=(--peak-gflops "$p")
  timeout "$(cap 400)" "$py" bench/compare.py --python "$(command -v "$py")" --kiln "$bin/kiln" \
    --device "$device" --precision "$prec" --model "$model" --steps "$steps" --warmup "$warmup" \
    --run-timeout "$(cap 110)" --out "$out" "${peak_flag[@]}" ||
    echo "bench/compare.py ($prec) stopped: exit status $?"
done

step "summary"
{
  echo "# kiln GPU check, $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo
  echo "- machine: $(head -12 "$out/nvidia-smi.txt" 2>/dev/null | grep -E 'NVIDIA|Driver' | tr -s ' ' | head -3 | tr '\n' ' ')"
  echo "- kiln: $bin; $(git -C "$root" log -1 --format='%h %s' 2>/dev/null | cut -c1-80)"
  echo "- measured matmul rate: tf32 ${peak_tf32:-n/a} GFLOP/s, bf16 ${peak_bf16:-n/a} GFLOP/s"
  echo
  echo "## Issue #16's targets"
  echo
  "$py" "$root/bench/gpu/targets.py" "$out" "${peak_bf16:-}" || echo "(bench/gpu/targets.py failed)"
  echo
  echo "## GPU tests"
  echo
  echo '```'
  grep -E "tests? from .* ran|^\[  PASSED|^\[  FAILED|FAILED TESTS?$" "$out/gpu-tests.log" | tail -40
  echo "skipped: $(grep -c '^\[  SKIPPED \] .*(' "$out/gpu-tests.log")"
  [ -s "$out/gpu-tests-rerun.txt" ] && cat "$out/gpu-tests-rerun.txt"
  cat "$out/sanitizer-summary.txt" 2>/dev/null
  echo '```'
  for f in "$out"/kiln-*.txt; do
    [ -e "$f" ] || continue
    echo
    echo "## $(basename "$f" .txt)"
    echo
    echo '```'
    grep -E "^(device|median|average|time to first|peak|model FLOP|kiln:|step 1/)" "$f"
    echo '```'
  done
  for f in "$out"/*.md; do
    case "$f" in */summary.md) continue ;; esac
    [ -e "$f" ] && { echo; cat "$f"; }
  done
} > "$out/summary.md.tmp" && mv "$out/summary.md.tmp" "$out/summary.md"
echo "gpu-check: done in $(($(date +%s) - start)) s; results in $out (summary.md)"
