#!/usr/bin/env bash
# Registers, spills and static shared memory of every kernel of the CUDA
# backend as ptxas builds it for sm_90a (no GPU needed), one line per kernel:
#
#   FILE KERNEL REGISTERS "N bytes spill stores" "M bytes smem"
#
# sorted, with the per-file anonymous-namespace hash in the mangled names
# replaced by ANON, so that two trees' reports compare with diff:
#
#   bash bench/gpu/ptxas_report.sh [TREE] > report.txt     (TREE: default .)
set -euo pipefail
tree=${1:-.}
nvcc=${NVCC:-/usr/local/cuda/bin/nvcc}
cd "$tree"
for cu in src/backend/cuda/*.cu; do
  "$nvcc" -c -std=c++20 -gencode=arch=compute_90a,code=sm_90a --expt-relaxed-constexpr -Iinclude \
    -Isrc -Xptxas -v -o /dev/null "$cu" 2>&1 | awk -v f="$(basename "$cu")" '
    /Compiling entry function/ { match($0, /'"'"'[^'"'"']*'"'"'/); k = substr($0, RSTART + 1, RLENGTH - 2) }
    /bytes spill stores/ { match($0, /[0-9]+ bytes spill stores/); sp = substr($0, RSTART, RLENGTH) }
    /Used [0-9]+ registers/ {
      match($0, /Used [0-9]+ registers/); r = substr($0, RSTART + 5, RLENGTH - 15)
      sm = ""; if (match($0, /[0-9]+ bytes smem/)) sm = substr($0, RSTART, RLENGTH)
      print f, k, r, sp, sm
    }'
done | sed -E 's/_GLOBAL__N__[0-9a-f]+_[0-9]+_[a-z_]+_cu_[0-9a-f]+/ANON/g' | sort
