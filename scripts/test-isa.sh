#!/usr/bin/env bash
# The whole test suite on an AVX2-only configuration, on any x86-64 machine:
# kiln's kernels built for x86-64-v3 (AVX2 + FMA, no AVX-512) into build-avx2/,
# oneDNN capped by ONEDNN_MAX_CPU_ISA=AVX2 and oneMKL by
# MKL_ENABLE_INSTRUCTIONS=AVX2, so that no AVX-512-only path ships untested
# (bf16 GEMMs take their f32 path here). CI runs it after scripts/test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_ARCH=x86-64-v3 \
  -DKILN_BUILD_BENCH=OFF -DKILN_CUDA=OFF -DKILN_MPI=OFF | grep '^-- kiln:' || true
ninja -C build-avx2 -j"${KILN_JOBS:-2}"
cd build-avx2
export ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 KILN_EXPECT_GEMM_ISA=AVX2
ctest --output-on-failure -j"${KILN_JOBS:-2}"
