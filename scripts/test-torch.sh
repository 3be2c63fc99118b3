#!/usr/bin/env bash
# The Python package's PyTorch interop tests (python/tests/test_torch_interop.py:
# DLPack both ways, bfloat16 and strided views included) in an environment of
# their own, so that the suite's .venv goes without PyTorch's 5 GB. Builds
# kiln as scripts/build.sh does (in CI, after scripts/test.sh, nothing is left
# to build) and runs the file against build/python.
#
# The environment is made once per machine and kept in kiln's cache folder
# ($KILN_CACHE_DIR, else ~/.cache/kiln), named by a hash of
# python/requirements-torch.txt and python/requirements.txt (pinned versions)
# and of the Python it runs on; a clone of another commit with the same requirements finds it
# there, as ccache's objects are found. Unpacking PyTorch's wheels took
# 60-70 s of each CI run. It is made in a temporary folder, checked (torch
# imports) and renamed, so an interrupted install leaves nothing behind.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
python=/usr/bin/python3
[ -x "$python" ] || python=python3
cache="${KILN_CACHE_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/kiln}"
key=$( (cat python/requirements-torch.txt python/requirements.txt; "$python" -c 'import sys; print(sys.version)') |
  sha256sum | cut -c1-16)
venv="$cache/venv-torch-$key"
if ! [ -x "$venv/bin/python" ]; then  # only a checked environment is renamed into place
  echo "kiln test-torch: making $venv (python/requirements-torch.txt)"
  mkdir -p "$cache"
  rm -rf "$venv"
  tmp=$(mktemp -d "$cache/venv-torch-tmp.XXXXXX")
  trap 'rm -rf "$tmp"' EXIT
  "$python" -m venv "$tmp"
  "$tmp/bin/python" -m pip install -q --disable-pip-version-check -r python/requirements-torch.txt
  "$tmp/bin/python" -c 'import torch'
  mv "$tmp" "$venv"
  trap - EXIT
  # Environments of older requirements go: each is 5 GB.
  find "$cache" -maxdepth 1 -name 'venv-torch-*' ! -path "$venv" -exec rm -rf {} +
else
  echo "kiln test-torch: using $venv"
fi
cd build/python
KILN_TEST_TORCH=1 PYTHONPATH=. "$venv/bin/python" -m pytest -q -p no:cacheprovider \
  ../../python/tests/test_torch_interop.py
