#!/usr/bin/env bash
# The fresh-machine check: runs the README's two commands, as a new user would,
# in a clean Debian 12 root made with debootstrap, on a clean clone of the
# committed HEAD (uncommitted changes are not part of it).
#
#   bash scripts/fresh-check.sh        # as root; .ci/run runs it
#
# The root starts from a minimal Debian 12 (debootstrap --variant=minbase: no
# compiler, no kiln dependency), cached as a tarball outside the clone
# (KILN_FRESH_CACHE, default /var/cache/kiln-fresh) so that later runs skip the
# bootstrap; everything kiln needs must then come from its own scripts. The
# main command is shortened through its documented flags (vit-tiny, 3 steps).
# This machine's compiler cache (ccache) is lent to the root, as CI caches
# compiles between runs (KILN_FRESH_CCACHE=0: not): the root's ccache, which
# its own scripts install, compiles every object whose sources, headers,
# compiler and flags it has not seen, and checks each cached one against the
# root's own headers, so a header that the scripts fail to install still
# fails the build; nothing is linked or tested from it.
# The full log goes to KILN_FRESH_LOG (default /tmp/kiln-fresh-check.log).
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD
cache=${KILN_FRESH_CACHE:-/var/cache/kiln-fresh}
log=${KILN_FRESH_LOG:-/tmp/kiln-fresh-check.log}
mirror=${KILN_FRESH_MIRROR:-http://deb.debian.org/debian}
suite=bookworm
base="$cache/$suite-minbase.tar.gz"

if [ "$(id -u)" -ne 0 ]; then
  echo "fresh-check: needs root (debootstrap, chroot and mounts)" >&2
  exit 2
fi
commit=$(git rev-parse HEAD)
start=$(date +%s)
elapsed() { echo $(($(date +%s) - start)); }
: >"$log"

if [ ! -f "$base" ]; then
  command -v debootstrap >/dev/null || {
    apt-get update -qq >>"$log" 2>&1
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq debootstrap >>"$log" 2>&1
  }
  echo "fresh-check: bootstrapping a minimal Debian 12 root (once; cached in $base)"
  boot=$(mktemp -d /var/tmp/kiln-debootstrap.XXXXXX)
  if ! debootstrap --variant=minbase "$suite" "$boot" "$mirror" >>"$log" 2>&1; then
    rm -rf "$boot"
    echo "fresh-check: debootstrap failed; the last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  mkdir -p "$cache"
  tar -C "$boot" -czf "$base.partial" . && mv "$base.partial" "$base"
  rm -rf "$boot"
fi

root=$(mktemp -d /var/tmp/kiln-fresh.XXXXXX)
trap 'rm -rf "$root"' EXIT
tar -C "$root" -xzf "$base"
# The machine's network, as a new machine on it would have it: its resolver,
# and the CA bundle its HTTPS traffic is checked against where the environment
# names one (PIP_CERT, as here, where an intercepting proxy signs PyPI's pages).
cp /etc/resolv.conf "$root/etc/resolv.conf"
root_env=()
if [ -n "${PIP_CERT:-}" ] && [ -f "$PIP_CERT" ]; then
  cp "$PIP_CERT" "$root/etc/kiln-fresh-network-ca.crt"
  root_env=(PIP_CERT=/etc/kiln-fresh-network-ca.crt)
fi
# This machine's locale, which ccache hashes (the compiler's messages
# follow it): the root's compiles find this machine's cached ones.
for v in LANG LC_ALL LC_CTYPE LC_MESSAGES; do
  if [ -n "${!v:-}" ]; then root_env+=("$v=${!v}"); fi
done
ccache_dir=""
if [ "${KILN_FRESH_CCACHE:-1}" != 0 ] && command -v ccache >/dev/null; then
  ccache_dir=$(ccache -k cache_dir 2>/dev/null || true)
  [ -d "$ccache_dir" ] || ccache_dir=""
fi
mkdir -p "$root/root/.cache/ccache"
git clone -q --no-hardlinks "$repo" "$root/root/kiln"
git -C "$root/root/kiln" checkout -q "$commit"
echo "fresh-check: commit $commit in a clean Debian 12 root ($(elapsed) s; ccache: ${ccache_dir:-none lent})"

# The two commands, exactly as the README gives them (the main one shortened
# through its flags), in a private mount namespace so that the mounts end with it.
cat >"$root/root/fresh-run.sh" <<'RUN'
set -euo pipefail
export HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin
cd /root/kiln
t0=$(date +%s)
bash scripts/test.sh
echo "fresh-check: test command done in $(($(date +%s) - t0)) s"
t0=$(date +%s)
bash scripts/run.sh --model vit-tiny --steps 3
echo "fresh-check: main command done in $(($(date +%s) - t0)) s"
RUN
status=0
unshare --mount --propagation private /bin/bash -c '
  set -e
  root=$1
  mount -t proc proc "$root/proc"
  mount -t sysfs sys "$root/sys"
  mount --bind /dev "$root/dev"
  mount --bind /dev/pts "$root/dev/pts"
  [ -n "$2" ] && mount --bind "$2" "$root/root/.cache/ccache"
  shift 2
  exec env -i "$@" /usr/sbin/chroot "$root" /bin/bash /root/fresh-run.sh' _ "$root" "$ccache_dir" "${root_env[@]}" </dev/null >>"$log" 2>&1 || status=$?

grep -E '^fresh-check:|tests passed|tests failed|^average step time' "$log" || true
if [ "$status" -ne 0 ]; then
  echo "fresh-check: FAILED (exit $status) after $(elapsed) s; the last lines of $log:" >&2
  tail -n 60 "$log" >&2
  exit 1
fi
echo "fresh-check: passed in $(elapsed) s (the README's two commands on a clean Debian 12 root)"
