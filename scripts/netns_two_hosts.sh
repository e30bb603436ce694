#!/usr/bin/env bash
# Two "hosts" on this machine: scripts/netns_hosts.sh with HOSTS=2 (loom-a 10.77.0.1 and
# loom-b 10.77.0.2); the same modes (up [RATE], run, exec, kill, down).
HOSTS=2 exec "$(dirname "$(readlink -f "$0")")/netns_hosts.sh" "$@"
