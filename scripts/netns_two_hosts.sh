#!/usr/bin/env bash
# Two "hosts" on this machine: network namespaces loom-a and loom-b joined by a veth pair
# (10.77.0.1 <-> 10.77.0.2), each process in its own UTS namespace so MPI sees two host
# names, so loom's node-aware code runs over OpenMPI's TCP transport without a second
# machine. Needs root (ip netns, tc).
#
#   scripts/netns_two_hosts.sh up [RATE]     # RATE e.g. 1gbit: shape both directions with tc tbf
#   scripts/netns_two_hosts.sh run NP_PER_HOST -- PROGRAM ARGS...   # mpirun across both hosts
#   scripts/netns_two_hosts.sh exec -- COMMAND ARGS...   # a command that starts mpirun itself, in loom-a
#   scripts/netns_two_hosts.sh down
#
# `run` starts mpirun inside loom-a; OpenMPI reaches loom-b through this script's `agent`
# mode (used as plm_rsh_agent instead of ssh), which enters loom-b's namespaces. Ranks are not
# bound: each "host" is the whole machine to OpenMPI, so binding put the first rank of both
# on core 0 (two ranks sharing one core: config B's step ran 2x slower, measured).
set -euo pipefail
self=$(readlink -f "$0")
ns_of() { case "$1" in 10.77.0.1) echo loom-a ;; 10.77.0.2) echo loom-b ;; *) echo "unknown host $1" >&2; exit 2 ;; esac; }

case "${1:-}" in
  up)
    rate=${2:-}
    "$self" down 2>/dev/null || true
    ip netns add loom-a
    ip netns add loom-b
    ip link add veth-a type veth peer name veth-b
    ip link set veth-a netns loom-a
    ip link set veth-b netns loom-b
    ip -n loom-a addr add 10.77.0.1/24 dev veth-a
    ip -n loom-b addr add 10.77.0.2/24 dev veth-b
    for ns in loom-a loom-b; do
      ip -n "$ns" link set lo up
      ip -n "$ns" link set "veth-${ns#loom-}" up
    done
    if [ -n "$rate" ]; then
      # Token bucket: RATE, 1 MiB burst, at most 50 ms of queue. (No netem here: no delay.)
      for ns in loom-a loom-b; do
        ip netns exec "$ns" tc qdisc add dev "veth-${ns#loom-}" root tbf rate "$rate" burst 1mb latency 50ms
      done
    fi
    echo "two hosts up: loom-a 10.77.0.1, loom-b 10.77.0.2${rate:+, shaped to $rate each way}"
    ;;
  down)
    ip netns del loom-a 2>/dev/null || true
    ip netns del loom-b 2>/dev/null || true
    ;;
  agent)
    # Called by mpirun as: agent [ssh-style options] HOST COMMAND...
    shift
    while [ $# -gt 0 ] && [[ "$1" == -* ]]; do shift; done
    host=$1
    shift
    ns=$(ns_of "$host")
    exec ip netns exec "$ns" unshare --uts /bin/sh -c "hostname $ns && exec /bin/sh -c \"\$0\"" "$*"
    ;;
  run)
    per_host=$2
    shift 2
    [ "${1:-}" = "--" ] && shift
    np=$((2 * per_host))
    exec ip netns exec loom-a unshare --uts /bin/sh -c 'hostname loom-a && exec "$@"' sh \
      mpirun --allow-run-as-root -np "$np" --bind-to none --host "10.77.0.1:$per_host,10.77.0.2:$per_host" \
        --mca plm_rsh_agent "$self agent" --mca plm_rsh_no_tree_spawn 1 \
        --mca oob_tcp_if_include 10.77.0.0/24 --mca btl_tcp_if_include 10.77.0.0/24 \
        --mca btl self,vader,tcp -x OMPI_ALLOW_RUN_AS_ROOT=1 -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 \
        ${ASAN_OPTIONS:+-x ASAN_OPTIONS="$ASAN_OPTIONS"} "$@"
    ;;
  exec)
    # As `run`, but the command starts mpirun itself (`loom train --hosts 10.77.0.1:N,10.77.0.2:N`):
    # it runs inside loom-a with the same MCA settings as environment, which mpirun reads.
    shift
    [ "${1:-}" = "--" ] && shift
    export OMPI_MCA_plm_rsh_agent="$self agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
      OMPI_MCA_oob_tcp_if_include=10.77.0.0/24 OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 \
      OMPI_MCA_btl=self,vader,tcp OMPI_MCA_hwloc_base_binding_policy=none \
      OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    exec ip netns exec loom-a unshare --uts /bin/sh -c 'hostname loom-a && exec "$@"' sh "$@"
    ;;
  *)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
