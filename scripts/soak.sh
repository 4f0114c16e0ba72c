#!/usr/bin/env bash
# The soak (tests/soak): several engine instances on one redis-server (or a Redis Cluster with
# replicas, or a primary with replicas under Redis Sentinel) under continuous load, a writer
# and a seeded fault injector; checks every answer, the origin's loads, the resources held and
# the recovery after the faults, and exits non-zero with the seed and the time line around
# each violation. See docs/soak.md.
#
# Usage: ./scripts/soak.sh [--secs S] [--seed N] [--cluster | --sentinel] [--instances N]
#                          [--keys N] [--rate R] [--writes W] [--fault-gap S] [--release]
#                          [--path-faults]
#   --secs S        how long it runs (default 60; the last fifth, at least 15 s, has no faults)
#   --seed N        the seed of the workload and the faults (default: from the clock; printed)
#   --cluster       a Redis Cluster of three masters with a replica each (feature `cluster`)
#   --sentinel      a primary and two replicas under three sentinels (feature `sentinel`)
#   --instances N   Cache instances, each with a RedisStore of its own (default 3)
#   --keys N        keys; the first tenth are hot, asked four times in five (default 200)
#   --rate R        requests per second per instance (default 200)
#   --writes W      changes per second: set, invalidate, invalidate_tag (default 5)
#   --fault-gap S   mean seconds between faults, 0 for none (default 4)
#   --release       build in release (for long runs)
#   --path-faults   each instance through fault proxies of its own, one per node and sentinel,
#                   and faults on those paths too: partitions, a slow link, a silent
#                   subscriber, stalled replies
# Needs redis-server (./scripts/test.sh installs it); TOWER_STAMPEDE_SERVER names another server
# binary, e.g. Valkey's valkey-server (./scripts/test.sh puts Valkey 9 under ~/.cache).
set -euo pipefail
cd "$(dirname "$0")/.."

profile=()
features=()
while [ $# -gt 0 ]; do
  case "$1" in
    --secs) export SOAK_SECS="$2"; shift 2 ;;
    --seed) export SOAK_SEED="$2"; shift 2 ;;
    --cluster) export SOAK_CLUSTER=1; features=(--features cluster); shift ;;
    --instances) export SOAK_INSTANCES="$2"; shift 2 ;;
    --keys) export SOAK_KEYS="$2"; shift 2 ;;
    --rate) export SOAK_RATE="$2"; shift 2 ;;
    --writes) export SOAK_WRITES="$2"; shift 2 ;;
    --fault-gap) export SOAK_FAULT_GAP="$2"; shift 2 ;;
    --release) profile=(--release); shift ;;
    --path-faults) export SOAK_PATH_FAULTS=1; shift ;;
    --sentinel) export SOAK_SENTINEL=1; features=(--features sentinel); shift ;;
    -h|--help) sed -n '2,24p' "$0"; exit 0 ;;
    *) echo "unknown argument: $1 (see --help)" >&2; exit 2 ;;
  esac
done

if [ "${SOAK_CLUSTER:-}" = 1 ] && [ "${SOAK_SENTINEL:-}" = 1 ]; then
  echo "--cluster and --sentinel are exclusive" >&2
  exit 2
fi

exec cargo test "${profile[@]}" "${features[@]}" --test soak -- --ignored --nocapture
