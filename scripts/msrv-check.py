#!/usr/bin/env python3
"""Checks the crate's declared MSRV against what its locked dependencies declare.

Reads `cargo metadata` (every feature, every platform, the versions Cargo.lock holds) and
walks the build graph of `tower-stampede` as a user builds it: its normal and build
dependencies, and theirs, never a dev-dependency. Fails, naming them, if any declares a
`rust-version` newer than the crate's own; a dependency that declares none is listed, since
nothing can be checked for it.

This checks the declarations, not a build: only the machine's own toolchain is installed, so
no older compiler builds the crate here.

Usage: ./scripts/msrv-check.py
"""

import json
import subprocess
import sys

CRATE = "tower-stampede"


def version(text):
    """`1.89` and `1.89.0` as a tuple that compares as Rust versions do."""
    parts = [int(part) for part in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    metadata = json.loads(
        subprocess.run(
            ["cargo", "metadata", "--format-version", "1", "--all-features", "--locked"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout
    )
    packages = {package["id"]: package for package in metadata["packages"]}
    nodes = {node["id"]: node for node in metadata["resolve"]["nodes"]}
    root = next(id for id, package in packages.items() if package["name"] == CRATE)
    ours = packages[root].get("rust_version")
    if ours is None:
        print(f"error: {CRATE} declares no rust-version", file=sys.stderr)
        return 1

    built, todo = set(), [root]
    while todo:
        id = todo.pop()
        if id in built:
            continue
        built.add(id)
        for dep in nodes[id]["deps"]:
            if any(kind["kind"] in (None, "build") for kind in dep["dep_kinds"]):
                todo.append(dep["pkg"])
    built.discard(root)

    newer, undeclared, highest = [], [], None
    for id in sorted(built, key=lambda id: packages[id]["name"]):
        package = packages[id]
        declared = package.get("rust_version")
        name = f"{package['name']} {package['version']}"
        if declared is None:
            undeclared.append(name)
            continue
        if highest is None or version(declared) > version(highest[0]):
            highest = (declared, name)
        if version(declared) > version(ours):
            newer.append(f"{name} declares rust-version {declared}")

    print(f"{CRATE} declares rust-version {ours}; {len(built)} locked dependencies are built")
    if highest is not None:
        print(f"the highest any of them declares: {highest[0]} ({highest[1]})")
    if undeclared:
        print(f"declaring none ({len(undeclared)}): {', '.join(undeclared)}")
    if newer:
        print(f"error: newer than {ours}:", file=sys.stderr)
        for line in newer:
            print(f"  {line}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
