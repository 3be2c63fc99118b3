#!/usr/bin/env bash
# Fetches Intel oneMKL's shared libraries and headers (pinned, hash-checked
# wheels from PyPI; no Python package is installed) into .deps/mkl, where
# CMake finds them: kiln's f32 GEMMs then run on oneMKL's sgemm
# (src/backend/cpu/sgemm.h). Without them kiln builds on oneDNN's sgemm alone,
# so a failure here is a warning, not an error. Called by scripts/setup.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
version=2026.2.0
dest=.deps/mkl
if [ "$(cat "$dest/VERSION" 2>/dev/null)" = "$version" ]; then exit 0; fi
if [ "$(uname -m)" != x86_64 ]; then
  echo "kiln setup: oneMKL is for x86_64 only; f32 GEMMs will run on oneDNN's sgemm"
  exit 0
fi
python=""
for p in python3 python; do command -v "$p" >/dev/null && "$p" -m pip --version >/dev/null 2>&1 && python=$p && break; done
if [ -z "$python" ]; then
  echo "kiln setup: warning: no python3 with pip to fetch oneMKL; f32 GEMMs will run on oneDNN's sgemm"
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cat > "$tmp/requirements.txt" <<REQ
mkl==$version --hash=sha256:eaab1875ce9f47ab3c66d5632cef06baf768c05781f2f28847bdbc4343500ed7
mkl-include==$version --hash=sha256:889cc72057a1671fee1e9a8beb2fc4e0d222ba78c08b6d69584dae03fbec4822
REQ
echo "kiln setup: fetching oneMKL $version (PyPI wheels, ~220 MB) into $dest"
if ! "$python" -m pip download -q --timeout 30 --retries 2 --no-deps --only-binary=:all: --require-hashes \
     -r "$tmp/requirements.txt" -d "$tmp/wheels"; then
  echo "kiln setup: warning: could not download oneMKL; f32 GEMMs will run on oneDNN's sgemm"
  exit 0
fi
rm -rf "$dest" "$dest.partial"
mkdir -p "$dest.partial"
"$python" - "$tmp/wheels" "$dest.partial" <<'PY'
import pathlib, sys, zipfile
wheels, dest = pathlib.Path(sys.argv[1]), pathlib.Path(sys.argv[2])
# The BLAS interface, GNU OpenMP threading, the core and the per-CPU kernels
# the core loads at run time.
libs = {f"libmkl_{n}.so.3" for n in
        ("intel_lp64", "gnu_thread", "core", "def", "mc3", "avx2", "avx512", "avx10")}
found = set()
for wheel in wheels.glob("*.whl"):
    with zipfile.ZipFile(wheel) as z:
        for info in z.infolist():
            path = pathlib.PurePosixPath(info.filename)
            parts = path.parts
            if len(parts) < 3 or parts[1] != "data":
                continue
            if parts[2] == "lib" and len(parts) == 4 and path.name in libs:
                out = dest / "lib" / path.name
            elif parts[2] == "include" and len(parts) == 4 and path.suffix == ".h":
                out = dest / "include" / path.name
            else:
                continue
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(info))
            out.chmod(0o755 if parts[2] == "lib" else 0o644)
            found.add(path.name)
missing = sorted(libs - found) + [h for h in ("mkl_cblas.h", "mkl_service.h") if h not in found]
if missing:
    sys.exit("kiln setup: the oneMKL wheels lack " + ", ".join(missing))
PY
echo "$version" > "$dest.partial/VERSION"
mv "$dest.partial" "$dest"
