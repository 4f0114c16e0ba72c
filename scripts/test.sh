#!/usr/bin/env bash
# Installs what the tests need (redis-server and redis-cli; openssl for the TLS tests), then runs
# formatting, lints and the whole suite.
# Usage: ./scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."

missing() {
  local packages=()
  if ! command -v redis-server >/dev/null 2>&1 || ! command -v redis-cli >/dev/null 2>&1; then
    packages+=(redis-server redis-tools)
  fi
  command -v openssl >/dev/null 2>&1 || packages+=(openssl)
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
echo "==> $(openssl version)"

echo "==> cargo fmt --check"
cargo fmt --all -- --check

echo "==> cargo clippy (all targets, all features, -D warnings)"
cargo clippy --all-targets --all-features -- -D warnings

echo "==> cargo clippy (all targets, no default features: the embedded store alone)"
cargo clippy --all-targets --no-default-features -- -D warnings

echo "==> cargo doc (all features and none, -D warnings: a broken intra-doc link fails)"
RUSTDOCFLAGS="-D warnings" cargo doc --all-features --no-deps
RUSTDOCFLAGS="-D warnings" cargo doc --no-default-features --no-deps

echo "==> cargo test (library, integration, examples' build, doctests)"
cargo test --all-features

echo "==> the soak: a 60 s smoke run on one redis-server, seed 31 (./scripts/soak.sh for more)"
SOAK_SECS=60 SOAK_SEED=31 cargo test --all-features --test soak -- --ignored --nocapture

echo "==> cargo test (no default features: the tests over the embedded store, without Redis)"
cargo test --no-default-features

echo "==> the gRPC example (tonic; its own crate, its tests over redis-server)"
cargo clippy -p tower-stampede-grpc --all-targets -- -D warnings
cargo test -p tower-stampede-grpc

echo "==> the protocol models (stateright, exhaustive; release mode: about two minutes on 2 cores)"
cargo clippy -p tower-stampede-model --all-targets -- -D warnings
cargo test --release -p tower-stampede-model -- --nocapture
