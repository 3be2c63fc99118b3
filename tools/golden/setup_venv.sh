#!/usr/bin/env bash
# Creates tools/golden/.venv: Debian's PyTorch (python3-torch) plus a pinned
# transformers from PyPI, for generating the golden fixtures. kiln itself never
# needs Python; only this generator does.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
if ! /usr/bin/python3 -c "import torch" 2>/dev/null || ! /usr/bin/python3 -m venv --help >/dev/null 2>&1; then
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq python3-torch python3-venv
fi
if [ ! -x "$here/.venv/bin/python" ]; then
  /usr/bin/python3 -m venv --system-site-packages "$here/.venv"
fi
"$here/.venv/bin/pip" install -q "transformers==4.46.3" "safetensors==0.4.5" "tokenizers==0.20.3"
"$here/.venv/bin/python" -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
