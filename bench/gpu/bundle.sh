#!/usr/bin/env bash
# Builds the kiln that bench/gpu/check.sh runs on a GPU machine, into
# build-gpu/: the CUDA backend (sm_90a + PTX), kernels for any x86-64 CPU
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
#   bash bench/gpu/bundle.sh        then run with carry ["build-gpu/bundle.tar.xz"]
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DKILN_ARCH=x86-64-v3 -DKILN_MKL=OFF \
  -DKILN_CUDA=ON -DKILN_MPI=OFF -DKILN_BUILD_BENCH=OFF | grep '^-- kiln:' || true
ninja -C build-gpu -j"${KILN_JOBS:-2}" kiln-cli kiln-tests
# Only what the check runs travels (the object files stay here, ignored by
# the carry through .gitignore rules of their own folder).
dest=build-gpu/bundle
rm -rf "$dest" && mkdir -p "$dest/lib"
cp build-gpu/kiln build-gpu/kiln-tests build-gpu/libkiln.so "$dest/"
# The tests find fixtures and the kiln command by this build's paths.
echo "$PWD" > "$dest/source_dir"
strip --strip-unneeded "$dest/kiln" "$dest/kiln-tests" "$dest/libkiln.so"
# Libraries every Linux with a C++ runtime has, and the driver's: not copied.
system='^(linux-vdso|libc\.|libm\.|libdl\.|librt\.|libpthread\.|ld-linux|libstdc\+\+|libgcc_s|libcuda\.|libkiln\.)'
for bin in "$dest/kiln" "$dest/kiln-tests" "$dest/libkiln.so"; do
  ldd "$bin" | awk '/=> \// {print $1, $3}' | while read -r name path; do
    [[ "$name" =~ $system ]] && continue
    [ -e "$dest/lib/$name" ] || cp -L "$path" "$dest/lib/$name"
  done
done
strip --strip-unneeded "$dest"/lib/*.so* 2>/dev/null || true
tar -C build-gpu -cJf build-gpu/bundle.tar.xz.tmp bundle && mv build-gpu/bundle.tar.xz.tmp build-gpu/bundle.tar.xz
size=$(du -m build-gpu/bundle.tar.xz | cut -f1)
tree=$(git ls-files -z | xargs -0 du -cm 2>/dev/null | tail -1 | cut -f1)
echo "bench/gpu/bundle.sh: build-gpu/bundle.tar.xz is ${size} MiB ($(du -sm "$dest" | cut -f1) MiB unpacked; the working tree ${tree} MiB; the device tool carries 64 MiB in all)"
ls -la "$dest" "$dest/lib"
if [ $((size + tree)) -gt 60 ]; then
  echo "bench/gpu/bundle.sh: too big to carry" >&2
  exit 1
fi
