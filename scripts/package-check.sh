#!/usr/bin/env bash
# Checks that the package is whole: packs the crate as `cargo publish` would, unpacks the
# `.crate` into a temporary directory, builds what it ships there (the library, its unit tests
# and the examples, with every feature, from the package's own Cargo.lock) with a target
# directory of its own, and asks the registry whether it would take the package
# (`cargo publish --dry-run`). Everything it makes is removed when it ends.
#
# Usage: ./scripts/package-check.sh [--allow-dirty]   (--allow-dirty: uncommitted changes too)
#
# PACKAGE_CHECK_TARGET_DIR names another target directory to build in, kept after: the
# suite's own (`./scripts/test.sh` passes it), whose dependencies built at the same versions
# and features are then reused instead of built again. What is built does not change: the
# unpacked package is a package of its own (its own path, manifest and lock file), so none
# of the workspace's units can stand in for its own.
#
# cargo warns "ignoring test/benchmark `x` as `tests/x.rs` is not included in the published
# package" for each test and bench: they are left out on purpose (they import the workspace's
# path-only `support` crate, which a package cannot carry), and cargo drops their targets from
# the published manifest.
set -euo pipefail
cd "$(dirname "$0")/.."

allow_dirty=()
case "${1:-}" in
  "") ;;
  --allow-dirty) allow_dirty=(--allow-dirty) ;;
  *) echo "usage: $0 [--allow-dirty]" >&2; exit 2 ;;
esac

scratch="$(mktemp -d -t tower-stampede-package.XXXXXX)"
trap 'rm -rf "$scratch"' EXIT
export CARGO_TARGET_DIR="${PACKAGE_CHECK_TARGET_DIR:-$scratch/target}"

cargo package "${allow_dirty[@]}" --no-verify --quiet
version="$(cargo metadata --format-version 1 --no-deps |
  python3 -c 'import json, sys; print(next(p["version"] for p in json.load(sys.stdin)["packages"] if p["name"] == "tower-stampede"))')"
crate="$CARGO_TARGET_DIR/package/tower-stampede-$version.crate"
echo "==> $(basename "$crate"): $(tar tzf "$crate" | wc -l) files, $(du -k "$crate" | cut -f1) KiB"
mkdir "$scratch/unpacked"
tar xzf "$crate" -C "$scratch/unpacked"
unpacked="$scratch/unpacked/tower-stampede-$version"

# Nothing the package cannot build may ship: a test or bench left in would fail here.
if tar tzf "$crate" | grep -E '^[^/]+/(tests|benches)/|\.svg$'; then
  echo "error: the package ships tests, benches or charts (above)" >&2
  exit 1
fi

# The library's unit tests are built from the package unless one imports the workspace's
# `support` crate (which the package cannot carry); then they are named, and left out.
lib=(--lib)
borrowing="$(grep -rlE '\bsupport::' "$unpacked/src" | sed "s|^$unpacked/||" || true)"
if [ -n "$borrowing" ]; then
  lib=()
  echo "warning: the library's unit tests are not built from the package: these files import" >&2
  echo "         the workspace's path-only \`support\` crate, which the package cannot carry:" >&2
  echo "$borrowing" | sed 's/^/           /' >&2
fi

# The package's own manifest and lock file, outside the workspace: what a user of the
# `.crate` (or crater, or a distribution's packager) builds.
(
  cd "$unpacked"
  cargo test --locked --all-features --no-run "${lib[@]}" --examples
  cargo check --locked --no-default-features --lib
)

# The registry's checks (name, metadata, size), without building it a second time.
cargo publish "${allow_dirty[@]}" --dry-run --no-verify --quiet
echo "==> the package builds alone, and the registry would take it"
