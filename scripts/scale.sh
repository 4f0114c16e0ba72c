#!/usr/bin/env bash
# The scale bench (benches/scale.rs): P engine processes on one redis-server (or a Redis
# Cluster), K cold keys, C callers per key and process; prints a table of origin loads, Redis
# commands, pub/sub messages, latency and memory per cell. See benches/README.md ("Cost as the
# fleet grows").
#
# Usage: ./scripts/scale.sh [PART] [-- BENCH ARGS]
#   PART   small    P 1,4,16,32 with K 1,100 (the default)
#          large    P 1,4,16,32 with K 10000 (C 1)
#          all      both, one after the other
#          cluster  P 1,4,16,32 with K 1,100 (C 10) on a Redis Cluster of 3 masters (feature
#                   cluster): sharded pub/sub, then classic, each run under ten minutes
#   BENCH ARGS go to the bench as they are: --p 1,4 --k 100 --c 10 --origin-ms 100 --value 100
# Each run takes under ten minutes on two cores. Needs redis-server (./scripts/test.sh
# installs it).
set -euo pipefail
cd "$(dirname "$0")/.."

part="${1:-small}"
[ $# -gt 0 ] && shift
[ "${1:-}" = "--" ] && shift
export SCALE_COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
features=redis
[ "$part" = cluster ] && features=cluster
cargo bench --features "$features" --bench scale --no-run
run() { cargo bench --features "$features" --bench scale -- "$@"; }
case "$part" in
  small) run --p 1,4,16,32 --k 1,100 --c 10 "$@" ;;
  large) run --p 1,4,16,32 --k 10000 --c 1 "$@" ;;
  all) run --p 1,4,16,32 --k 1,100 --c 10 "$@"; run --p 1,4,16,32 --k 10000 --c 1 "$@" ;;
  cluster)
    run --p 1,4,16,32 --k 1,100 --c 10 --cluster "$@"
    run --p 1,4,16,32 --k 1,100 --c 10 --cluster --classic "$@" ;;
  *) echo "unknown part: $part (small, large, all, cluster)" >&2; exit 2 ;;
esac
