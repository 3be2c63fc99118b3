#!/usr/bin/env bash
# Configures kiln into build/ (Release, Ninja) and builds the given targets
# (everything when none are given) with two jobs unless KILN_JOBS says more; the
# Python package too (build/python, with the .venv that scripts/setup.sh makes).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_PYTHON=ON \
  -DPython_EXECUTABLE="$PWD/.venv/bin/python" | grep "^-- kiln:" || true
ninja -C build -j"${KILN_JOBS:-2}" "$@"
