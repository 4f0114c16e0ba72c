#!/usr/bin/env bash
# L1 hits of the `proxy` example against bare hyper (`examples/bare.rs`), over the wire, in turns.
#
# Builds both examples in release, starts `bare --origin` (the origin of the proxy), `bare`
# (the yardstick: the same page with the proxy's `x-cache` and `Cache-Status`) and the proxy
# in front of the origin (the embedded memory store; with --redis, a redis-server of its
# own on a free port), warms the page until the proxy answers `x-cache: HIT`, then runs
# `wrk -t2 -c64 -d<S>s --latency` against the proxy and against bare in turns, ROUNDS times
# (the order swaps every round, so neither always runs on a machine warmed by the other).
# Prints req/s and p99 of each, and their ratios, per round; then the medians. Also the CPU time
# each server spent per request (user + system, from /proc/PID/stat over its wrk run, in µs)
# and bare's over the proxy's: the cost of the cache's work, which is steadier than the req/s
# ratio on a shared machine (wrk's share of the two cores moves req/s more than it moves these).
#
# With --variants, it measures the proxy against itself instead: plain hits against hits that
# carry a load balancer's fields (`X-Forwarded-Proto`, `X-Forwarded-Port`, `X-Forwarded-For`,
# `X-Real-IP`), hits on a page with `Vary: Accept-Encoding`, and both at once, in turns (the
# order rotates every round), each as a ratio of that round's plain hits; and bare with the
# same fields against bare without them: the floor, what the fields alone cost a server that
# reads none of them (hyper parses and drops them, and that is no work of the cache's).
#
# Usage: ./scripts/bench-hits.sh [--rounds N] [--seconds S] [--redis] [--pin] [--variants]
#   --rounds N   rounds of the two wrk runs (default 3, at least 3 for a median worth reading)
#   --seconds S  length of each wrk run (default 10)
#   --redis      the proxy shares its cache through a redis-server (hits still come from L1)
#   --pin        wrk on the last CPU, the server under test on the others (taskset); off by
#                default: on 2 cores it leaves the servers one core each, which says less
#                about either than letting the kernel share both
#   --variants   the proxy's hits behind a balancer and on a varying page, against its plain
#                hits
# Needs `wrk` (Debian package `wrk`; installed with apt-get if missing and we may) and curl.
set -euo pipefail
cd "$(dirname "$0")/.."

rounds=3
seconds=10
redis=0
pin=0
variants=0
while [ $# -gt 0 ]; do
  case "$1" in
    --rounds) rounds="$2"; shift 2 ;;
    --seconds) seconds="$2"; shift 2 ;;
    --redis) redis=1; shift ;;
    --pin) pin=1; shift ;;
    --variants) variants=1; shift ;;
    -h|--help) sed -n '2,25p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "error: unknown argument $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$rounds:$seconds" in *[!0-9:]*|:*|*:) echo "error: --rounds and --seconds take whole numbers" >&2; exit 2 ;; esac
if [ "$rounds" -lt 1 ] || [ "$seconds" -lt 1 ]; then
  echo "error: --rounds and --seconds take 1 or more" >&2; exit 2
fi

if ! command -v wrk >/dev/null 2>&1; then
  echo "==> wrk is missing: installing the Debian package wrk"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "error: wrk is missing and I cannot install it (not root, no sudo): apt-get install wrk" >&2
      exit 1
    fi
  fi
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq wrk; } >/tmp/tower-stampede-apt.log 2>&1; then
    echo "error: could not install wrk with apt-get; see /tmp/tower-stampede-apt.log" >&2
    exit 1
  fi
fi
for tool in curl awk; do
  command -v "$tool" >/dev/null 2>&1 || { echo "error: $tool is missing" >&2; exit 1; }
done
if [ "$redis" = 1 ] && ! command -v redis-server >/dev/null 2>&1; then
  echo "error: --redis needs redis-server (Debian package redis-server)" >&2
  exit 1
fi

echo "==> cargo build --release --example bare --example proxy"
cargo build --release --quiet --example bare --example proxy
bin=target/release/examples

cpus=$(nproc)
server_cpus=""
wrk_cpus=""
if [ "$pin" = 1 ]; then
  if [ "$cpus" -lt 2 ]; then echo "error: --pin needs 2 CPUs or more" >&2; exit 2; fi
  server_cpus="0-$((cpus - 2))"
  wrk_cpus="$((cpus - 1))"
fi
# Runs a command on the given CPUs (all when none are given), in place of the (sub)shell that
# calls it: started in the background, `$!` is then the server itself, which cleanup kills.
on_cpus() {
  local cpus="$1"; shift
  if [ -n "$cpus" ]; then exec taskset -c "$cpus" "$@"; else exec "$@"; fi
}

work=$(mktemp -d)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

# Starts a server that prints `listening on ADDR`; sets $addr.
start() {
  local name="$1"; shift
  on_cpus "$server_cpus" "$@" >"$work/$name.out" 2>"$work/$name.err" &
  pids+=("$!")
  for _ in $(seq 100); do
    addr=$(sed -n 's/^listening on //p' "$work/$name.out")
    [ -n "$addr" ] && return 0
    sleep 0.1
  done
  echo "error: $name did not start:" >&2
  cat "$work/$name.err" >&2
  exit 1
}

start origin "$bin/bare" --listen 127.0.0.1:0 --origin
origin="$addr"
start bare "$bin/bare" --listen 127.0.0.1:0
bare="$addr"
bare_pid="${pids[-1]}"
proxy_args=(--listen 127.0.0.1:0 --origin "http://$origin")
if [ "$redis" = 1 ]; then
  port=$(awk 'BEGIN { srand(); print 20000 + int(rand() * 20000) }')
  redis-server --port "$port" --bind 127.0.0.1 --save '' --appendonly no \
    >"$work/redis.out" 2>&1 &
  pids+=("$!")
  for _ in $(seq 50); do
    redis-cli -p "$port" ping >/dev/null 2>&1 && break
    sleep 0.1
  done
  proxy_args+=(--redis "redis://127.0.0.1:$port/")
fi
start proxy "$bin/proxy" "${proxy_args[@]}"
proxy="$addr"
proxy_pid="${pids[-1]}"

url_proxy="http://$proxy/page"
url_bare="http://$bare/page"
for _ in $(seq 50); do
  curl -s -o /dev/null -D - "$url_proxy" | grep -qi '^x-cache: HIT' && break
  sleep 0.1
done
curl -s -o /dev/null -D - "$url_proxy" | grep -qi '^x-cache: HIT' \
  || { echo "error: the proxy does not answer $url_proxy from its cache" >&2; exit 1; }
store=$([ "$redis" = 1 ] && echo "redis" || echo "memory")
echo "==> bare on $bare, proxy on $proxy (store: $store), page warm"
echo "==> wrk -t2 -c64 -d${seconds}s --latency, $rounds rounds$([ "$pin" = 1 ] && echo ", wrk on CPU $wrk_cpus, servers on $server_cpus")"

# CPU time a process has used so far (user + system), in clock ticks.
cpu_ticks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
ticks_per_second=$(getconf CLK_TCK)

# Runs wrk against a URL served by process PID (then wrk's own arguments: header fields);
# prints "req/s p99_ms cpu_us_per_request".
measure() {
  local before after url="$1" pid="$2"
  shift 2
  before=$(cpu_ticks "$pid")
  (on_cpus "$wrk_cpus" wrk -t2 -c64 -d"${seconds}s" --latency "$@" "$url") >"$work/wrk.out"
  after=$(cpu_ticks "$pid")
  awk -v ticks=$((after - before)) -v hz="$ticks_per_second" '
    /Requests\/sec:/ { rps = $2 }
    / requests in / { requests = $1 }
    $1 == "99%" {
      v = $2; unit = v; sub(/[0-9.]+/, "", unit); sub(/[a-z]+$/, "", v)
      p99 = (unit == "us") ? v / 1000 : (unit == "s") ? v * 1000 : v
    }
    END { printf "%.0f %.3f %.2f\n", rps, p99, (requests > 0) ? ticks * 1e6 / hz / requests : 0 }' "$work/wrk.out"
}

median() { sort -g | awk '{ v[NR] = $1 } END { print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

if [ "$variants" = 1 ]; then
  balancer=(-H "X-Forwarded-Proto: https" -H "X-Forwarded-Port: 443"
    -H "X-Forwarded-For: 198.51.100.7" -H "X-Real-IP: 198.51.100.7")
  encoding=(-H "Accept-Encoding: gzip, deflate, br")
  # Each shape: its name, path and wrk arguments; every one warmed until it is a hit.
  shapes=(plain balancer vary both)
  shape_args() {
    case "$1" in
      plain) echo "/page" ;;
      balancer) echo "/page" ;;
      vary) echo "/vary" ;;
      both) echo "/vary" ;;
    esac
  }
  headers_of() {
    case "$1" in
      plain) headers=() ;;
      balancer) headers=("${balancer[@]}") ;;
      vary) headers=("${encoding[@]}") ;;
      both) headers=("${balancer[@]}" "${encoding[@]}") ;;
    esac
  }
  for shape in "${shapes[@]}"; do
    headers_of "$shape"
    curl_headers=()
    for ((i = 1; i < ${#headers[@]}; i += 2)); do curl_headers+=(-H "${headers[$i]}"); done
    url="http://$proxy$(shape_args "$shape")"
    for _ in $(seq 50); do
      curl -s -o /dev/null -D - "${curl_headers[@]}" "$url" | grep -qi '^x-cache: HIT' && break
      sleep 0.1
    done
    curl -s -o /dev/null -D - "${curl_headers[@]}" "$url" | grep -qi '^x-cache: HIT' \
      || { echo "error: $shape hits are not answered from the cache" >&2; exit 1; }
  done
  printf '%-6s %-9s %10s %9s %9s %9s %10s %9s %9s\n' round shape rps rps_ratio cpu_us cpu_ratio \
    bare_rps bare_rps_r bare_cpu_r
  : >"$work/rounds"
  for round in $(seq "$rounds"); do
    order=("${shapes[@]:$(( (round - 1) % 4 ))}" "${shapes[@]:0:$(( (round - 1) % 4 ))}")
    declare -A rps cpu brps bcpu
    for shape in "${order[@]}"; do
      headers_of "$shape"
      read -r r _ c < <(measure "http://$proxy$(shape_args "$shape")" "$proxy_pid" "${headers[@]}")
      rps[$shape]=$r; cpu[$shape]=$c
      read -r r _ c < <(measure "http://$bare$(shape_args "$shape")" "$bare_pid" "${headers[@]}")
      brps[$shape]=$r; bcpu[$shape]=$c
    done
    for shape in "${shapes[@]}"; do
      ratio=$(awk -v s="${rps[$shape]}" -v p="${rps[plain]}" 'BEGIN { printf "%.3f", (p > 0) ? s / p : 0 }')
      cratio=$(awk -v s="${cpu[$shape]}" -v p="${cpu[plain]}" 'BEGIN { printf "%.3f", (s > 0) ? p / s : 0 }')
      bratio=$(awk -v s="${brps[$shape]}" -v p="${brps[plain]}" 'BEGIN { printf "%.3f", (p > 0) ? s / p : 0 }')
      bcratio=$(awk -v s="${bcpu[$shape]}" -v p="${bcpu[plain]}" 'BEGIN { printf "%.3f", (s > 0) ? p / s : 0 }')
      printf '%-6s %-9s %10s %9s %9s %9s %10s %9s %9s\n' "$round" "$shape" "${rps[$shape]}" "$ratio" \
        "${cpu[$shape]}" "$cratio" "${brps[$shape]}" "$bratio" "$bcratio"
      echo "$shape $ratio $cratio $bratio $bcratio" >>"$work/rounds"
    done
  done
  for shape in balancer vary both; do
    r=$(awk -v s="$shape" '$1 == s { print $2 }' "$work/rounds" | median)
    c=$(awk -v s="$shape" '$1 == s { print $3 }' "$work/rounds" | median)
    br=$(awk -v s="$shape" '$1 == s { print $4 }' "$work/rounds" | median)
    bc=$(awk -v s="$shape" '$1 == s { print $5 }' "$work/rounds" | median)
    echo "==> $shape over plain hits: req/s median $r, CPU per request (plain/$shape) median $c (goal: >= 0.9); floor (bare, the same fields): req/s $br, CPU $bc"
  done
  exit 0
fi

printf '%-6s %10s %10s %10s %10s %9s %9s %8s %8s %9s\n' round proxy_rps proxy_p99 bare_rps bare_p99 rps_ratio p99_ratio proxy_us bare_us cpu_ratio
row() { printf '%-6s %10s %8sms %10s %8sms %9s %9s %8s %8s %9s\n' "$@"; }
: >"$work/rounds"
for round in $(seq "$rounds"); do
  if [ $((round % 2)) = 1 ]; then
    read -r prps pp99 pcpu < <(measure "$url_proxy" "$proxy_pid")
    read -r brps bp99 bcpu < <(measure "$url_bare" "$bare_pid")
  else
    read -r brps bp99 bcpu < <(measure "$url_bare" "$bare_pid")
    read -r prps pp99 pcpu < <(measure "$url_proxy" "$proxy_pid")
  fi
  ratio=$(awk -v p="$prps" -v b="$brps" 'BEGIN { printf "%.3f", (b > 0) ? p / b : 0 }')
  p99ratio=$(awk -v p="$pp99" -v b="$bp99" 'BEGIN { printf "%.2f", (b > 0) ? p / b : 0 }')
  cpuratio=$(awk -v p="$pcpu" -v b="$bcpu" 'BEGIN { printf "%.3f", (p > 0) ? b / p : 0 }')
  row "$round" "$prps" "$pp99" "$brps" "$bp99" "$ratio" "$p99ratio" "$pcpu" "$bcpu" "$cpuratio"
  echo "$prps $pp99 $brps $bp99 $ratio $p99ratio $pcpu $bcpu $cpuratio" >>"$work/rounds"
done
column() { awk -v c="$1" '{ print $c }' "$work/rounds" | median; }
row median "$(column 1)" "$(column 2)" "$(column 3)" "$(column 4)" "$(column 5)" "$(column 6)" "$(column 7)" "$(column 8)" "$(column 9)"
ratios=$(awk '{ printf "%s%s", sep, $5; sep = " " }' "$work/rounds")
echo "==> proxy/bare req/s per round: $ratios; median $(column 5) (goal: >= 0.9); median p99 ratio $(column 6) (goal: <= 1.5)"
echo "==> CPU per request: proxy $(column 7) us, bare $(column 8) us; bare/proxy median $(column 9)"
