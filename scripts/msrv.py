#!/usr/bin/env python3
"""Checks the workspace's declared rust-version against the locked
dependencies: it must be the highest rust-version that any package built
for the default features declares (the oldest toolchain that can build
them). Clippy's incompatible_msrv lint, run with -D warnings by
scripts/test, checks that ferry's own code uses nothing newer.

usage: scripts/msrv.py   (from the workspace root)
"""

import json
import subprocess
import sys


def version(text):
    parts = [int(p) for p in text.split(".")]
    return tuple(parts + [0] * (3 - len(parts)))


def main():
    meta = json.loads(
        subprocess.check_output(["cargo", "metadata", "--format-version", "1", "--locked"])
    )
    by_id = {(p["name"], p["version"]): p for p in meta["packages"]}
    # What the default features of every member build (normal and build
    # dependencies, not dev-dependencies), as cargo resolves them.
    tree = subprocess.check_output(
        ["cargo", "tree", "--workspace", "--locked", "-e", "normal,build",
         "--prefix", "none", "--format", "{p}"],
        text=True,
    )
    needs = []
    for line in set(tree.split("\n")):
        fields = line.split()
        if len(fields) < 2:
            continue
        pkg = by_id.get((fields[0], fields[1].lstrip("v")))
        if pkg and pkg.get("rust_version") and pkg["source"]:
            needs.append((version(pkg["rust_version"]), pkg["name"], pkg["version"]))
    needs.sort(reverse=True)
    members = [p for p in meta["packages"] if p["id"] in meta["workspace_members"]]
    declared = {p["name"]: p.get("rust_version") for p in members}
    highest = needs[0][0]
    named = ", ".join(f"{n} {v}" for r, n, v in needs if r == highest)
    wanted = ".".join(str(x) for x in highest[:2]) if highest[2] == 0 else ".".join(map(str, highest))
    bad = {n: d for n, d in declared.items() if d is None or version(d) != highest}
    if bad:
        print(f"rust-version must be {wanted} (needed by {named}); declared: {bad}", file=sys.stderr)
        sys.exit(1)
    print(f"rust-version {wanted}: the highest the locked dependencies need ({named})")


if __name__ == "__main__":
    main()
