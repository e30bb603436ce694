#!/usr/bin/env bash
# Hierarchical vs flat ring all-reduce across two namespace "hosts" joined by a veth pair
# shaped to RATE (default 1gbit) with tc tbf, 2 ranks per host. The link-traffic bound is
# 1.5x: a flat ring of 4 puts 1.5 x the buffer on the link each way, hierarchical 1 x.
# usage: bench/comm_two_hosts.sh [RATE] [SIZE]   (root; e.g. bench/comm_two_hosts.sh 1gbit 64M)
set -euo pipefail
cd "$(dirname "$0")/.."
rate=${1:-1gbit} size=${2:-64M}
trap 'scripts/netns_two_hosts.sh down' EXIT
scripts/netns_two_hosts.sh up "$rate"
out=$(scripts/netns_two_hosts.sh run 2 -- build/release/loom bench comm --algorithm hierarchical,ring \
      --sizes "$size" --iters 3 --json)
echo "$out"
echo "$out" | awk -F'"time_us":' '/"algorithm":"hierarchical"/ {split($2, a, ","); h = a[1]}
                                   /"algorithm":"ring"/ {split($2, a, ","); r = a[1]}
                                   END {printf "hierarchical %.1f ms, ring %.1f ms: hierarchical = %.2fx ring (target >= 1.3x, bound 1.5x)\n", h / 1e3, r / 1e3, r / h}'
