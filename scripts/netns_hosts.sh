#!/usr/bin/env bash
# N "hosts" on this machine (HOSTS=N for `up`, 2 to 8, default 2): network namespaces loom-a,
# loom-b, ... at 10.77.0.1, 10.77.0.2, ... joined by one bridge (loom-br) in this namespace,
# each process in its own UTS namespace so MPI sees N host names, so loom's node-aware code
# and its supervision across hosts run over OpenMPI's TCP transport without more machines.
# Needs root (ip netns, tc).
#
#   HOSTS=4 scripts/netns_hosts.sh up [RATE]   # RATE e.g. 1gbit: each host's egress shaped with tc tbf
#   scripts/netns_hosts.sh run NP_PER_HOST -- PROGRAM ARGS...   # mpirun across every host that is up
#   scripts/netns_hosts.sh exec -- COMMAND ARGS...   # a command that starts mpirun itself, in loom-a
#   scripts/netns_hosts.sh kill HOST [SIGNAL]   # SIGNAL (default KILL) to every process of host
#                                               # loom-X (or its address): the host lost
#   scripts/netns_hosts.sh down
#
# `run` starts mpirun inside loom-a; OpenMPI reaches the others through this script's `agent`
# mode (used as plm_rsh_agent instead of ssh), which enters their namespaces. Ranks are not
# bound: each "host" is the whole machine to OpenMPI, so binding put the first rank of both
# on core 0 (two ranks sharing one core: config B's step ran 2x slower, measured).
set -euo pipefail
self=$(readlink -f "$0")
letters=(a b c d e f g h)
ns_of() {  # 10.77.0.K -> loom-<K-th letter>
  case "$1" in
    10.77.0.[1-8]) echo "loom-${letters[${1##*.} - 1]}" ;;
    loom-[a-h]) echo "$1" ;;
    *) echo "unknown host $1" >&2; exit 2 ;;
  esac
}
up_hosts() { ip netns list | grep -o '^loom-[a-h]\b' | sort; }

# The MCA settings mpirun needs to reach the other namespaces (as environment: mpirun reads it).
mca_env() {
  export OMPI_MCA_plm_rsh_agent="$self agent" OMPI_MCA_plm_rsh_no_tree_spawn=1 \
    OMPI_MCA_oob_tcp_if_include=10.77.0.0/24 OMPI_MCA_btl_tcp_if_include=10.77.0.0/24 \
    OMPI_MCA_btl=self,vader,tcp OMPI_MCA_hwloc_base_binding_policy=none \
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
}

case "${1:-}" in
  up)
    rate=${2:-}
    n=${HOSTS:-2}
    [[ "$n" =~ ^[2-8]$ ]] || { echo "HOSTS=$n: expected 2 to 8" >&2; exit 2; }
    "$self" down 2>/dev/null || true
    ip link add loom-br type bridge
    ip link set loom-br up
    for ((i = 1; i <= n; i++)); do
      x=${letters[i - 1]}
      ip netns add "loom-$x"
      ip link add "veth-$x" type veth peer name "br-$x"
      ip link set "veth-$x" netns "loom-$x"
      ip link set "br-$x" master loom-br
      ip link set "br-$x" up
      ip -n "loom-$x" addr add "10.77.0.$i/24" dev "veth-$x"
      ip -n "loom-$x" link set lo up
      ip -n "loom-$x" link set "veth-$x" up
      if [ -n "$rate" ]; then  # token bucket: RATE, 1 MiB burst, at most 50 ms of queue (no delay)
        ip netns exec "loom-$x" tc qdisc add dev "veth-$x" root tbf rate "$rate" burst 1mb latency 50ms
      fi
    done
    echo "$n hosts up: $(for ((i = 1; i <= n; i++)); do printf 'loom-%s 10.77.0.%d ' "${letters[i - 1]}" "$i"; done)${rate:+shaped to $rate each way}"
    ;;
  down)
    # A process left in a namespace (a stopped rank) would keep it, and its veth, alive.
    for ns in $(up_hosts); do
      pids=$(ip netns pids "$ns" 2>/dev/null || true)
      if [ -n "$pids" ]; then kill -CONT $pids 2>/dev/null || true; kill -KILL $pids 2>/dev/null || true; fi
      ip netns del "$ns" 2>/dev/null || true
    done
    for x in "${letters[@]}"; do ip link del "br-$x" 2>/dev/null || true; done
    ip link del loom-br 2>/dev/null || true
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
    hosts=""
    for ns in $(up_hosts); do
      for ((i = 0; i < 8; i++)); do [ "loom-${letters[i]}" = "$ns" ] && hosts+="${hosts:+,}10.77.0.$((i + 1)):$per_host"; done
    done
    np=$(($(up_hosts | wc -l) * per_host))
    mca_env
    exec ip netns exec loom-a unshare --uts /bin/sh -c 'hostname loom-a && exec "$@"' sh \
      mpirun -np "$np" --host "$hosts" -x OMPI_ALLOW_RUN_AS_ROOT -x OMPI_ALLOW_RUN_AS_ROOT_CONFIRM ${ASAN_OPTIONS:+-x ASAN_OPTIONS="$ASAN_OPTIONS"} "$@"
    ;;
  exec)
    # As `run`, but the command starts mpirun itself (`loom train --hosts 10.77.0.1:N,...`).
    shift
    [ "${1:-}" = "--" ] && shift
    mca_env
    exec ip netns exec loom-a unshare --uts /bin/sh -c 'hostname loom-a && exec "$@"' sh "$@"
    ;;
  kill)
    ns=$(ns_of "$2")
    pids=$(ip netns pids "$ns")
    [ -n "$pids" ] && kill "-${3:-KILL}" $pids
    echo "$ns: signalled $(echo $pids | wc -w) processes with SIG${3:-KILL}"
    ;;
  *)
    sed -n '2,14p' "$0"
    exit 2
    ;;
esac
