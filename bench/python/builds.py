#!/usr/bin/env python3
"""Two builds of `ferry` side by side: `ferry bench --sizes ... --json` of
each, alternating (old, new, then new, old, ...) in one run, so that a
shared, noisy machine weighs on both alike; prints the medians and their
ratios (new over old).

    python3 bench/python/builds.py OLD/ferry NEW/ferry [ROUNDS] [SIZES]

ROUNDS defaults to 6, SIZES to 4K,64M (as `ferry bench --sizes` reads
them).
"""

import json
import statistics
import subprocess
import sys


def run(exe: str, sizes: str) -> list:
    out = subprocess.run(
        [exe, "bench", "--sizes", sizes, "--seconds", "2", "--json"],
        capture_output=True, text=True, timeout=600, check=True,
    ).stdout
    return json.loads(out)["rows"]


def label(size: int) -> str:
    return f"{size >> 10} KiB" if size < 1 << 20 else f"{size >> 20} MiB"


def main() -> None:
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    old, new = sys.argv[1], sys.argv[2]
    rounds = int(sys.argv[3]) if len(sys.argv) > 3 else 6
    sizes = sys.argv[4] if len(sys.argv) > 4 else "4K,64M"
    seen = {"old": {}, "new": {}}
    for r in range(rounds):
        order = (("old", old), ("new", new)) if r % 2 == 0 else (("new", new), ("old", old))
        for name, exe in order:
            for row in run(exe, sizes):
                seen[name].setdefault(row["size"], []).append((row["p50_us"], row["gbps"]))
    print("| size | old p50 µs | new p50 µs | new/old p50 | old GB/s | new GB/s | new/old GB/s |")
    print("|---|---|---|---|---|---|---|")
    for size in sorted(seen["old"]):
        o, n = seen["old"][size], seen["new"][size]
        op, np_ = statistics.median(x[0] for x in o), statistics.median(x[0] for x in n)
        og, ng = statistics.median(x[1] for x in o), statistics.median(x[1] for x in n)
        print(f"| {label(size)} | {op:.1f} | {np_:.1f} | {np_ / op:.2f} | {og:.2f} | {ng:.2f} | {ng / og:.2f} |")
    print(f"(medians of {rounds} runs each, old and new alternating)")


if __name__ == "__main__":
    main()
