#!/usr/bin/env bash
# Installs dependencies, builds kiln and runs the whole test suite with CTest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j"${KILN_JOBS:-2}"
