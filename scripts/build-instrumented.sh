#!/usr/bin/env bash
# The one instrumented build that the sanitizer and fuzz stages share,
# build-asan/: clang at -O1 with assertions on (Debug), AddressSanitizer and
# UndefinedBehaviorSanitizer on every target, libFuzzer's coverage on kiln's
# libraries, and both the test suite and the fuzz harnesses of fuzz/.
# scripts/test-sanitize.sh runs the tests from it, scripts/fuzz.sh the
# harnesses; whichever runs second finds it built.
#
#   bash scripts/build-instrumented.sh [ninja targets]   # default: everything
set -euo pipefail
cd "$(dirname "$0")/.."
# kiln's own dependencies, and clang with libFuzzer, the sanitizers' runtimes
# and its OpenMP.
bash scripts/setup.sh clang libclang-rt-14-dev libomp-14-dev
CC=clang CXX=clang++ cmake -S . -B build-asan -G Ninja -DCMAKE_BUILD_TYPE=Debug \
  -DKILN_SANITIZE=address,undefined -DKILN_FUZZ=ON \
  -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF -DKILN_MPI=OFF | grep '^-- kiln:' || true
ninja -C build-asan -j"${KILN_JOBS:-2}" "$@"
