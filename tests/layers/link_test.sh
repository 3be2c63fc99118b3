#!/usr/bin/env bash
# The layer rule, enforced by the linker (CMakeLists.txt): each layer's
# library links only the libraries below it, with --no-undefined, so that a
# call from a lower layer into a higher one fails to link.
#   link_test.sh upward BUILD_DIR CXX SOURCE_DIR   a deliberate upward call: a
#       file as the nn layer's library would hold it, calling train::validate
#       (kiln-train, above it), linked as kiln-nn is, fails to link and the
#       linker names the symbol; the same file calling only the ops below links.
#   link_test.sh needed BUILD_DIR   each library needs (DT_NEEDED) no kiln
#       library above it, and libcurl, OpenSSL, libpng, libjpeg, zlib and
#       PCRE2 are needed by kiln-io alone.
set -euo pipefail
what=$1
build=$(cd "$2" && pwd)
case "$what" in
  upward)
    cxx=$3 src=$4
    work=$(mktemp -d)
    trap 'rm -rf "$work"' EXIT
    # Built as the layers' libraries are: position-independent, shared, and
    # --no-undefined against the libraries below (for nn: kiln-engine).
    link() {  # source, output
      "$cxx" -std=c++20 -fPIC -fopenmp -I"$src/include" -c "$1" -o "$work/unit.o" &&
        "$cxx" -shared -fopenmp -Wl,--no-undefined "$work/unit.o" -o "$2" -L"$build" -lkiln-engine
    }
    cat > "$work/downward.cpp" <<'CPP'
// As src/nn/ might hold it: only the ops, below nn.
#include "kiln/ops.h"
namespace kiln::nn {
Array twice(const Array& x) { return add(x, x); }
}  // namespace kiln::nn
CPP
    cat > "$work/upward.cpp" <<'CPP'
// As src/nn/ must never hold it: a call into the train layer, above nn.
#include "kiln/ops.h"
#include "kiln/train.h"
namespace kiln::nn {
Array checked_twice(const Array& x, const train::TrainConfig& config) {
  train::validate(config);
  return add(x, x);
}
}  // namespace kiln::nn
CPP
    if ! link "$work/downward.cpp" "$work/libdownward.so" 2> "$work/downward.err"; then
      echo "link_test: a call into the layers below does not link:" >&2
      cat "$work/downward.err" >&2
      exit 1
    fi
    if link "$work/upward.cpp" "$work/libupward.so" 2> "$work/upward.err"; then
      echo "link_test: a call from nn into train linked: the layers' libraries do not enforce the rule" >&2
      exit 1
    fi
    if ! grep -q 'undefined reference to .*kiln::train::validate' "$work/upward.err"; then
      echo "link_test: the upward call failed, but not for its undefined symbol:" >&2
      cat "$work/upward.err" >&2
      exit 1
    fi
    echo "link_test: nn -> ops links; nn -> train does not ($(grep -m1 -o 'undefined reference to .*kiln::train::validate[^)]*)' "$work/upward.err"))"
    ;;
  needed)
    layers=(engine nn io train)
    status=0
    for i in "${!layers[@]}"; do
      lib=$build/libkiln-${layers[$i]}.so
      needed=$(readelf -d "$lib" | sed -n 's/.*Shared library: \[\(.*\)\]/\1/p')
      for j in "${!layers[@]}"; do
        if ((j >= i)) && grep -qx "libkiln-${layers[$j]}.so" <<< "$needed" && ((j != i)); then
          echo "link_test: libkiln-${layers[$i]}.so needs libkiln-${layers[$j]}.so, a layer above it" >&2
          status=1
        fi
      done
      external=$(grep -E '^lib(curl|ssl|crypto|png[0-9]*|jpeg|turbojpeg|z|pcre2-8)\.so' <<< "$needed" | tr '\n' ' ' || true)
      if [ "${layers[$i]}" = io ]; then
        for want in libcurl libcrypto libpng libturbojpeg libz libpcre2-8; do
          grep -qE "^$want[0-9]*\.so" <<< "$needed" || { echo "link_test: libkiln-io.so does not need $want" >&2; status=1; }
        done
      elif [ -n "$external" ]; then
        echo "link_test: libkiln-${layers[$i]}.so needs $external(only kiln-io may)" >&2
        status=1
      fi
      echo "link_test: libkiln-${layers[$i]}.so needs: $(grep '^libkiln' <<< "$needed" | tr '\n' ' ')${external:+and $external}"
    done
    exit $status
    ;;
  *)
    echo "link_test.sh: unknown check '$what' (upward or needed)" >&2
    exit 2
    ;;
esac
