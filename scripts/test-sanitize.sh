#!/usr/bin/env bash
# The whole test suite under AddressSanitizer and UndefinedBehaviorSanitizer
# (clang, -O1), from the instrumented build that scripts/fuzz.sh shares
# (scripts/build-instrumented.sh, build-asan/): any report fails the test
# that caused it. CI runs it after scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build-instrumented.sh
cd build-asan
export ASAN_OPTIONS=${ASAN_OPTIONS:-abort_on_error=0:detect_stack_use_after_return=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1}
export LSAN_OPTIONS=${LSAN_OPTIONS:-suppressions=$PWD/../scripts/lsan.supp}
ctest --output-on-failure -j"${KILN_JOBS:-2}"
