#!/usr/bin/env bash
# The Python package's PyTorch interop tests (python/tests/test_torch_interop.py:
# DLPack both ways, bfloat16 and strided views included) in an environment of
# their own, .venv-torch (python/requirements-torch.txt; remade when that file
# changes), so that the suite's .venv goes without PyTorch's 5 GB. Builds
# kiln as scripts/build.sh does (in CI, after scripts/test.sh, nothing is left
# to build) and runs the file against build/python.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
venv=.venv-torch
if ! cmp -s python/requirements-torch.txt "$venv/kiln-requirements.txt" 2>/dev/null; then
  echo "kiln test-torch: making $venv (python/requirements-torch.txt)"
  rm -rf "$venv"
  python=/usr/bin/python3
  [ -x "$python" ] || python=python3
  "$python" -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check -r python/requirements-torch.txt
  cp python/requirements-torch.txt "$venv/kiln-requirements.txt"
fi
cd build/python
KILN_TEST_TORCH=1 PYTHONPATH=. "../../$venv/bin/python" -m pytest -q -p no:cacheprovider \
  ../../python/tests/test_torch_interop.py
