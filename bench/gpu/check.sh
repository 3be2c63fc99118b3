#!/usr/bin/env bash
# kiln's GPU check: one call of at most 10 minutes on a machine with an
# NVIDIA GPU, run as
#
#   bash bench/gpu/check.sh        (device tool: carry ["build-gpu/bundle.tar.xz"], timeout_s 600)
#
# Steps, most valuable first; each is independent (a step that fails, times
# out, crashes or lacks its tool is reported as such and the rest still run),
# and each is capped so that even the slowest plausible first run (cold NVRTC
# cache, first cuBLASLt heuristics, torch.compile and XLA compiling from
# nothing) ends inside GPU_CHECK_BUDGET_S (default 560) with its summary
# written. Seconds, as expected on an H200 / the cap:
#   1. the machine: nvidia-smi, the runtime, the peers' versions (10 / 60);
#   2. the GPU tests: the operator table on CUDA against the CPU backend
#      (forward and VJP, eager and jit), fused programs, Fill/Random, the code
#      generator compiled by NVRTC for this GPU (~250 programs at 0.1-0.25 s
#      each, cold); after a crash the rest go on in a fresh process, and
#      failed tests run again in a fresh process (100 / 170, further rounds
#      90 each while 330 s are left);
#   3. kiln jit on ViT-B/16, batch 32, tf32: with an empty kernel cache
#      (cold), again (warm: time to first step), in bf16 (with the SIMT and
#      the tensor-core attention kernels), and in tf32 with every gradient
#      bucket through NCCL (one rank) (5 x 15 / 120 + 4 x 60);
#   4. the measured tf32 and bf16 matmul rates (PyTorch) (20 / 2 x 60);
#   5. the reference experiment in tf32 beside the peers (bench/compare.py:
#      kiln eager, lazy and jit, PyTorch eager, torch.compile, JAX jit)
#      (180 / 260, 110 a program), when 60 s are left;
#   6. kiln's kernel time per primitive on the tf32 step (15 / 60);
#   6b. ResNet-50 in bf16 (its convolutions on cuDNN), kiln jit beside
#      PyTorch eager channels_last under autocast, when 100 s are left
#      (25 + 15 / 60 + 40);
#   7. compute-sanitizer memcheck and racecheck on the riskiest kernels, where
#      the machine has a working one (gVisor has none) (60 / 2 x 45);
#   8. the reference script as written (pytorch and jax modes; its own
#      formula), when 90 s are left (60 / 2 x 90);
#   9. the comparison in bf16, when 120 s are left (180 / 200);
#   then summary.md: every step's status, issue #16's five targets, every
#   table; "failed (reason)" or "skipped (reason)" where a number is
#   missing. It is rewritten after every step, and 15 s are kept for it.
# With $OUT set (the device tool brings back only $OUT, at most 8 files),
# the results are kept in a work folder and, after every step, $OUT gets
# summary.md, check.log and results.tar.gz (everything: logs, JSON, tables;
# `tar -xzf results.tar.gz -C bench/results/<date>-gpu-check`), so that a
# call cut short still brings back what it measured. Without $OUT they go to
# bench/results/<date>-<time>-gpu-check/.
# kiln comes from build-gpu/bundle.tar.xz (bench/gpu/bundle.sh) or, failing
# that, from build/. GPU_CHECK_DEVICE=cpu rehearses every step on a machine
# without a GPU (a tiny model on the cpu, the GPU tests on the reference
# backend, the peers on the CPU; bench/gpu/rehearse.sh); GPU_CHECK_PYTHON
# names the Python of the peers (default python3), GPU_CHECK_TESTS the GPU
# tests' filter, GPU_CHECK_REFERENCE the reference script.
set -uo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
start=$(date +%s)
budget=${GPU_CHECK_BUDGET_S:-560}
device=${GPU_CHECK_DEVICE:-cuda}
py=${GPU_CHECK_PYTHON:-python3}
case "$device" in cuda | cpu) ;; *) echo "bench/gpu/check.sh: GPU_CHECK_DEVICE is '$device', expected cuda or cpu" >&2; exit 2 ;; esac
if [ -n "${OUT:-}" ]; then
  out=$OUT work=${GPU_CHECK_WORK:-${TMPDIR:-/tmp}/kiln-gpu-check}
  rm -rf "$work"
else
  out=$root/bench/results/$(date +%Y-%m-%d-%H%M)-gpu-check work=$out
fi
scratch=$work.scratch  # kernel caches: not packed
rm -rf "$scratch"
mkdir -p "$out" "$work" "$scratch"
exec > >(tee -a "$work/check.log") 2>&1
: > "$work/steps.tsv"
left() { echo $((budget - ($(date +%s) - start))); }
cap() {  # cap SECONDS: at most SECONDS, and never into the last 15 s kept for the summary
  local l=$(($(left) - 15))
  [ "$1" -lt "$l" ] && echo "$1" || echo $((l > 5 ? l : 5))
}
step_name="" step_t0=0
step() {  # step NAME: a new step (the previous one is recorded when it has not been)
  step_name=$1 step_t0=$(date +%s)
  echo
  echo "=== gpu-check [$(($(date +%s) - start)) s of $budget] $1"
}
record() {  # record STATUS: the current step's outcome, then the summary and $OUT are refreshed
  printf '%s\t%s\t%s\n' "$step_name" "$(printf '%s' "$1" | tr '\t\n|' '  /')" $(($(date +%s) - step_t0)) >> "$work/steps.tsv"
  echo "--- $step_name: $1"
  write_summary
  pack
}
skip() {  # skip NAME REASON: a step that does not run
  step "$1"
  record "skipped ($2)"
}
status_of() {  # status_of EXIT SECONDS: an exit status in words
  case $1 in
    0) echo ok ;;
    124) echo "failed (timed out after $2 s)" ;;
    137) echo "failed (killed: past $2 s, or out of memory)" ;;
    127) echo "failed (command not found)" ;;
    13[0-9] | 14[0-9]) echo "failed (killed by signal $(($1 - 128)): $(kill -l $(($1 - 128)) 2>/dev/null))" ;;
    *) echo "failed (exit status $1)" ;;
  esac
}
because() {  # because STATUS LOG: a failed status with LOG's last line inside its parentheses
  if [ "$1" = ok ] || [ ! -s "$2" ]; then echo "$1"; return; fi
  echo "${1%)}: $(grep -v '^[[:space:]]*$' "$2" | tail -1 | cut -c1-160 | tr -d '|'))"
}
run_capped() {  # run_capped SECONDS LOG CMD...: CMD under a timeout, its output in LOG; prints its status
  local secs=$1 log=$2 rc
  shift 2
  timeout -k 10 "$secs" "$@" > "$log" 2>&1
  rc=$?
  status_of "$rc" "$secs"
}

# --- the summary and $OUT -------------------------------------------------
section() {  # section TITLE FILE: FILE's text under a heading, or why it is missing
  echo
  echo "## $1"
  echo
  if [ -s "$2" ]; then cat "$2"; else echo "${3:-not run (the check ended before this step)}"; fi
}
last_loss() { grep -h '"loss"' "$work/kiln-$1.jsonl" 2>/dev/null | tail -1 | grep -o '"loss": *[-0-9.eE+na]*' | cut -d: -f2 | tr -d ' ' | grep . || echo "n/a"; }
median_of() { grep -h -o '^median [0-9.]* m*s' "$work/kiln-$1.txt" 2>/dev/null | tail -1 | grep . || echo "n/a"; }
torch_median() { grep -h -o '"median": *[0-9.eE+-]*' "$work/$1.log" 2>/dev/null | tail -1 | awk '{printf "median %.1f ms\n", $2 * 1000}' | grep . || echo "n/a"; }
step_status() { awk -F'\t' -v s="$1" '$1 == s {v = $2} END {print v}' "$work/steps.tsv"; }
write_summary() {
  {
    echo "# kiln GPU check, $(date -u '+%Y-%m-%d %H:%M UTC') ($device)"
    echo
    echo "- machine: $(grep -m1 -E 'NVIDIA|Tesla' "$work/gpus.txt" 2>/dev/null || echo "no GPU ($device)")"
    echo "- host: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2- | sed 's/^ //'), $(nproc) CPUs, kernel $(uname -r), glibc $(ldd --version 2>/dev/null | head -1 | awk '{print $NF}')"
    echo "- kiln: ${kiln_from:-?}"
    echo "- peers' Python: $(cat "$work/versions.txt" 2>/dev/null | tr '\n' ' ')"
    echo "- measured matmul rate: tf32 ${peak_tf32:-n/a} GFLOP/s, bf16 ${peak_bf16:-n/a} GFLOP/s"
    echo "- $(($(date +%s) - start)) s of the ${budget} s budget used"
    echo
    echo "## Steps"
    echo
    echo "| step | status | seconds |"
    echo "|---|---|---|"
    awk -F'\t' '{printf "| %s | %s | %s |\n", $1, $2, $3}' "$work/steps.tsv"
    echo
    echo "## Issue #16's targets"
    echo
    timeout 30 "$py" "$root/bench/gpu/targets.py" "$work" "${peak_bf16:-}" 2>&1 ||
      echo "failed (bench/gpu/targets.py could not run with $py)"
    section "GPU tests" "$work/gpu-tests-summary.txt" "not run ($(step_status "GPU tests" | grep . || echo 'the check ended before this step'))"
    echo
    echo "## kiln runs"
    echo
    echo "The NCCL path (every gradient bucket through an all-reduce of one rank) against the same run without it, last step's loss: $(last_loss jit-tf32-nccl) vs $(last_loss jit-tf32-warm)."
    local name
    echo
    echo "The bf16 attention on tensor cores (the default) against the SIMT kernels (KILN_CUDA_BF16_ATTENTION=simt), step and last step's loss: $(median_of jit-bf16), $(last_loss jit-bf16) vs $(median_of jit-bf16-simt), $(last_loss jit-bf16-simt)."
    echo
    echo "ResNet-50 in bf16 (convolutions on cuDNN), kiln jit against PyTorch eager channels_last under autocast, step: $(median_of jit-resnet-bf16) vs $(torch_median torch-resnet-bf16)."
    for name in jit-tf32-cold jit-tf32-warm jit-bf16 jit-bf16-simt jit-tf32-nccl jit-tf32-profile jit-resnet-bf16; do
      echo
      echo "### kiln $name: $(cat "$work/kiln-$name.status" 2>/dev/null || echo 'not run')"
      if [ -s "$work/kiln-$name.txt" ]; then
        echo
        echo '```'
        grep -E "^(device|median|average|time to first|peak|model FLOP|gradient all-reduces|kiln:|step 1/|.*could not record)" "$work/kiln-$name.txt" | head -14
        grep -A16 "^kernel time by primitive" "$work/kiln-$name.txt"
        echo '```'
      fi
    done
    local prec
    for prec in tf32 bf16; do
      section "The reference experiment in $prec beside the peers" "$(ls "$work"/*-"$prec".md 2>/dev/null | head -1)" \
        "$(step_status "comparison, $prec" | grep . || echo 'not run (the check ended before this step)')"
    done
    section "compute-sanitizer" "$work/sanitizer-summary.txt" "$(step_status "compute-sanitizer" | grep . || echo 'not run')"
    section "The reference script as written" "$work/reference-summary.txt" "$(step_status "the reference script" | grep . || echo 'not run')"
  } > "$work/summary.md.tmp" 2>&1
  mv -f "$work/summary.md.tmp" "$work/summary.md"
}
pack() {
  [ "$out" = "$work" ] && return 0
  cp -f "$work/summary.md" "$out/summary.md.tmp" && mv -f "$out/summary.md.tmp" "$out/summary.md"
  # (GNU tar exits 1 when a file, check.log, grew while it was read.)
  tar -czf "$out/results.tar.gz.tmp" -C "$work" . 2>/dev/null
  [ $? -le 1 ] && mv -f "$out/results.tar.gz.tmp" "$out/results.tar.gz"
  cp -f "$work/check.log" "$out/check.log" 2>/dev/null
  return 0
}

# Something in $OUT from the first second on.
write_summary
pack

# --- 1. the machine ----------------------------------------------------------
step "the machine"
date -u
nproc
uname -a
if command -v nvidia-smi > /dev/null; then
  timeout 30 nvidia-smi > "$work/nvidia-smi.txt" 2>&1
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$work/gpus.txt" 2>&1
  head -15 "$work/nvidia-smi.txt"
else
  echo "no nvidia-smi" | tee "$work/nvidia-smi.txt"
fi
# kiln: the carried bundle (unpacked here), else this tree's build.
if [ -f build-gpu/bundle.tar.xz ] && [ ! -x build-gpu/bundle/kiln ]; then
  # (xz-utils is not in every image: Python's tarfile reads .tar.xz too.)
  tar -C build-gpu -xJf build-gpu/bundle.tar.xz 2>/dev/null ||
    timeout 120 "${GPU_CHECK_PYTHON:-python3}" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2])' \
      build-gpu/bundle.tar.xz build-gpu || echo "gpu-check: could not unpack build-gpu/bundle.tar.xz"
fi
kiln_ld=""
if [ -x build-gpu/bundle/kiln ]; then
  bin=$root/build-gpu/bundle
  kiln_from="the bundle ($(cat "$bin/source_commit" 2>/dev/null || echo 'commit unknown'))"
  # The tests name their fixtures by the build's source folder: where it is
  # not here, it becomes a link to here (an existing one is left alone).
  src_dir=$(cat "$bin/source_dir")
  if [ "$src_dir" != "$root" ] && [ ! -e "$src_dir" ]; then
    mkdir -p "$(dirname "$src_dir")" && ln -s "$root" "$src_dir"
  fi
  # The bundle's libraries are Debian 12's (glibc 2.36): where the machine
  # has its own copy of one, that copy is tried first (its glibc may be
  # older), and the bundle's whole set if kiln does not start so.
  mkdir -p "$bin/lib-missing-here"
  for f in "$bin"/lib/*; do
    name=$(basename "$f")
    ldconfig -p 2>/dev/null | grep -qE "^[[:space:]]+$name " || ln -sf "$f" "$bin/lib-missing-here/$name"
  done
  kiln_ld="$bin:$bin/lib-missing-here"
  if ! LD_LIBRARY_PATH="$kiln_ld" timeout 60 "$bin/kiln" --help > /dev/null 2>&1; then
    kiln_ld="$bin:$bin/lib"
  fi
  echo "the bundle's libraries used: ${kiln_ld#*:} ($(ls "${kiln_ld#*:}" | tr '\n' ' '))"
else
  bin=$root/build
  kiln_from="$bin ($(git -C "$root" log -1 --format='%h %s' 2>/dev/null | cut -c1-72))"
fi
# cuBLASLt, NVRTC and NCCL: CUDA's own folder, and the ones PyTorch's wheels bring.
extra=$(timeout 30 "$py" - <<'PY' 2>/dev/null
import glob, os, site
dirs = []
for base in site.getsitepackages() + [site.getusersitepackages()]:
    dirs += sorted(glob.glob(os.path.join(base, "nvidia", "*", "lib")))
print(":".join(d for d in dirs if os.path.isdir(d)))
PY
)
# kiln's programs run through wrappers that give them the bundle's libraries
# and CUDA's; nothing else gets them (the peers keep their own libraries).
kiln_ld="${kiln_ld:+$kiln_ld:}/usr/local/cuda/lib64${extra:+:$extra}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
kbin=$scratch/bin
mkdir -p "$kbin"
for prog in kiln kiln-tests; do
  printf '#!/bin/sh\nLD_LIBRARY_PATH="%s" exec "%s" "$@"\n' "$kiln_ld" "$bin/$prog" > "$kbin/$prog"
  chmod +x "$kbin/$prog"
done
# The tests run kiln by this build's path unless KILN_CLI names another
# (tests/test_util.h): the carried bundle's is not where it was built.
export KILN_CLI=$kbin/kiln
echo "kiln from $kiln_from; its LD_LIBRARY_PATH=$kiln_ld"
echo "glibc here: $(ldd --version 2>/dev/null | head -1); the bundle needs $(cat "$bin/glibc_needed" 2>/dev/null || echo '?')"
# The peers' packages, one by one: a missing one is said, not fatal.
timeout 60 "$py" - > "$work/versions.txt" 2>&1 <<'PY'
import importlib, sys
found = [f"python {sys.version.split()[0]}"]
for name in ("torch", "jax", "flax", "optax", "transformers"):
    try:
        found.append(f"{name} {importlib.import_module(name).__version__}")
    except Exception as e:  # noqa: BLE001
        found.append(f"{name} missing ({type(e).__name__})")
print(", ".join(found))
PY
[ -s "$work/versions.txt" ] || echo "$py did not run" > "$work/versions.txt"
cat "$work/versions.txt"
if [ -x "$bin/kiln" ]; then
  status=$(run_capped 60 "$work/kiln-info.txt" "$kbin/kiln" info)
  head -20 "$work/kiln-info.txt"
  record "$(because "$status" "$work/kiln-info.txt")"
else
  record "failed (no kiln in $bin: run bench/gpu/bundle.sh, or scripts/build.sh)"
fi

# --- 2. the GPU tests ------------------------------------------------------
# A kernel that faults kills its process, or leaves its CUDA context broken
# so that every test after it fails too. So the tests run in rounds: after a
# crash (or a test past its time), the tests not yet run go on in a fresh
# process; then the failed ones run again in a fresh process, where the
# first of them is on its own: its result stands, as does every pass, and
# the other failures go round again. Each round settles at least one test.
step "GPU tests"
filter=${GPU_CHECK_TESTS:-'*Gpu*:CudaCodegen*:CudaBackend*'}
# The first round runs in parallel processes on the one GPU: NVRTC compiles
# (a CPU's work, one thread each) dominate a cold run of the tests.
test_shards=${GPU_CHECK_TEST_SHARDS:-$(($(nproc) >= 8 ? 4 : 2))}
# Rehearsing: the GPU tests run on the reference backend (tests/gpu_device.h).
[ "$device" = cuda ] || export KILN_GPU_TESTS_ON=ref
export KILN_CACHE_DIR=$scratch/cache-tests
outcomes() {  # outcomes LOG [LABEL]: "name<TAB>passed|failed|skipped" per finished test; LABEL (crashed) for one left running
  awk -v label="${2:-crashed}" '$1 == "[" && $3 == "]" {
         name = $4; sub(/,$/, "", name)
         if ($2 == "RUN") { running = name; next }
         if (name != running) next
         print name "\t" ($2 == "OK" ? "passed" : $2 == "FAILED" ? "failed" : "skipped"); running = ""
       }
       END { if (running != "") print running "\t" label }' "$1"
}
left_running() { awk -F'\t' '$2 == "crashed" || $2 == "timed out" {found = 1} END {exit !found}'; }
tests_round() {  # tests_round N LIST SECONDS [SHARDS]: LIST's tests in SHARDS processes at once (gtest's sharding; 1); outcomes into rounds.tsv
  local n=$1 list=$2 secs=$3 shards=${4:-1} i log s label
  : > "$work/gpu-tests.this"
  for ((i = 0; i < shards; i++)); do
    log=$work/gpu-tests-round$n$([ "$shards" -gt 1 ] && echo "-shard$i").log
    (
      [ "$shards" -gt 1 ] && export GTEST_TOTAL_SHARDS=$shards GTEST_SHARD_INDEX=$i
      run_capped "$secs" "$log" "$kbin/kiln-tests" --gtest_filter="$(paste -sd: "$list")" \
        $([ "$n" = 1 ] && echo "--gtest_output=xml:$work/gpu-tests-shard$i.xml") > "$log.status"
    ) &
  done
  wait
  for ((i = 0; i < shards; i++)); do
    log=$work/gpu-tests-round$n$([ "$shards" -gt 1 ] && echo "-shard$i").log
    s=$(cat "$log.status")
    echo "round $n: $(wc -l < "$list") tests$([ "$shards" -gt 1 ] && echo ", shard $((i + 1)) of $shards"): $s"
    label=crashed
    case "$s" in *"timed out"*) label="timed out" ;; esac
    outcomes "$log" "$label" > "$work/gpu-tests.shard"
    cat "$work/gpu-tests.shard" >> "$work/gpu-tests.this"
    # gtest exits 1 when tests fail; any other end with no test left running
    # (a crash before the first test, a timeout between two) leaves the rest unrun.
    case "$s" in ok | "failed (exit status 1)") ;; *)
      left_running < "$work/gpu-tests.shard" ||
        echo "round $n ended between tests: $(because "$s" "$log")" >> "$work/gpu-tests-notes.txt" ;;
    esac
  done
  awk -v n="$n" '{print $0 "\t" n}' "$work/gpu-tests.this" >> "$work/gpu-tests-rounds.tsv"
}
settled() { awk -F'\t' '{print $1}' "$work/gpu-tests-rounds.tsv" | sort -u; }
gpu_tests() {
  : > "$work/gpu-tests-rounds.tsv"
  timeout 60 "$kbin/kiln-tests" --gtest_filter="$filter" --gtest_list_tests 2> "$work/gpu-tests.list.err" | awk '
    /^[^ ]/ {suite = $1} /^  / {print suite $1}' > "$work/gpu-tests.list"
  if [ ! -s "$work/gpu-tests.list" ]; then
    echo "kiln-tests lists no test for '$filter': $(tail -1 "$work/gpu-tests.list.err")" >> "$work/gpu-tests-notes.txt"
    return
  fi
  cp "$work/gpu-tests.list" "$work/gpu-tests.pending"
  # Round 1, then rounds of the tests not yet run after a crash or a test
  # past its time (at most 6, while 330 s are left for the later steps).
  local n=1 secs
  tests_round 1 "$work/gpu-tests.pending" "$(cap 170)" "$test_shards"
  while left_running < "$work/gpu-tests.this"; do
    settled | grep -vxF -f - "$work/gpu-tests.list" > "$work/gpu-tests.pending" || true
    [ -s "$work/gpu-tests.pending" ] || break
    secs=$(($(left) - 330))
    [ "$n" -lt 6 ] && [ "$secs" -ge 30 ] || { echo "(no more rounds: $(left) s left, $n rounds run)"; break; }
    n=$((n + 1))
    tests_round $n "$work/gpu-tests.pending" "$secs"
  done
  # Rounds of the failed tests, in a fresh process each (at most 3): the
  # first settles; of the rest, the ones failing again or not reached go
  # round again. A round where nothing passes ends them: the fault stays.
  awk -F'\t' '$2 == "failed" {print $1}' "$work/gpu-tests-rounds.tsv" > "$work/gpu-tests.failed"
  local rounds=0
  while [ -s "$work/gpu-tests.failed" ]; do
    secs=$(($(left) - 330))
    [ "$rounds" -lt 3 ] && [ "$secs" -ge 20 ] || { echo "(no more rounds of failed tests: $(left) s left)"; break; }
    n=$((n + 1)) rounds=$((rounds + 1))
    tests_round $n "$work/gpu-tests.failed" "$((secs < 60 ? secs : 60))"
    [ -s "$work/gpu-tests.this" ] || break
    awk -F'\t' 'NR == FNR {this[$1] = $2; next}
                FNR > 1 && (!($1 in this) || this[$1] == "failed")' \
      "$work/gpu-tests.this" "$work/gpu-tests.failed" > "$work/gpu-tests.next"
    mv -f "$work/gpu-tests.next" "$work/gpu-tests.failed"
    grep -q "$(printf '\tpassed$')" "$work/gpu-tests.this" || { echo "(no test passed in a fresh process: the fault stays)"; break; }
  done
}
gpu_tests_summary() {  # the final outcome of each test (its last round's); fails unless every test passed or skipped
  awk -F'\t' '{last[$1] = $2; round[$1] = $3; if (!($1 in first)) first[$1] = $2}
       END {for (t in last) print t "\t" last[t] "\t" first[t] "\t" round[t]}' "$work/gpu-tests-rounds.tsv" |
    sort > "$work/gpu-tests-outcomes.tsv"
  local total passed skipped failed crashed slow cleared unrun nogpu
  count() { awk -F'\t' "$1" "$work/gpu-tests-outcomes.tsv" | wc -l; }
  total=$(wc -l < "$work/gpu-tests.list")
  passed=$(count '$2 == "passed" && $3 == "passed"')
  cleared=$(count '$2 == "passed" && $3 != "passed"')
  skipped=$(count '$2 == "skipped"')
  failed=$(count '$2 == "failed"')
  crashed=$(count '$2 == "crashed"')
  slow=$(count '$2 == "timed out"')
  unrun=$((total - $(wc -l < "$work/gpu-tests-outcomes.tsv")))
  echo "$total tests ('$filter'): $passed passed, $skipped skipped, $failed failed, $crashed crashed their process, $slow timed out, $cleared failed only after another test's fault (passed in a fresh process), $unrun not run"
  # The same list runs on kiln's CUDA emulator in every CI run (ctest -L gpu), where all of it passes.
  [ "$device" = cuda ] &&
    echo "  (CI runs these tests on kiln's CUDA emulator, where every one passes: a test failing here is where the emulator and this GPU disagree)"
  # On a GPU machine a test that skips for want of a GPU is a failure of the machine or of kiln's CUDA loading.
  nogpu=$(cat "$work"/gpu-tests-round*.log 2>/dev/null | grep -m1 -o "no CUDA GPU visible ([^)]*)")
  [ -n "$nogpu" ] && echo "  kiln-tests: $nogpu"
  awk -F'\t' '$2 == "failed" || $2 == "crashed" || $2 == "timed out" {print "  " $2 ": " $1}' \
    "$work/gpu-tests-outcomes.tsv" | head -40
  awk -F'\t' '$2 == "passed" && $3 != "passed" {print "  passed in a fresh process (first " $3 "): " $1}' \
    "$work/gpu-tests-outcomes.tsv" | head -20
  cat "$work/gpu-tests-notes.txt" 2>/dev/null
  [ "$total" -gt 0 ] && [ "$failed" -eq 0 ] && [ "$crashed" -eq 0 ] && [ "$slow" -eq 0 ] && [ "$unrun" -eq 0 ] &&
    { [ "$device" != cuda ] || [ -z "$nogpu" ]; }
}
if [ -x "$bin/kiln-tests" ]; then
  rm -f "$work/gpu-tests-notes.txt"
  gpu_tests | tee "$work/gpu-tests-rounds.txt"
  gpu_tests_summary > "$work/gpu-tests-result.txt"
  status=$?
  {
    echo '```'
    cat "$work/gpu-tests-result.txt"
    cat "$work/gpu-tests-rounds.txt"
    echo '```'
    # Each failure's first lines, from the round that settled it.
    awk -F'\t' '$2 == "failed" || $2 == "crashed" || $2 == "timed out" {print $1 "\t" $4}' \
      "$work/gpu-tests-outcomes.tsv" | head -10 |
      while IFS=$'\t' read -r t r; do
        echo
        echo "\`$t\` (round $r):"
        echo '```'
        awk -v t="[ RUN      ] $t" 'FNR == 1 {p = 0} $0 == t {p = 1; next} p && /^\[ / {p = 0} p' \
          "$work/gpu-tests-round$r".log "$work/gpu-tests-round$r"-shard*.log 2>/dev/null | cut -c1-300 | head -14 |
          grep . || echo "(nothing printed after the test started)"
        echo '```'
      done
  } > "$work/gpu-tests-summary.txt"
  cat "$work/gpu-tests-summary.txt"
  if [ "$status" -eq 0 ]; then
    record ok
  else
    record "failed ($({ head -1 "$work/gpu-tests-result.txt" | sed 's/^[0-9]* tests ([^)]*): //'
      sed -n 's/^  kiln-tests: /; /p' "$work/gpu-tests-result.txt"; } | tr -d '\n'))"
  fi
else
  record "failed (no kiln-tests in $bin)"
fi

# --- 3. kiln's own runs ----------------------------------------------------
if [ "$device" = cuda ]; then
  model=vit-base steps=22 warmup=2 kdev=cuda tf32=(--precision tf32)
else
  model=${GPU_CHECK_MODEL:-vit-tiny} steps=${GPU_CHECK_STEPS:-4} warmup=1 kdev=cpu tf32=()
fi
train() {  # train NAME SECONDS FLAGS...: one kiln run; kiln-NAME.{txt,jsonl,status} (STEPS= overrides $steps)
  local name=$1 secs nsteps=${STEPS:-$steps}
  secs=$(cap "$2")
  shift 2
  step "kiln $name"
  if [ "$(left)" -lt 30 ]; then
    echo "skipped ($(left) s left)" > "$work/kiln-$name.status"
    record "$(cat "$work/kiln-$name.status")"
    return
  fi
  echo "kiln train --model $model --batch-size 32 --steps $nsteps --warmup $warmup --device $kdev $*"
  run_capped "$secs" "$work/kiln-$name.txt" "$kbin/kiln" train --model "$model" --batch-size 32 --steps "$nsteps" \
    --warmup "$warmup" --device "$kdev" --log-json "$work/kiln-$name.jsonl" "$@" > "$work/kiln-$name.status"
  because "$(cat "$work/kiln-$name.status")" "$work/kiln-$name.txt" > "$work/kiln-$name.status.tmp"
  mv -f "$work/kiln-$name.status.tmp" "$work/kiln-$name.status"
  grep -E "^(device|median|time to first|peak|model FLOP|kiln:)" "$work/kiln-$name.txt"
  record "$(cat "$work/kiln-$name.status")"
}
export KILN_CACHE_DIR=$scratch/cache-kiln
train jit-tf32-cold 120 --mode jit "${tf32[@]}"
train jit-tf32-warm 60 --mode jit "${tf32[@]}"
# (KILN_DEBUG=1: the compiler verifies every pass and says if the step could
# not be recorded as a graph; only the first step, untimed, pays for it.)
KILN_DEBUG=1 train jit-bf16 60 --mode jit --precision bf16
# The same run with the bf16 attention on the SIMT kernels (tensor cores are
# the default since the first check, 2026-12-04): step time and loss beside jit-bf16's.
KILN_CUDA_BF16_ATTENTION=simt train jit-bf16-simt 60 --mode jit --precision bf16
# The same run as jit-tf32-warm with every gradient bucket through an
# all-reduce (on CUDA a NCCL communicator of one rank): the same losses.
train jit-tf32-nccl 60 --mode jit "${tf32[@]}" --all-reduce always
grep -h '"loss"' "$work/kiln-jit-tf32-warm.jsonl" 2>/dev/null | tail -1
grep -h '"loss"' "$work/kiln-jit-tf32-nccl.jsonl" 2>/dev/null | tail -1

# --- 4. the GPU's matmul rates --------------------------------------------
peak_tf32="" peak_bf16=""
if [ "$device" = cuda ] && [ "$(left)" -lt 40 ]; then
  skip "matmul rates" "$(left) s left"
elif [ "$device" = cuda ]; then
  step "matmul rates"
  peak_tf32=$(timeout -k 5 "$(cap 60)" "$py" bench/peers/gpu_peak.py --dtype tf32 2>>"$work/gpu-peak.log")
  peak_bf16=$(timeout -k 5 "$(cap 60)" "$py" bench/peers/gpu_peak.py --dtype bf16 2>>"$work/gpu-peak.log")
  cat "$work/gpu-peak.log"
  # A number, or nothing (a failed run prints its error to the log).
  [[ "$peak_tf32" =~ ^[0-9]+$ ]] || peak_tf32=""
  [[ "$peak_bf16" =~ ^[0-9]+$ ]] || peak_bf16=""
  if [ -n "$peak_tf32" ] && [ -n "$peak_bf16" ]; then record ok
  else record "$(because "failed (no rate)" "$work/gpu-peak.log")"; fi
else
  skip "matmul rates" "device $device: MFU against the runs' own FMA-loop peak"
fi

# --- 5-9. the comparisons, the profile, the sanitizer, the reference script ---------------------------------
compare() {  # compare PRECISION MIN_SECONDS CAP_SECONDS
  local prec=$1 l
  l=$(left)
  if [ "$l" -lt "$2" ]; then
    skip "comparison, $prec" "${l} s left"
    return
  fi
  step "comparison, $prec"
  local peak_flag=() p
  p=$([ "$prec" = tf32 ] && echo "$peak_tf32" || echo "$peak_bf16")
  [ -n "$p" ] && peak_flag=(--peak-gflops "$p")
  local pypath
  pypath=$(command -v "$py" || echo "$py")
  # compare.py keeps to its budget and rewrites its report after every
  # program; the timeout around it is only a safety net.
  local secs
  secs=$(cap "$3")
  timeout -k 10 $((secs + 20)) "$py" bench/compare.py --python "$pypath" --kiln "$kbin/kiln" \
    --device "$device" --precision "$prec" --model "$model" --steps "$steps" --warmup "$warmup" \
    --run-timeout 110 --budget "$secs" --out "$work" "${peak_flag[@]}"
  local rc=$? md
  md=$(ls "$work"/*-"$prec".md 2>/dev/null | head -1)
  if [ -n "$md" ]; then
    local n
    n=$(grep -c '| failed (' "$md")
    record "$([ "$n" -eq 0 ] && echo ok || echo "ok, with $n of its programs failed (the table says why)")"
  else
    record "$(status_of $rc "$secs") (no report)"
  fi
}
compare tf32 60 260
# Kernel time per primitive of the jitted tf32 step (the profiler waits for
# each kernel, so the step runs op by op, not replayed as a graph).
KILN_PROFILE=1 KILN_REPLAY=0 STEPS=$((warmup + 4)) train jit-tf32-profile 60 --mode jit "${tf32[@]}"
# ResNet-50 in bf16 (its convolutions on cuDNN), batch 32, 224x224, beside
# PyTorch eager channels_last under autocast, when 100 s are left;
# rehearsing, kiln's ResNet-18 and PyTorch's ResNet-50 at 32x32.
if [ "$(left)" -lt 100 ]; then
  skip "kiln jit-resnet-bf16" "$(left) s left"
  skip "PyTorch ResNet bf16" "$(left) s left"
else
  cnn=$([ "$device" = cuda ] && echo resnet-50 || echo resnet-18)
  cnn_size=$([ "$device" = cuda ] && echo 224 || echo 32)
  model=$cnn STEPS=$((warmup + 6)) train jit-resnet-bf16 60 --mode jit --precision bf16 --image-size "$cnn_size"
  step "PyTorch ResNet bf16"
  s=$(run_capped "$(cap 40)" "$work/torch-resnet-bf16.log" "$py" bench/peers/torch_cnn.py --model resnet-50 \
    --device "$device" --precision bf16 --channels-last --image-size "$cnn_size" --steps $((warmup + 6)) --warmup "$warmup")
  record "$(because "$s" "$work/torch-resnet-bf16.log")"
fi
sanitizer=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null)
if [ "$device" != cuda ]; then
  skip "compute-sanitizer" "device $device"
elif [ -z "$sanitizer" ]; then
  skip "compute-sanitizer" "none on the PATH or in /usr/local/cuda/bin"
elif [ "$(left)" -lt 60 ]; then
  skip "compute-sanitizer" "$(left) s left"
else
  # The kernels most likely to go out of bounds or race; racecheck only
  # where memcheck found the sanitizer working (gVisor: "Device not supported").
  step "compute-sanitizer"
  sfilter='*GpuForwardMatchesCpu/*attention*:*GpuForwardMatchesCpu/*sum*:*GpuForwardMatchesCpu/*transpose*:*GpuForwardMatchesCpu/*layer_norm*:*GpuForwardMatchesCpu/*softmax*'
  : > "$work/sanitizer-summary.txt"
  for tool in memcheck racecheck; do
    if grep -qiE "not supported|error 999" "$work/sanitizer-memcheck.log" 2>/dev/null; then
      echo "compute-sanitizer $tool: skipped (memcheck could not run here)" >> "$work/sanitizer-summary.txt"
      continue
    fi
    s=$(run_capped "$(cap 45)" "$work/sanitizer-$tool.log" env LD_LIBRARY_PATH="$kiln_ld" "$sanitizer" \
      --tool "$tool" --print-limit 20 "$bin/kiln-tests" --gtest_filter="$sfilter")
    echo "compute-sanitizer $tool: $s; $(grep -cE '^========= (Invalid|Race|Error)' \
      "$work/sanitizer-$tool.log") reports; $(grep -m1 -iE 'not supported|ERROR SUMMARY|error 999' \
      "$work/sanitizer-$tool.log" | cut -c1-160)" | tee -a "$work/sanitizer-summary.txt"
    grep -E "^========= " "$work/sanitizer-$tool.log" | head -15
  done
  record "$([ "$(grep -c ': ok; 0 reports' "$work/sanitizer-summary.txt")" -eq 2 ] && echo ok || echo 'failed (see the section)')"
fi
# --- the reference script, as written -----------------------------------
ref=${GPU_CHECK_REFERENCE:-$bin/reference/reference_train.py}
[ -f "$ref" ] || [ -n "${GPU_CHECK_REFERENCE:-}" ] || ref=$root/../shared/reference/reference_train.py
if [ ! -f "$ref" ]; then
  skip "the reference script" "no reference_train.py (bench/gpu/bundle.sh carries ../shared/reference/'s when it is there)"
elif [ "$(left)" -lt 90 ]; then
  skip "the reference script" "$(left) s left"
else
  step "the reference script"
  # On a GPU the experiment as published (batch 32, 52 steps); rehearsing, a
  # batch the CPU gets through.
  rbatch=$([ "$device" = cuda ] && echo 32 || echo "${GPU_CHECK_REFERENCE_BATCH:-2}")
  : > "$work/reference-summary.txt"
  for mode in pytorch jax; do
    if [ "$(left)" -lt 45 ]; then
      echo "- \`--mode $mode\`: skipped ($(left) s left)" | tee -a "$work/reference-summary.txt"
      continue
    fi
    s=$(run_capped "$(cap 90)" "$work/reference-$mode.log" "$py" bench/peers/run_reference.py --script "$ref" \
      --device "$device" -- --mode "$mode" --batch-size "$rbatch")
    echo "- \`--mode $mode --batch-size $rbatch\`: $(because "$s" "$work/reference-$mode.log")$(grep -m1 \
      '^average step time' "$work/reference-$mode.log" | sed 's/^/; it prints /')$(grep '^run_reference: ' \
      "$work/reference-$mode.log" | sed 's/^run_reference: //' | paste -sd';' - | sed 's/^./ (stand-ins: &/; s/$/)/' |
      grep -v '^)$')" | tee -a "$work/reference-summary.txt"
  done
  record "$(grep -q ': failed' "$work/reference-summary.txt" && echo 'failed (see the section)' || echo ok)"
fi

compare bf16 120 200

step "summary"
write_summary
pack
echo "gpu-check: done in $(($(date +%s) - start)) s; results in $out (summary.md$([ "$out" = "$work" ] || echo ', check.log, results.tar.gz'))"
