#!/usr/bin/env bash
# ctest entry: two namespaces joined by a veth pair, 2 ranks per "host", over OpenMPI TCP.
# Exits 77 (ctest SKIP) when this machine cannot make network namespaces.
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
probe=$1
if ! ip netns add loom-probe 2>/dev/null; then
  echo "SKIP: cannot create network namespaces here (needs root with CAP_SYS_ADMIN/NET_ADMIN)"
  exit 77
fi
ip netns del loom-probe
trap '"$root/scripts/netns_two_hosts.sh" down' EXIT
"$root/scripts/netns_two_hosts.sh" up || exit 1
timeout 120 "$root/scripts/netns_two_hosts.sh" run 2 -- "$probe"
