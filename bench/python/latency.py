#!/usr/bin/env python3
"""ferry's latencies beside their floors and their peers, in one command:

- the notification round trip (``bench/python/engines.py``) beside a bare
  Unix-socket ping-pong between two processes (its floor) and NIXL's;
- a 4 KiB hand-off through the coordinator (``ferry bench --sizes 4K``,
  shared memory, control over Unix sockets) beside the sum of its hops,
  each message measured alone over a bare socket pair in the same run;
  and the control channel's round trip over ZeroMQ ipc (``ferry bench
  --control zmq``) beside bare libzmq sockets;
- the control messages' codec (``ferry bench wire``) beside a plain
  memcpy of the same bytes;
- ``FerryConnector``'s ``get`` of a 1 MiB payload, polled and waited for,
  and its 64 MiB put + get, the first into a fresh pool included
  (``bench/python/vllm_omni_connectors.py``), beside vLLM-omni's
  SharedMemoryConnector and, where NIXL is installed, its NixlConnector.

Each part runs its engines side by side in one run, alternating, and this
prints the medians of its rounds with each figure's ratio to its floor and
to its peer (the machines these run on are shared and noisy: compare
ratios, not figures across runs). A part whose tools are missing is left
out, and said so.

    python3 bench/python/latency.py [--rounds 3] [--ferry target/release/ferry]
        [--python PY] [--vllm-omni-python PY]

``--python`` runs engines.py (it needs ``tensorferry``, ``numpy`` and, for
the peer, ``nixl``; default: this interpreter); ``--vllm-omni-python``
runs the connectors' part (an interpreter with vLLM-omni and
``tensorferry``; default ``$FERRY_VLLM_OMNI_PYTHON``; without it, the part
is left out). This is a benchmark, not a test: it asserts nothing about
speed.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def run(cmd: list, env=None) -> list:
    """The JSON lines `cmd` printed (anything else goes to stderr)."""
    print(f"# {' '.join(str(c) for c in cmd)}", file=sys.stderr, flush=True)
    out = subprocess.run(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, text=True, check=True).stdout
    rows = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") or line.startswith("["):
            rows.append(json.loads(line))
        elif line:
            print(f"  | {line}", file=sys.stderr)
    return rows


def median(xs):
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


class Table:
    """Rows of (figure, unit, ferry, floor, floor's name, peer, peer's
    name); lower is better for µs and ns, higher for GB/s."""

    def __init__(self):
        self.rows = []

    def add(self, figure, unit, ferry, floor=None, floor_name="", peer=None, peer_name=""):
        self.rows.append((figure, unit, ferry, floor, floor_name, peer, peer_name))

    def print(self):
        def num(x):
            return f"{x:>10.2f}" if x is not None else f"{'-':>10}"

        def ratio(a, b):
            return f"{a / b:>8.2f}x" if a is not None and b else f"{'-':>9}"

        print(f"  {'figure':<38} {'unit':<5} {'ferry':>10} {'floor':>10} {'/floor':>9} "
              f"{'peer':>10} {'/peer':>9}  floor; peer")
        for figure, unit, ferry, floor, fname, peer, pname in self.rows:
            print(f"  {figure:<38} {unit:<5} {num(ferry)} {num(floor)} {ratio(ferry, floor)} "
                  f"{num(peer)} {ratio(ferry, peer)}  {fname or '-'}; {pname or '-'}")
        print("  (/floor, /peer: ferry's figure over theirs; for µs, ns and ms below 1 is faster)")


def notifications(py: str, rounds: int, table: Table) -> None:
    rows = run([py, "bench/python/engines.py", "--engines", "ferry,nixl", "--rounds", str(rounds),
                "--json"])
    ferry = median(r.get("ferry", {}).get("notify") for r in rows)
    floor = median(r.get("memcpy", {}).get("notify") for r in rows)
    nixl = median(r.get("nixl", {}).get("notify") for r in rows)
    table.add("notification round trip p50", "µs", ferry, floor, "bare Unix socket", nixl, "NIXL")


def handoffs(ferry_bin: str, rounds: int, table: Table) -> None:
    p50s, hops, zmq, bare = [], [], [], []
    for _ in range(rounds):
        for row in run([ferry_bin, "bench", "--sizes", "4K", "--json"]):
            for r in row["rows"]:
                p50s.append(r.get("p50_us"))
                hops.append(r.get("hop_sum_us"))
        for row in run([ferry_bin, "bench", "--control", "zmq", "--json"]):
            zmq.append(row["ipc"]["p50_us"])
            bare.append(row["ipc"].get("bare_p50_us"))
    table.add("4 KiB hand-off p50 (shm, Unix sockets)", "µs", median(p50s), median(hops),
              "sum of its hops")
    table.add("control round trip p50 (ZeroMQ ipc)", "µs", median(zmq), median(bare),
              "bare libzmq")


def codec(ferry_bin: str, rounds: int, table: Table) -> None:
    got = {}
    for _ in range(rounds):
        for row in run([ferry_bin, "bench", "wire", "--seconds", "1", "--format", "json"]):
            for name, r in row.items():
                got.setdefault(name, []).append((1e9 / r["per_second"], r.get("memcpy_ns")))
    for name, pairs in got.items():
        table.add(f"{name} encode+decode", "ns", median(p for p, _ in pairs),
                  median(m for _, m in pairs), "memcpy of its bytes")


def connectors(py: str, rounds: int, table: Table) -> None:
    rows = run([py, "bench/python/vllm_omni_connectors.py", "--rounds", str(rounds), "--json"])
    if not rows:
        return
    med = rows[-1]
    ferry, shm, nixl = med.get("ferry", {}), med.get("shm", {}), med.get("nixl", {})
    for key, label, unit in (
        ("s_get", "connector 1 MiB get p50 (polled)", "µs"),
        ("s_get_dl", "connector 1 MiB get p50 (deadline)", "µs"),
        ("l_pg", "connector 64 MiB put+get p50", "ms"),
        ("l_first_pg", "connector first 64 MiB put+get", "ms"),
    ):
        table.add(label, unit, ferry.get(key), shm.get(key), "SharedMemoryConnector",
                  nixl.get(key), "NixlConnector" if nixl else "")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--ferry", default=str(ROOT / "target/release/ferry"))
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--vllm-omni-python", default=os.environ.get("FERRY_VLLM_OMNI_PYTHON"))
    args = ap.parse_args()
    ferry_bin = args.ferry if Path(args.ferry).exists() else shutil.which("ferry")
    table = Table()
    parts = [
        ("notifications", lambda: notifications(args.python, args.rounds, table)),
        ("hand-offs", ferry_bin and (lambda: handoffs(ferry_bin, args.rounds, table))),
        ("codec", ferry_bin and (lambda: codec(ferry_bin, args.rounds, table))),
        ("connectors", args.vllm_omni_python and (lambda: connectors(args.vllm_omni_python,
                                                                     args.rounds, table))),
    ]
    for name, part in parts:
        if not part:
            print(f"# {name}: its tool is missing (the ferry binary, or --vllm-omni-python); left out",
                  file=sys.stderr)
            continue
        try:
            part()
        except (subprocess.CalledProcessError, OSError, ValueError, KeyError) as e:
            print(f"# {name}: failed ({type(e).__name__}: {e}); left out", file=sys.stderr)
    print(f"\nmedians of {args.rounds} rounds, each part run side by side")
    table.print()


if __name__ == "__main__":
    main()
