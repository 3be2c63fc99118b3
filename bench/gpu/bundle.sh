#!/usr/bin/env bash
# Builds the kiln that bench/gpu/check.sh runs on a GPU machine, into
# build-gpu/: the CUDA backend (sm_90a + PTX; never the emulator, though this
# machine has no GPU), kernels for any x86-64 CPU
# with AVX2 (x86-64-v3, not -march=native: the binary is carried to another
# machine), oneDNN's sgemm (no oneMKL: too big to carry), no MPI (the GPU
# machine runs one rank; NCCL needs no MPI for it), the tests, and in
# build-gpu/lib every shared library it needs that a bare GPU machine may lack
# (oneDNN, image and plotting libraries; not glibc, not the CUDA driver, and
# not cuBLASLt or NVRTC, which kiln loads from the machine's CUDA at run time).
# The device tool carries the working tree plus what it is told to (64 MiB in
# all): the bundle travels packed, as build-gpu/bundle.tar.xz, which
# check.sh unpacks; the script fails when that is larger than the room left.
#
# The reference experiment's script (../shared/reference/, kept outside the
# repository) travels in the bundle where it is there, for check.sh's last step.
#
#   bash bench/gpu/bundle.sh        then run with carry ["build-gpu/bundle.tar.xz"]
#
# KILN_BUNDLE_FROM=build KILN_BUNDLE_OUT=DIR packs an existing build instead,
# without its shared libraries and barely compressed: a bundle for rehearsing
# the check on this machine (bench/gpu/rehearse.sh), never for carrying.
set -euo pipefail
cd "$(dirname "$0")/../.."
from=${KILN_BUNDLE_FROM:-}
outdir=${KILN_BUNDLE_OUT:-build-gpu}
if [ -z "$from" ]; then
  bash scripts/setup.sh
  cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_ARCH=x86-64-v3 -DKILN_MKL=OFF \
    -DKILN_CUDA=ON -DKILN_CUDA_EMULATION=OFF -DKILN_MPI=OFF -DKILN_BUILD_BENCH=OFF | grep '^-- kiln:' || true
  ninja -C build-gpu -j"${KILN_JOBS:-2}" kiln-cli kiln-tests
  from=build-gpu
fi
# kiln's layers, one library each (CMakeLists.txt); build/libkiln.so is a linker script.
libs=(libkiln-engine.so libkiln-nn.so libkiln-io.so libkiln-train.so)
for f in kiln kiln-tests "${libs[@]}"; do
  [ -f "$from/$f" ] || { echo "bench/gpu/bundle.sh: no $from/$f (build it first)" >&2; exit 1; }
done
# Only what the check runs travels (the object files stay here, ignored by
# the carry through .gitignore rules of their own folder).
mkdir -p "$outdir"
dest=$outdir/bundle
rm -rf "$dest" && mkdir -p "$dest/lib"
cp "$from/kiln" "$from/kiln-tests" "${libs[@]/#/$from/}" "$dest/"
# The tests find fixtures and the kiln command by this build's paths.
echo "$PWD" > "$dest/source_dir"
echo "$(git log -1 --format='%h %s' | cut -c1-72)$(git diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')" \
  > "$dest/source_commit"
if [ -f ../shared/reference/reference_train.py ]; then
  mkdir -p "$dest/reference" && cp ../shared/reference/reference_train.py "$dest/reference/"
fi
strip --strip-unneeded "$dest/kiln" "$dest/kiln-tests" "${libs[@]/#/$dest/}"
if [ -n "${KILN_BUNDLE_FROM:-}" ]; then
  tar -C "$outdir" -cf - bundle | xz -0 -T2 > "$outdir/bundle.tar.xz.tmp" && mv "$outdir/bundle.tar.xz.tmp" "$outdir/bundle.tar.xz"
  echo "bench/gpu/bundle.sh: $outdir/bundle.tar.xz from $from ($(du -m "$outdir/bundle.tar.xz" | cut -f1) MiB; for rehearsals here only)"
  exit 0
fi
# Libraries every Linux with a C++ runtime has, and the driver's: not copied.
system='^(linux-vdso|libc\.|libm\.|libdl\.|librt\.|libpthread\.|ld-linux|libstdc\+\+|libgcc_s|libcuda\.|libkiln[.-])'
for bin in "$dest/kiln" "$dest/kiln-tests" "${libs[@]/#/$dest/}"; do
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $system ]] && continue
    [ -e "$dest/lib/$name" ] || cp -L "$path" "$dest/lib/$name"
  done
done
strip --strip-unneeded "$dest"/lib/*.so* 2>/dev/null || true
# The newest glibc symbol version anything in the bundle needs (check.sh
# prints it beside the machine's).
objdump -T "$dest"/kiln "$dest"/kiln-tests "$dest"/*.so "$dest"/lib/*.so* 2>/dev/null | grep -o 'GLIBC_[0-9.]*' |
  sort -t. -k2,2n -k3,3n -u | tail -1 > "$dest/glibc_needed"
tar -C build-gpu -cJf build-gpu/bundle.tar.xz.tmp bundle && mv build-gpu/bundle.tar.xz.tmp build-gpu/bundle.tar.xz
size=$(du -m build-gpu/bundle.tar.xz | cut -f1)
tree=$(git ls-files -z | du -cm --files0-from=- 2>/dev/null | tail -1 | cut -f1)
echo "bench/gpu/bundle.sh: build-gpu/bundle.tar.xz is ${size} MiB ($(du -sm "$dest" | cut -f1) MiB unpacked; the working tree ${tree} MiB; the device tool carries 64 MiB in all)"
ls -la "$dest" "$dest/lib"
if [ $((size + tree)) -gt 60 ]; then
  echo "bench/gpu/bundle.sh: too big to carry" >&2
  exit 1
fi
