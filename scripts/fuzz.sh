#!/usr/bin/env bash
# Fuzzes every parser of kiln for a bounded time. Builds the libFuzzer harnesses
# of fuzz/ (one per parser: safetensors, config, idx, image, checkpoint,
# plot_log, command_line, pretrained, preprocessor, tokenizer) with clang, ASan
# and UBSan into build-asan/, the instrumented build that the sanitizer stage
# shares (scripts/build-instrumented.sh; after it, nothing is left to build), then runs
# each for KILN_FUZZ_SECONDS on a copy of its seeds (fuzz/corpus/<name>/; the
# committed corpus is never modified), KILN_JOBS harnesses at a time.
#
# Fails, naming the harness and the input, when an input crashes a harness:
# a signal, a sanitizer report, an exception other than kiln::Error, one input
# running over 10 s, or over 2 GB of memory (RSS or a single allocation). The
# input is kept in build-asan/crashes/<name>/; once kiln is fixed, commit it to
# tests/fuzz/regressions/<name>/, where the normal test build replays it
# (tests/fuzz/fuzz_regressions_test.cpp).
#
#   KILN_FUZZ_SECONDS  seconds per harness (default 30)
#   KILN_FUZZ_TARGETS  the harnesses to run (default: all), e.g. "idx image"
#   KILN_JOBS          build jobs, and harnesses run at once (default 2)
#
# Reproduce a crash: build-asan/kiln-fuzz-<name> build-asan/crashes/<name>/crash-...
# Regenerate the seeds: ninja -C build-asan kiln-fuzz-corpus && build-asan/kiln-fuzz-corpus fuzz
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
seconds="${KILN_FUZZ_SECONDS:-30}"
jobs="${KILN_JOBS:-2}"
targets=(${KILN_FUZZ_TARGETS:-safetensors config idx image checkpoint plot_log command_line pretrained preprocessor tokenizer})

KILN_JOBS=$jobs bash scripts/build-instrumented.sh kiln-fuzz
echo "kiln fuzz: set up and built in $SECONDS s"

# Scratch space in memory where there is some; the harnesses write their
# files into TMPDIR, so that a crashed harness leaves nothing behind either.
base=/tmp
[ -d /dev/shm ] && [ -w /dev/shm ] && base=/dev/shm
work=$(mktemp -d "$base/kiln-fuzz.XXXXXX")
trap 'rm -rf "$work"' EXIT
export UBSAN_OPTIONS=print_stacktrace=1
export LSAN_OPTIONS="suppressions=$root/scripts/lsan.supp:print_suppressions=0"

# Runs one harness; its log is $work/<name>.log.
fuzz_one() {
  local name=$1 crashes="$root/build-asan/crashes/$1" dict=()
  mkdir -p "$work/$name/corpus" "$work/$name/tmp" "$crashes"
  cp fuzz/corpus/"$name"/* "$work/$name/corpus/"
  [ -f "fuzz/$name.dict" ] && dict=(-dict="$root/fuzz/$name.dict")
  # From an empty directory with no stdin: a path in a fuzzed command line
  # reaches none of the tree's files and cannot wait for a terminal.
  (cd "$work/$name/tmp" && TMPDIR="$work/$name/tmp" "$root/build-asan/kiln-fuzz-$name" \
    -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$crashes/" "${dict[@]}" "$work/$name/corpus" </dev/null)
}

failed=()
report() {  # name, exit status
  local name=$1 status=$2 log="$work/$1.log"
  if [ "$status" -eq 0 ]; then
    echo "kiln fuzz: $name: no crash in ${seconds} s ($(grep -o 'stat::number_of_executed_units: [0-9]*' "$log" | grep -o '[0-9]*$' || echo '?') inputs)"
    return
  fi
  local input
  input=$(grep -o 'Test unit written to .*' "$log" | tail -1 | sed 's/Test unit written to //')
  echo "kiln fuzz: FAILED: kiln-fuzz-$name on ${input:-an input it did not write (see the log)}"
  tail -n 60 "$log" | sed 's/^/    /'
  echo "    reproduce: build-asan/kiln-fuzz-$name ${input:-}"
  echo "    once fixed, keep it: cp ${input:-INPUT} tests/fuzz/regressions/$name/"
  failed+=("kiln-fuzz-$name: ${input:-see its log}")
}

echo "kiln fuzz: ${#targets[@]} harnesses, ${seconds} s each, $jobs at a time"
declare -A name_of=()  # running harnesses by process id
wait_for_one() {
  local pid status=0
  wait -n -p pid || status=$?
  report "${name_of[$pid]}" "$status"
  unset "name_of[$pid]"
}
for name in "${targets[@]}"; do
  [ -x "build-asan/kiln-fuzz-$name" ] || { echo "kiln fuzz: no harness '$name'" >&2; exit 2; }
  while [ "${#name_of[@]}" -ge "$jobs" ]; do wait_for_one; done
  fuzz_one "$name" >"$work/$name.log" 2>&1 &
  name_of[$!]=$name
done
while [ "${#name_of[@]}" -gt 0 ]; do wait_for_one; done

if ((${#failed[@]})); then
  echo "kiln fuzz: ${#failed[@]} harness(es) crashed:"
  printf '  %s\n' "${failed[@]}"
  exit 1
fi
echo "kiln fuzz: every harness ran ${seconds} s without a crash ($SECONDS s in all)"
