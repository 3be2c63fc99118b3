#!/usr/bin/env bash
# Installs what kiln needs to build and test on Debian 12 (root, or sudo),
# and any further Debian packages named as arguments (scripts/fuzz.sh's clang).
set -euo pipefail
# libxbyak-dev: fused elementwise programs compiled to AVX-512 code; ocl-icd-opencl-dev: libdnnl-dev's CMake config requires OpenCL; libjpeg62-turbo-dev:
# libturbojpeg0-dev's CMake config names libjpeg.so; python3-pip and ca-certificates:
# scripts/fetch-mkl.sh downloads oneMKL with pip; openmpi-bin and libopenmpi-dev: data-parallel
# training (mpirun -np N kiln train); iproute2: the test that runs two ranks in two network
# namespaces; libcurl4-openssl-dev and libssl-dev: downloads from the Hugging Face Hub
# (libcurl) and their SHA-256 checks (OpenSSL's libcrypto); python3-venv and python3-dev: the
# Python package's virtual environment and its module's build; ccache: rebuilds (another clone,
# a later CI run) take unchanged objects from its cache; libpcre2-dev: the Unicode classes of
# GPT-2's pre-tokenizer pattern (src/data/tokenizer.cpp).
packages=(g++ cmake ninja-build ccache libdnnl-dev libxbyak-dev ocl-icd-opencl-dev libgtest-dev libbenchmark-dev libcli11-dev
          nlohmann-json3-dev zlib1g-dev libpng-dev libturbojpeg0-dev libjpeg62-turbo-dev libcairo2-dev
          pkg-config dataset-fashion-mnist python3-pip ca-certificates openmpi-bin libopenmpi-dev
          iproute2 libcurl4-openssl-dev libssl-dev python3-venv python3-dev libpcre2-dev "$@")
# libboost-context-dev: the fibers of kiln's CUDA emulator, which runs the CUDA
# backend where the CUDA toolkit is installed and no GPU is.
if [ -x /usr/local/cuda/bin/nvcc ] || command -v nvcc > /dev/null 2>&1; then
  packages+=(libboost-context-dev)
fi
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kiln setup: installing ${missing[*]}"
  sudo=""
  [ "$(id -u)" -ne 0 ] && sudo="sudo"
  $sudo apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
bash "$(dirname "$0")/fetch-mkl.sh"

# The project's Python environment, .venv (Debian 12's system Python refuses
# pip, PEP 668): the Python package's build (nanobind) and tests (pytest),
# pinned in python/requirements.txt; remade when that file changes.
cd "$(dirname "$0")/.."
python=/usr/bin/python3
[ -x "$python" ] || python=python3
if ! cmp -s python/requirements.txt .venv/kiln-requirements.txt 2>/dev/null; then
  echo "kiln setup: making the Python environment .venv (python/requirements.txt)"
  rm -rf .venv
  "$python" -m venv .venv
  .venv/bin/pip install -q --disable-pip-version-check -r python/requirements.txt
  cp python/requirements.txt .venv/kiln-requirements.txt
fi
