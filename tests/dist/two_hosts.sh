#!/usr/bin/env bash
# Two hosts on one machine for the data-parallel tests and benchmarks: network
# namespaces joined by a veth pair (host A 10.77.X.1, host B 10.77.X.2, one
# /24 of their own), and an Open MPI that starts ranks in both over TCP.
# Nothing leaves the machine. Needs root (ip netns); exits 77 where network
# namespaces cannot be made or entered (a chroot, as the fresh-machine check).
#
#   two_hosts.sh run TAG CMD...   makes the hosts, runs CMD (a bash line) in
#                                 host A with $MPIRUN_TWO_HOSTS (an mpirun command
#                                 that puts rank 0 on A and rank 1 on B) and
#                                 $HOST_A, $HOST_B, $NS_A, $NS_B set, then removes
#                                 the hosts (always)
#   two_hosts.sh agent HOST CMD   (mpirun's launcher: runs CMD in HOST's namespace)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

if [ "${1:-}" = agent ]; then
  # Open MPI calls its rsh agent as `agent HOST COMMAND...`, COMMAND being a
  # line for a remote shell (as ssh would run it).
  host=$2
  shift 2
  ns=$(cat "${KILN_TWO_HOSTS_MAP:?}" | awk -v h="$host" '$1 == h {print $2}')
  [ -n "$ns" ] || { echo "two_hosts.sh agent: no namespace for host $host" >&2; exit 1; }
  exec ip netns exec "$ns" sh -c "$*"
fi

[ "${1:-}" = run ] || { echo "usage: two_hosts.sh run TAG CMD... (see the script)" >&2; exit 2; }
tag=$2
shift 2
[ "$(id -u)" -eq 0 ] || { echo "two_hosts.sh: needs root (ip netns)" >&2; exit 77; }
command -v ip > /dev/null || { echo "two_hosts.sh: needs ip (iproute2)" >&2; exit 77; }
# One /24 per tag, so that runs of different tags can coexist.
net=$(( $(printf '%s' "$tag" | cksum | cut -d' ' -f1) % 200 + 20 ))
NS_A=kiln-$tag-a NS_B=kiln-$tag-b
HOST_A=10.77.$net.1 HOST_B=10.77.$net.2
map=$(mktemp)
remove_hosts() {
  ip netns del "$NS_A" 2> /dev/null || true
  ip netns del "$NS_B" 2> /dev/null || true
}
trap 'remove_hosts; rm -f "$map" "$map.hosts" "$map.mpirun"' EXIT
remove_hosts  # left over from a run that was killed
# (In a chroot whose root is no mount point `ip netns exec` cannot remount /.)
if ! ip netns add "$NS_A" || ! ip netns exec "$NS_A" true; then
  echo "two_hosts.sh: cannot make or enter a network namespace here" >&2
  exit 77
fi
ip netns add "$NS_B"
ip link add "k$net-a" netns "$NS_A" type veth peer name "k$net-b" netns "$NS_B"
ip -n "$NS_A" addr add "$HOST_A/24" dev "k$net-a"
ip -n "$NS_B" addr add "$HOST_B/24" dev "k$net-b"
for ns in "$NS_A" "$NS_B"; do
  ip -n "$ns" link set lo up
done
ip -n "$NS_A" link set "k$net-a" up
ip -n "$NS_B" link set "k$net-b" up
for _ in $(seq 50); do  # the link takes a moment to carry
  ip -n "$NS_B" -br link show "k$net-b" | grep -q ' UP ' && break
  sleep 0.1
done
printf '%s %s\n%s %s\n' "$HOST_A" "$NS_A" "$HOST_B" "$NS_B" > "$map"
printf '%s slots=1\n%s slots=1\n' "$HOST_A" "$HOST_B" > "$map.hosts"
export KILN_TWO_HOSTS_MAP=$map HOST_A HOST_B NS_A NS_B
# TCP only (no shared memory between the hosts), on the veth link only.
cat > "$map.mpirun" << MPIRUN
#!/bin/sh
exec mpirun --allow-run-as-root --hostfile $map.hosts -np 2 --map-by node --bind-to none \
  --mca plm_rsh_agent '$here/two_hosts.sh agent' --mca btl tcp,self \
  --mca btl_tcp_if_include 10.77.$net.0/24 --mca oob_tcp_if_include 10.77.$net.0/24 \
  -x KILN_TWO_HOSTS_MAP -x OMP_NUM_THREADS=1 "\$@"
MPIRUN
chmod +x "$map.mpirun"
export MPIRUN_TWO_HOSTS=$map.mpirun
ip netns exec "$NS_A" bash -c "$*"
