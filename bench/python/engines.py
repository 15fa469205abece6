#!/usr/bin/env python3
"""ferry.TransferEngine beside NIXL and Mooncake's transfer engine, from
Python, on one host, in one run: one-sided writes of 4 KiB (median latency
of a synchronous write) and 64 MiB (throughput) from this process into a
buffer another process registered, with numpy's memcpy in this process as
the ceiling. Engines take turns, round after round, and each round prints
its ratios, because the machines these run on are shared and noisy.

    pip install ./python nixl mooncake-transfer-engine-non-cuda numpy
    python3 bench/python/engines.py [--rounds 3] [--engines ferry,nixl,mooncake]

Engines that are not installed are left out (and said so). NIXL runs its
UCX backend on DRAM (on one host UCX picks shared memory or cross-memory
attach); Mooncake runs its TCP transport with the P2P handshake. Every
engine's last 64 MiB write is checked by hash in the target process. Each
engine runs in fresh processes of its own (writer and target), so that no
engine's background threads (NIXL's progress thread, Mooncake's workers)
share the cores with another's measurement. This is a benchmark, not a
test: it asserts nothing about speed.
"""

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import statistics
import sys
import time

import numpy as np

# Mooncake logs every connection through glog, NIXL every agent: keep
# their warnings and errors.
os.environ.setdefault("GLOG_minloglevel", "1")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARNING")

SMALL = 4096
LARGE = 64 << 20
SMALL_ITERS = 3000
LARGE_ITERS = 12


# ---- the target side: a process that registers a buffer and waits --------

def target(engine: str, conn) -> None:
    dst = np.zeros(LARGE + SMALL, dtype=np.uint8)
    dst[:] = 1  # fault every page in before anything is timed
    addr = dst.ctypes.data
    keep = []
    if engine == "ferry":
        import ferry

        eng = ferry.TransferEngine("local")
        eng.register_buffer(addr, dst.nbytes)
        keep.append(eng)
        conn.send({"session": eng.session_id, "addr": addr})
    elif engine == "nixl":
        from nixl._api import nixl_agent, nixl_agent_config

        agent = nixl_agent("ferry-bench-target", nixl_agent_config(backends=["UCX"]))
        agent.register_memory([(addr, dst.nbytes, 0, "")], "DRAM")
        small = agent.get_xfer_descs([(addr + LARGE, SMALL, 0)], "DRAM")
        large = agent.get_xfer_descs([(addr, LARGE, 0)], "DRAM")
        keep.append(agent)
        conn.send({
            "meta": agent.get_agent_metadata(),
            "small": agent.get_serialized_descs(small),
            "large": agent.get_serialized_descs(large),
        })
    elif engine == "mooncake":
        from mooncake.engine import TransferEngine

        te = TransferEngine()
        if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            conn.send({"error": "mooncake: initialize failed"})
            return
        te.register_memory(addr, dst.nbytes)
        keep.append(te)
        conn.send({"session": f"127.0.0.1:{te.get_rpc_port()}", "addr": addr})
    while True:
        msg = conn.recv()
        if msg == "sha":
            conn.send(hashlib.sha256(dst[:LARGE].tobytes()).hexdigest())
        else:
            break


# ---- the initiator side ---------------------------------------------------

class Initiator:
    """One engine's writer: `write(small)` writes SMALL or LARGE bytes."""

    def __init__(self, engine: str, src: np.ndarray, peer: dict) -> None:
        self.engine = engine
        addr = src.ctypes.data
        if engine == "ferry":
            import ferry

            self.eng = ferry.TransferEngine("local")
            self.eng.register_buffer(addr, src.nbytes)
            session, dst = peer["session"], peer["addr"]
            sync = self.eng.transfer_sync

            def write(small: bool) -> None:
                n = SMALL if small else LARGE
                if sync(session, addr, dst + (LARGE if small else 0), n) != 0:
                    raise RuntimeError(self.eng.last_error)

            self.write = write
        elif engine == "nixl":
            from nixl._api import nixl_agent, nixl_agent_config

            agent = nixl_agent("ferry-bench-initiator", nixl_agent_config(backends=["UCX"]))
            agent.register_memory([(addr, src.nbytes, 0, "")], "DRAM")
            name = agent.add_remote_agent(peer["meta"])
            handles = {
                True: agent.initialize_xfer("WRITE", agent.get_xfer_descs([(addr, SMALL, 0)], "DRAM"),
                                            agent.deserialize_descs(peer["small"]), name),
                False: agent.initialize_xfer("WRITE", agent.get_xfer_descs([(addr, LARGE, 0)], "DRAM"),
                                             agent.deserialize_descs(peer["large"]), name),
            }
            self.eng = agent

            def write(small: bool) -> None:
                h = handles[small]
                state = agent.transfer(h)
                while state == "PROC":
                    state = agent.check_xfer_state(h)
                if state != "DONE":
                    raise RuntimeError(f"nixl transfer: {state}")

            self.write = write
        elif engine == "mooncake":
            from mooncake.engine import TransferEngine

            te = TransferEngine()
            if te.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("mooncake: initialize failed")
            te.register_memory(addr, src.nbytes)
            self.eng = te
            session, dst = peer["session"], peer["addr"]

            def write(small: bool) -> None:
                n = SMALL if small else LARGE
                if te.transfer_sync_write(session, addr, dst + (LARGE if small else 0), n) != 0:
                    raise RuntimeError("mooncake transfer_sync_write failed")

            self.write = write


def available(engine: str) -> bool:
    module = {"ferry": "ferry", "nixl": "nixl._api", "mooncake": "mooncake.engine"}[engine]
    try:
        __import__(module)
        return True
    except Exception as e:  # ImportError, or a library that fails to load
        print(f"# {engine}: not available ({type(e).__name__}: {e}); left out", file=sys.stderr)
        return False


def measure(write, iters_small: int, iters_large: int) -> tuple:
    for _ in range(50):
        write(True)
    lat = []
    for _ in range(iters_small):
        t = time.perf_counter_ns()
        write(True)
        lat.append(time.perf_counter_ns() - t)
    write(False)
    rates = []
    for _ in range(iters_large):
        t = time.perf_counter()
        write(False)
        rates.append(LARGE / (time.perf_counter() - t) / 1e9)
    return statistics.median(lat) / 1000, statistics.median(rates)


def run(engine: str, conn) -> None:
    """One engine's measurement, in a process of its own with a target
    process of its own, so that no other engine's threads (NIXL's progress
    thread, Mooncake's workers) share the cores while it runs."""
    src = np.random.default_rng(5).integers(0, 256, LARGE, dtype=np.uint8)
    if engine == "memcpy":
        dst = np.ones(LARGE, dtype=np.uint8)
        small_src, small_dst = src[:SMALL].copy(), np.ones(SMALL, dtype=np.uint8)

        def write(small: bool) -> None:
            if small:
                np.copyto(small_dst, small_src)
            else:
                np.copyto(dst, src)

        conn.send({"result": measure(write, SMALL_ITERS, LARGE_ITERS), "checked": True})
        return
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=target, args=(engine, there), daemon=True)
    proc.start()
    info = here.recv()
    if "error" in info:
        conn.send({"error": info["error"]})
        return
    ini = Initiator(engine, src, info)
    result = measure(ini.write, SMALL_ITERS, LARGE_ITERS)
    here.send("sha")
    checked = here.recv() == hashlib.sha256(src.tobytes()).hexdigest()
    here.send("exit")
    proc.join(timeout=10)
    conn.send({"result": result, "checked": checked})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="ferry,nixl,mooncake")
    ap.add_argument("--json", action="store_true", help="one JSON line per round")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if available(e)]
    ctx = mp.get_context("spawn")
    print(f"# {os.cpu_count()} cpus; 4 KiB: median of {SMALL_ITERS} synchronous writes; "
          f"64 MiB: median of {LARGE_ITERS}; each round runs every engine in turn, each in "
          f"fresh processes (writer and target)")
    for r in range(1, args.rounds + 1):
        row = {"round": r}
        for e in ["memcpy"] + engines:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=run, args=(e, there))
            proc.start()
            out = here.recv()
            proc.join(timeout=30)
            if "error" in out:
                print(f"# {e}: {out['error']}; left out", file=sys.stderr)
                continue
            if not out["checked"]:
                print(f"# {e}: WRONG BYTES at the target in round {r}", file=sys.stderr)
            row[e] = out["result"]
        if args.json:
            print(json.dumps(row))
            continue
        print(f"\nround {r}")
        print(f"  {'engine':<10} {'4 KiB p50 µs':>13} {'64 MiB GB/s':>12} {'× memcpy':>9} {'× nixl GB/s':>12} {'÷ nixl µs':>10}")
        for name in [k for k in row if k != "round"]:
            us, gbs = row[name]
            vs_mem = gbs / row["memcpy"][1]
            vs_nixl = f"{gbs / row['nixl'][1]:.2f}" if "nixl" in row else "-"
            lat_nixl = f"{us / row['nixl'][0]:.2f}" if "nixl" in row else "-"
            print(f"  {name:<10} {us:>13.2f} {gbs:>12.2f} {vs_mem:>9.2f} {vs_nixl:>12} {lat_nixl:>10}")


if __name__ == "__main__":
    main()
