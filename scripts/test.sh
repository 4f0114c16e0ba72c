#!/usr/bin/env bash
# Installs what the tests need (redis-server), then runs formatting, lints and the whole suite.
# Usage: ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

need_redis() { ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; }

if need_redis; then
  echo "==> installing redis-server (Debian package)"
  sudo=""
  if [ "$(id -u)" -ne 0 ]; then
    if command -v sudo >/dev/null 2>&1; then sudo="sudo"; else
      echo "error: redis-server is missing and I cannot install it (not root, no sudo)." >&2
      echo "       install it yourself, e.g. 'apt-get install redis-server', and re-run." >&2
      exit 1
    fi
  fi
  if ! { $sudo apt-get update -qq && DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq redis-server redis-tools; } >/tmp/tower-stampede-apt.log 2>&1; then
    echo "error: could not install redis-server with apt-get; see /tmp/tower-stampede-apt.log" >&2
    tail -n 20 /tmp/tower-stampede-apt.log >&2 || true
    exit 1
  fi
fi
# The tests start their own servers on free ports; a distribution's service is not needed.
echo "==> $(redis-server --version)"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy (all targets, all features, -D warnings)"
cargo clippy --all-targets --all-features -- -D warnings

echo "==> cargo clippy (all targets, no default features: the embedded store alone)"
cargo clippy --all-targets --no-default-features -- -D warnings

echo "==> cargo test (library, integration, examples' build, doctests)"
cargo test --all-features
