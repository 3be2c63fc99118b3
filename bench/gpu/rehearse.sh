#!/usr/bin/env bash
# Rehearses the GPU check (bench/gpu/check.sh) on this machine as the device
# tool runs it: from a copy of the tree (tracked and untracked-not-ignored
# files) with only the bundle carried, $OUT set, on the cpu
# (GPU_CHECK_DEVICE=cpu), and asserts that every scenario leaves in $OUT a
# summary.md with every section, check.log and results.tar.gz (at most 8
# files, no folders: what the device tool brings back), that every step is
# in the steps table, and that each fault shows as "failed (reason)".
#
#   bash bench/gpu/rehearse.sh --cheap    CI's form, about a minute: the bundle packed from build/,
#                                         the fmnist-sized model, three scenarios:
#       no-peers      a Python without the peers' packages;
#       faults        a shard of the GPU tests crashes midway (SIGSEGV), the rest then fail
#                     after a (simulated) fault, one of them every time; the bf16 kiln run fails;
#       out-of-time   a 30 s budget: the steps that do not fit say so;
#   bash bench/gpu/rehearse.sh [--keep]   the full form, 15-25 minutes: build-gpu/bundle.tar.xz
#                                         (bench/gpu/bundle.sh) and the GPU machine's peers
#                                         (bench/peers/setup_venv.sh --gpu-machine):
#       no-peers      as above;
#       failing-peer  the peers, the JAX peer made to fail, and the cheap form's faults;
#       peers         the peers, vit-tiny, every step measured.
#     --keep copies each scenario's results to bench/results/<date>-gpu-check-rehearsal-<scenario>/.
set -euo pipefail
cd "$(dirname "$0")/../.."
root=$PWD
form=full keep=0
for a in "$@"; do
  case "$a" in
    --cheap) form=cheap ;;
    --keep) keep=1 ;;
    *) echo "bench/gpu/rehearse.sh: unknown argument '$a', expected --cheap or --keep" >&2; exit 2 ;;
  esac
done
tmp=$(mktemp -d /tmp/kiln-rehearse.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
failures=0
fail() { echo "REHEARSAL FAILED ($scenario): $*" >&2; failures=$((failures + 1)); }

if [ "$form" = cheap ]; then
  KILN_BUNDLE_FROM=build KILN_BUNDLE_OUT="$tmp/bundle" bash bench/gpu/bundle.sh
  bundle=$tmp/bundle/bundle.tar.xz
else
  bundle=build-gpu/bundle.tar.xz
  [ -f "$bundle" ] || { echo "bench/gpu/rehearse.sh: no $bundle: run bash bench/gpu/bundle.sh first" >&2; exit 1; }
  peers_py=$root/bench/peers/.venv-gpu-machine/bin/python
  [ -x "$peers_py" ] || { echo "bench/gpu/rehearse.sh: no $peers_py: run bash bench/peers/setup_venv.sh --gpu-machine" >&2; exit 1; }
fi

# Pythons: one without any site-packages; one whose JAX peer fails.
printf '#!/bin/sh\nexec %s -S "$@"\n' "$(command -v python3)" > "$tmp/python-bare"
printf '#!/bin/sh\ncase "$*" in *jax_vit.py*) echo "rehearsal: this peer was made to fail" >&2; exit 3 ;; esac\nexec %s "$@"\n' \
  "${peers_py:-$tmp/python-bare}" > "$tmp/python-failing-jax"
chmod +x "$tmp/python-bare" "$tmp/python-failing-jax"

copy_tree() {  # copy_tree DIR: what the device tool sends, and the bundle
  mkdir -p "$1/build-gpu"
  git ls-files -co --exclude-standard -z | tar --null -T - --ignore-failed-read -cf - 2>/dev/null | tar -C "$1" -xf -
  cp "$bundle" "$1/build-gpu/bundle.tar.xz"
}

inject_faults() {  # inject_faults TREE: the GPU tests crash midway; kiln's bf16 run fails
  local b=$1/build-gpu/bundle
  tar -C "$1/build-gpu" -xJf "$1/build-gpu/bundle.tar.xz"
  mv "$b/kiln" "$b/kiln.real"
  mv "$b/kiln-tests" "$b/kiln-tests.real"
  cat > "$b/kiln" <<'SH'
#!/bin/sh
case " $* " in *" bf16 "*) echo "rehearsal: this kiln run was made to fail" >&2; exit 3 ;; esac
exec "$(dirname "$0")/kiln.real" "$@"
SH
  # The GPU tests: the first round's first shard crashes 2 s in (SIGSEGV);
  # in the next run every test after the fifth fails (as after a kernel fault
  # that breaks the CUDA context); sum_all fails in every run (a real failure).
  cat > "$b/kiln-tests" <<'SH'
#!/bin/sh
real="$(dirname "$0")/kiln-tests.real"
case "$*" in *--gtest_list_tests*) exec "$real" "$@" ;; esac
if [ "${GTEST_SHARD_INDEX:-}" = 0 ]; then
  "$real" "$@" & pid=$!
  sleep 2
  kill -SEGV $pid 2>/dev/null
  wait $pid
  exit $?
fi
n=0
if [ -z "${GTEST_SHARD_INDEX:-}" ]; then
  n=$(($(cat "$(dirname "$0")/.runs" 2>/dev/null || echo 0) + 1))
  echo $n > "$(dirname "$0")/.runs"
fi
"$real" "$@" | awk -v n=$n '
  $2 == "RUN" { bad = $4 ~ /GpuForwardMatchesCpu\/sum_all$/; if (n == 1 && ++ran > 5) broken = 1 }
  $2 == "OK" && (bad || broken) { print "[  FAILED  ] " $4 " (0 ms)"; failed = 1; next }
  { print }
  END { exit failed }'
SH
  chmod +x "$b/kiln" "$b/kiln-tests"
}

sections=("## Steps" "## Issue #16's targets" "## GPU tests" "## kiln runs" "### kiln jit-tf32-cold"
          "### kiln jit-tf32-warm" "### kiln jit-bf16" "### kiln jit-bf16-simt" "### kiln jit-tf32-nccl"
          "### kiln jit-tf32-profile" "### kiln jit-resnet-bf16"
          "## The reference experiment in tf32 beside the peers" "## The reference experiment in bf16 beside the peers"
          "## compute-sanitizer" "## The reference script as written")
steps=("the machine" "GPU tests" "kiln jit-tf32-cold" "kiln jit-tf32-warm" "kiln jit-bf16" "kiln jit-bf16-simt"
       "kiln jit-tf32-nccl"
       "matmul rates" "comparison, tf32" "kiln jit-tf32-profile" "kiln jit-resnet-bf16"
       "PyTorch ResNet bf16" "compute-sanitizer" "the reference script"
       "comparison, bf16")
targets=("kiln jit step ≤ 0.7× the fastest peer's (tf32)" "kiln jit bf16 MFU ≥ 50% of the measured bf16 matmul rate"
         "time to first step < 2 s, kernel cache warm (cold reported)" "peak device memory ≤ the peers' (tf32)"
         "kiln jit ≥ 1.25× kiln eager (tf32)")

check_out() {  # check_out OUT EXPECTED...: the files, the sections, the steps, and each expected line
  local out=$1 s n
  shift
  for f in summary.md check.log results.tar.gz; do [ -s "$out/$f" ] || fail "no $f in \$OUT"; done
  n=$(find "$out" -mindepth 1 | wc -l)
  [ "$n" -le 8 ] || fail "\$OUT holds $n entries (the device tool brings back 8 files)"
  [ -z "$(find "$out" -mindepth 1 -type d)" ] || fail "\$OUT holds folders"
  for s in "${sections[@]}"; do  # a heading, alone or followed by ': status'
    awk -v s="$s" '$0 == s || index($0, s ": ") == 1 {found = 1} END {exit !found}' "$out/summary.md" ||
      fail "summary.md lacks '$s'"
  done
  for s in "${steps[@]}"; do grep -qF "| $s | " "$out/summary.md" || fail "the steps table lacks '$s'"; done
  for s in "${targets[@]}"; do grep -qF "| $s | " "$out/summary.md" || fail "the targets table lacks '$s'"; done
  [ "$(awk '/^## Steps/,/^## Issue/' "$out/summary.md" | grep -c '^| ')" -eq $((${#steps[@]} + 1)) ] ||
    fail "the steps table has other rows than the ${#steps[@]} steps"
  mkdir -p "$out.unpacked"
  tar -xzf "$out/results.tar.gz" -C "$out.unpacked" || fail "results.tar.gz does not unpack"
  for f in summary.md check.log steps.tsv; do [ -s "$out.unpacked/$f" ] || fail "results.tar.gz lacks $f"; done
  for s in "$@"; do grep -qE -e "$s" "$out/summary.md" || fail "summary.md lacks /$s/"; done
}

scenario() {  # scenario NAME PYTHON MODEL STEPS BUDGET FAULTS EXPECTED...
  scenario=$1
  local py=$2 model=$3 nsteps=$4 budget=$5 faults=$6 t0
  shift 6
  t0=$(date +%s)
  local tree=$tmp/$scenario/tree out=$tmp/$scenario/out
  mkdir -p "$tree" "$out"
  copy_tree "$tree"
  [ "$faults" = yes ] && inject_faults "$tree"
  echo "=== rehearsal: $scenario (python $py, $model, $nsteps steps, budget $budget s, faults: $faults)"
  OUT=$out GPU_CHECK_WORK=$tmp/$scenario/work GPU_CHECK_DEVICE=cpu GPU_CHECK_PYTHON=$py \
    GPU_CHECK_MODEL=$model GPU_CHECK_STEPS=$nsteps GPU_CHECK_BUDGET_S=$budget \
    bash "$tree/bench/gpu/check.sh" > "$tmp/$scenario/stdout.log" 2>&1 || fail "check.sh exited with status $?"
  check_out "$out" "$@"
  echo "=== rehearsal: $scenario took $(($(date +%s) - t0)) s"
  sed -n '/^## Steps/,/^## kiln runs/p' "$out/summary.md"
  if [ "$keep" = 1 ]; then
    local dest=bench/results/$(date +%Y-%m-%d)-gpu-check-rehearsal-$scenario
    rm -rf "$dest" && mkdir -p "$dest" && cp -r "$out.unpacked/." "$dest/"
    echo "kept in $dest"
  fi
}

no_peer='\| pytorch eager \| failed \(exit code 1: ModuleNotFoundError'
kiln_row='\| kiln jit \| [0-9.]+ s \|'
crash='GPU tests \| failed \([0-9]+ passed, [0-9]+ skipped, 1 failed, 1 crashed their process, 0 timed out, [1-9][0-9]* failed only after'
rounds='round 1: [0-9]+ tests, shard 1 of [0-9]+: failed \(killed by signal 11: SEGV\)'
settled='failed: AllPrimitives/OpTable.GpuForwardMatchesCpu/sum_all|passed in a fresh process \(first failed\)'
bf16_failed='### kiln jit-bf16: failed \(exit status 3: rehearsal: this kiln run was made to fail\)'
tensor_cores='against the SIMT kernels \(KILN_CUDA_BF16_ATTENTION=simt\), step and last step.s loss: median [0-9.]+ m?s, [-0-9.e]+ vs median [0-9.]+ m?s, [-0-9.e]+\.'
bf16_target='MFU .*\| failed \(kiln jit-bf16: failed \(exit status 3'
if [ "$form" = cheap ]; then
  scenario no-peers "$tmp/python-bare" vit-fmnist 2 520 no "$no_peer" "$kiln_row" 'kiln jit-tf32-warm \| ok' \
    "$tensor_cores"
  scenario faults "$tmp/python-bare" vit-fmnist 2 520 yes "$crash" "$rounds" "$settled" "$bf16_failed" "$bf16_target"
  scenario out-of-time "$tmp/python-bare" vit-fmnist 2 30 no 'kiln jit-tf32-cold \| skipped \([0-9]+ s left\)' \
    'comparison, tf32 \| skipped \([0-9-]+ s left\)' 'not measured'
else
  scenario no-peers "$tmp/python-bare" vit-fmnist 2 1800 no "$no_peer" "$kiln_row"
  scenario failing-peer "$tmp/python-failing-jax" vit-fmnist 3 1800 yes "$crash" "$rounds" "$settled" "$bf16_failed" \
    '\| jax jit \| failed \(exit code 3: rehearsal: this peer was made to fail\)' '\| torch.compile \| [0-9.]+ s \|'
  scenario peers "$peers_py" vit-tiny 4 2400 no "$kiln_row" '\| jax jit \| [0-9.]+ s \|' \
    '\| torch.compile \| [0-9.]+ s \|' '--mode jax --batch-size 2`: ok; .*average step time'
fi
if [ "$failures" -gt 0 ]; then
  echo "bench/gpu/rehearse.sh: $failures assertion(s) failed" >&2
  exit 1
fi
echo "bench/gpu/rehearse.sh ($form): every scenario left a complete summary"
