#!/usr/bin/env bash
# Installs what kiln needs to build and test on Debian 12 (root, or sudo).
set -euo pipefail
packages=(g++ cmake ninja-build libdnnl-dev libgtest-dev libbenchmark-dev libcli11-dev nlohmann-json3-dev
          zlib1g-dev libpng-dev libturbojpeg0-dev libcairo2-dev pkg-config dataset-fashion-mnist)
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
