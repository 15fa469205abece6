#!/usr/bin/env python3
"""tensorferry.TransferEngine beside NIXL and Mooncake's transfer engine, from
Python, on one host, in one run, between this process and a buffer another
process registered:

- write 4 KiB: median latency of a synchronous one-sided write;
- write 64 MiB: throughput;
- batch 64 x 64 KiB: median time of an asynchronous batch of 64 writes of
  64 KiB each (posted at once, then waited for: ferry's ``post_write`` and
  ``Transfer.wait``, NIXL's ``transfer`` and ``check_xfer_state``,
  Mooncake's ``batch_transfer_async_write`` and
  ``get_batch_transfer_status``);
- read 4 KiB, read 64 MiB: one-sided reads of the other process's buffer,
  as the writes;
- notify round trip: median time for a notification to the other process
  and its answer back (ferry's ``notify`` and ``notifications``,
  NIXL's ``send_notif`` and ``get_new_notifs``; Mooncake's Python API
  sends none).

numpy's memcpy in this process is the ceiling of the copies, and a bare
Unix-socket ping-pong between two processes the floor of the round trip
(the ``memcpy`` column). Engines take
turns, round after round, and each round prints its ratios to NIXL,
because the machines these run on are shared and noisy.

    pip install ./python nixl mooncake-transfer-engine-non-cuda numpy
    python3 bench/python/engines.py [--rounds 3] [--engines ferry,nixl,mooncake] [--scale 1]

Engines that are not installed are left out (and said so). NIXL runs its
UCX backend on DRAM (on one host UCX picks shared memory or cross-memory
attach), without its progress thread: both sides poll, which drives UCX
(its target spins while it waits), as that thread only competes for the
cores of a small host (with it, a notification round trip took 8 ms
instead of 12 µs on a 2-core machine); Mooncake runs its TCP transport with the P2P handshake. Every
engine's last 64 MiB write is checked by hash in the target process, and
its last 64 MiB read in this one. Each engine runs in fresh processes of
its own (initiator and target), so that no engine's background threads
(NIXL's progress thread, Mooncake's workers) share the cores with
another's measurement. This is a benchmark, not a test: it asserts
nothing about speed.
"""

import argparse
import hashlib
import json
import multiprocessing as mp
import os
import socket
import statistics
import sys
import time

import numpy as np

# Mooncake logs every connection through glog, NIXL every agent: keep
# their warnings and errors.
os.environ.setdefault("GLOG_minloglevel", "1")
os.environ.setdefault("NIXL_LOG_LEVEL", "WARN")

KiB = 1 << 10
SMALL = 4 * KiB
LARGE = 64 << 20
#: The batch: PIECES writes of PIECE bytes, PIECE_STRIDE apart on both
#: sides (not contiguous, so that no engine merges them into one).
PIECES = 64
PIECE = 64 * KiB
PIECE_STRIDE = 128 * KiB

#: Iterations of each case at --scale 1.
ITERS = {"small": 3000, "large": 12, "batch": 400, "notify": 1000}

#: The cases, in the order they run and print: (key, label, unit).
CASES = [
    ("w4k", "write 4 KiB p50", "µs"),
    ("w64m", "write 64 MiB", "GB/s"),
    ("batch", "batch 64 x 64 KiB p50", "µs"),
    ("r4k", "read 4 KiB p50", "µs"),
    ("r64m", "read 64 MiB", "GB/s"),
    ("notify", "notify round trip p50", "µs"),
]


def batch_offsets():
    return [i * PIECE_STRIDE for i in range(PIECES)]


# ---- the target side: a process that registers a buffer and answers -------

def notifications_of(eng):
    """The engine's call that takes what arrived: ``notifications`` (named
    ``get_notifications`` before 0.2, which a before/after run may load)."""
    return getattr(eng, "notifications", None) or eng.get_notifications


def target(engine: str, conn) -> None:
    dst = np.zeros(LARGE + SMALL, dtype=np.uint8)
    dst[:] = 1  # fault every page in before anything is timed
    addr = dst.ctypes.data
    echo = None
    if engine == "ferry":
        import tensorferry

        eng = tensorferry.TransferEngine("local")
        eng.register_buffer(addr, dst.nbytes)
        conn.send({"session": eng.session_id, "addr": addr})
        take = notifications_of(eng)

        def echo(n: int) -> None:
            done = 0
            while done < n:
                for sender, message in take():
                    eng.notify(sender, message)
                    done += 1
    elif engine == "nixl":
        from nixl._api import nixl_agent, nixl_agent_config

        agent = nixl_agent("ferry-bench-target", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
        agent.register_memory([(addr, dst.nbytes, 0, "")], "DRAM")
        small = agent.get_xfer_descs([(addr + LARGE, SMALL, 0)], "DRAM")
        large = agent.get_xfer_descs([(addr, LARGE, 0)], "DRAM")
        batch = agent.get_xfer_descs([(addr + o, PIECE, 0) for o in batch_offsets()], "DRAM")
        eng = agent
        conn.send({
            "meta": agent.get_agent_metadata(),
            "small": agent.get_serialized_descs(small),
            "large": agent.get_serialized_descs(large),
            "batch": agent.get_serialized_descs(batch),
        })

        # Without its progress thread, UCX moves on only when called: the
        # target polls while it waits for a command, keeping what arrives.
        early = []

        def idle() -> None:
            while not conn.poll(0):
                for sender, messages in agent.get_new_notifs().items():
                    early.extend((sender, m) for m in messages)

        def echo(n: int) -> None:
            done = 0
            for sender, m in early:
                agent.send_notif(sender, m)
                done += 1
            early.clear()
            while done < n:
                for sender, messages in agent.get_new_notifs().items():
                    for m in messages:
                        agent.send_notif(sender, m)
                        done += 1
    elif engine == "mooncake":
        from mooncake.engine import TransferEngine

        eng = TransferEngine()
        if eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            conn.send({"error": "mooncake: initialize failed"})
            return
        eng.register_memory(addr, dst.nbytes)
        conn.send({"session": f"127.0.0.1:{eng.get_rpc_port()}", "addr": addr})
    while True:
        if engine == "nixl":
            idle()
        msg = conn.recv()
        if msg == "sha":
            conn.send(hashlib.sha256(dst[:LARGE].tobytes()).hexdigest())
        elif isinstance(msg, dict) and "meta" in msg:
            eng.add_remote_agent(msg["meta"])
            conn.send("ok")
        elif isinstance(msg, dict) and "echo" in msg:
            echo(msg["echo"])
            conn.send("echoed")
        else:
            break


# ---- the initiator side ---------------------------------------------------

class Initiator:
    """One engine's initiator: ``write(small)`` writes SMALL or LARGE bytes
    from ``src``, ``read(small)`` reads them into ``back``, ``batch()``
    posts the 64 writes and waits, ``ping()`` is a notification round trip
    (None where the engine has none)."""

    def __init__(self, engine: str, src: np.ndarray, back: np.ndarray, peer: dict, conn) -> None:
        self.ping = None
        addr, baddr = src.ctypes.data, back.ctypes.data
        offs = batch_offsets()
        if engine == "ferry":
            import tensorferry

            eng = tensorferry.TransferEngine("local")
            eng.register_buffer(addr, src.nbytes)
            eng.register_buffer(baddr, back.nbytes)
            session, dst = peer["session"], peer["addr"]
            write_sync, read_sync = eng.transfer_sync, eng.read_sync
            srcs = [addr + o for o in offs]
            dsts = [dst + o for o in offs]
            lens = [PIECE] * PIECES

            def write(small: bool) -> None:
                n = SMALL if small else LARGE
                if write_sync(session, addr, dst + (LARGE if small else 0), n) != 0:
                    raise RuntimeError(eng.last_error)

            def read(small: bool) -> None:
                n = SMALL if small else LARGE
                at = LARGE if small else 0
                if read_sync(session, baddr + at, dst + at, n) != 0:
                    raise RuntimeError(eng.last_error)

            def batch() -> None:
                with eng.post_write(session, srcs, dsts, lens) as t:
                    t.wait()

            take = notifications_of(eng)

            def ping() -> None:
                eng.notify(session, b"ping")
                while not take():
                    pass

            self.ping = ping
        elif engine == "nixl":
            from nixl._api import nixl_agent, nixl_agent_config

            agent = nixl_agent("ferry-bench-initiator", nixl_agent_config(enable_prog_thread=False, backends=["UCX"]))
            agent.register_memory([(addr, src.nbytes, 0, ""), (baddr, back.nbytes, 0, "")], "DRAM")
            name = agent.add_remote_agent(peer["meta"])
            conn.send({"meta": agent.get_agent_metadata()})
            assert conn.recv() == "ok"
            remote = {k: agent.deserialize_descs(peer[k]) for k in ("small", "large", "batch")}

            def local(base: int, pieces) -> object:
                return agent.get_xfer_descs([(base + o, n, 0) for o, n in pieces], "DRAM")

            handles = {
                ("WRITE", True): agent.initialize_xfer("WRITE", local(addr, [(0, SMALL)]), remote["small"], name),
                ("WRITE", False): agent.initialize_xfer("WRITE", local(addr, [(0, LARGE)]), remote["large"], name),
                ("READ", True): agent.initialize_xfer("READ", local(baddr, [(LARGE, SMALL)]), remote["small"], name),
                ("READ", False): agent.initialize_xfer("READ", local(baddr, [(0, LARGE)]), remote["large"], name),
                "batch": agent.initialize_xfer("WRITE", local(addr, [(o, PIECE) for o in offs]), remote["batch"], name),
            }

            def run(h) -> None:
                state = agent.transfer(h)
                while state == "PROC":
                    state = agent.check_xfer_state(h)
                if state != "DONE":
                    raise RuntimeError(f"nixl transfer: {state}")

            def write(small: bool) -> None:
                run(handles[("WRITE", small)])

            def read(small: bool) -> None:
                run(handles[("READ", small)])

            def batch() -> None:
                run(handles["batch"])

            def ping() -> None:
                agent.send_notif(name, b"ping")
                while not agent.get_new_notifs():
                    pass

            self.ping = ping
            eng = agent
        elif engine == "mooncake":
            from mooncake.engine import TransferEngine

            eng = TransferEngine()
            if eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
                raise RuntimeError("mooncake: initialize failed")
            eng.register_memory(addr, src.nbytes)
            eng.register_memory(baddr, back.nbytes)
            session, dst = peer["session"], peer["addr"]
            srcs = [addr + o for o in offs]
            dsts = [dst + o for o in offs]
            lens = [PIECE] * PIECES

            def write(small: bool) -> None:
                n = SMALL if small else LARGE
                if eng.transfer_sync_write(session, addr, dst + (LARGE if small else 0), n) != 0:
                    raise RuntimeError("mooncake transfer_sync_write failed")

            def read(small: bool) -> None:
                n = SMALL if small else LARGE
                at = LARGE if small else 0
                if eng.transfer_sync_read(session, baddr + at, dst + at, n) != 0:
                    raise RuntimeError("mooncake transfer_sync_read failed")

            def batch() -> None:
                b = eng.batch_transfer_async_write(session, srcs, dsts, lens)
                if b == 0 or eng.get_batch_transfer_status([b]) != 0:
                    raise RuntimeError("mooncake batch_transfer_async_write failed")

        self.eng = eng
        self.write, self.read, self.batch = write, read, batch


def available(engine: str) -> bool:
    module = {"ferry": "tensorferry", "nixl": "nixl._api", "mooncake": "mooncake.engine"}[engine]
    try:
        __import__(module)
        return True
    except Exception as e:  # ImportError, or a library that fails to load
        print(f"# {engine}: not available ({type(e).__name__}: {e}); left out", file=sys.stderr)
        return False


def p50_us(f, iters: int) -> float:
    for _ in range(min(50, iters)):
        f()
    lat = []
    for _ in range(iters):
        t = time.perf_counter_ns()
        f()
        lat.append(time.perf_counter_ns() - t)
    return statistics.median(lat) / 1000


def gbs(f, iters: int) -> float:
    f()
    rates = []
    for _ in range(iters):
        t = time.perf_counter()
        f()
        rates.append(LARGE / (time.perf_counter() - t) / 1e9)
    return statistics.median(rates)


def measure(ini, scale: float, echo) -> tuple:
    """Every case the initiator has, and the failures of those that
    failed (left out of the table); ``echo(n)`` has the target answer the
    next n notifications."""
    it = {k: max(1, int(v * scale)) for k, v in ITERS.items()}
    cases = {
        "w4k": lambda: p50_us(lambda: ini.write(True), it["small"]),
        "w64m": lambda: gbs(lambda: ini.write(False), it["large"]),
        "batch": lambda: p50_us(ini.batch, it["batch"]),
        "r4k": lambda: p50_us(lambda: ini.read(True), it["small"]),
        "r64m": lambda: gbs(lambda: ini.read(False), it["large"]),
    }
    if ini.ping is not None:
        n = it["notify"]

        def notify() -> float:
            echo(min(50, n) + n)
            return p50_us(ini.ping, n)

        cases["notify"] = notify
    out, failed = {}, {}
    for key, case in cases.items():
        try:
            out[key] = case()
        except Exception as e:  # one case's failure leaves the others
            failed[key] = f"{type(e).__name__}: {e}"
    return out, failed


def run(engine: str, scale: float, conn) -> None:
    """One engine's measurement, in a process of its own with a target
    process of its own, so that no other engine's threads (NIXL's progress
    thread, Mooncake's workers) share the cores while it runs."""
    src = np.random.default_rng(5).integers(0, 256, LARGE + SMALL, dtype=np.uint8)
    back = np.ones(LARGE + SMALL, dtype=np.uint8)
    if engine == "memcpy":
        dst = np.ones(LARGE + SMALL, dtype=np.uint8)
        offs = batch_offsets()
        mine, theirs = socket.socketpair()
        echoer = os.fork()
        if echoer == 0:
            mine.close()
            bare_echo(theirs)
        theirs.close()
        mine.setblocking(False)

        class Copy:
            def ping(self) -> None:
                mine.send(b"ping")
                while True:
                    try:
                        if mine.recv(64):
                            return
                    except BlockingIOError:
                        pass

            def write(self, small: bool) -> None:
                if small:
                    np.copyto(dst[LARGE:], src[LARGE:])
                else:
                    np.copyto(dst[:LARGE], src[:LARGE])

            def read(self, small: bool) -> None:
                if small:
                    np.copyto(back[LARGE:], dst[LARGE:])
                else:
                    np.copyto(back[:LARGE], dst[:LARGE])

            def batch(self) -> None:
                for o in offs:
                    np.copyto(dst[o:o + PIECE], src[o:o + PIECE])

        result, failed = measure(Copy(), scale, lambda n: None)
        mine.close()
        os.waitpid(echoer, 0)
        conn.send({"result": result, "failed": failed, "checked": True})
        return
    ctx = mp.get_context("spawn")
    here, there = ctx.Pipe()
    proc = ctx.Process(target=target, args=(engine, there), daemon=True)
    proc.start()
    info = here.recv()
    if "error" in info:
        conn.send({"error": info["error"]})
        return

    def echo(n: int) -> None:
        here.send({"echo": n})

    ini = Initiator(engine, src, back, info, here)
    result, failed = measure(ini, scale, echo)
    if "notify" in result:
        assert here.recv() == "echoed"
    here.send("sha")
    want = hashlib.sha256(src[:LARGE].tobytes()).hexdigest()
    checked = here.recv() == want
    if "r64m" in result:
        checked = checked and hashlib.sha256(back[:LARGE].tobytes()).hexdigest() == want
    here.send("exit")
    proc.join(timeout=10)
    conn.send({"result": result, "failed": failed, "checked": checked})


def bare_echo(s: socket.socket) -> None:
    """The floor's other side (a forked process): answers each message on
    `s` as the engines' targets answer notifications, polling without
    waiting, until `s` closes."""
    s.setblocking(False)
    while True:
        try:
            got = s.recv(64)
        except BlockingIOError:
            continue
        if not got:
            os._exit(0)
        s.send(got)


def table(row: dict) -> None:
    engines = [k for k in row if k != "round"]
    others = [e for e in engines if e not in ("memcpy", "nixl")]
    head = f"  {'case':<24} {'unit':<5}" + "".join(f" {e:>10}" for e in engines)
    if "nixl" in row:
        head += "".join(f" {e + '/nixl':>14}" for e in others)
    print(head)
    for key, label, unit in CASES:
        line = f"  {label:<24} {unit:<5}"
        for e in engines:
            v = row[e].get(key)
            line += f" {v:>10.2f}" if v is not None else f" {'-':>10}"
        if "nixl" in row:
            for e in others:
                a, b = row[e].get(key), row["nixl"].get(key)
                line += f" {a / b:>14.2f}" if a is not None and b else f" {'-':>14}"
        print(line)
    print("  (µs: lower is faster, a ratio below 1 is faster than NIXL; GB/s: a ratio above 1 is;")
    print("   memcpy: numpy's copy of the same bytes, and for the round trip a bare Unix-socket ping-pong")
    print("   between two processes polling as the engines' do: the floor)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--engines", default="ferry,nixl,mooncake")
    ap.add_argument("--scale", type=float, default=1.0, help="iterations of each case, times this")
    ap.add_argument("--json", action="store_true", help="one JSON line per round")
    args = ap.parse_args()
    engines = [e for e in args.engines.split(",") if available(e)]
    ctx = mp.get_context("spawn")
    it = {k: max(1, int(v * args.scale)) for k, v in ITERS.items()}
    print(f"# {os.cpu_count()} cpus; medians of {it['small']} (4 KiB), {it['large']} (64 MiB), "
          f"{it['batch']} (batches), {it['notify']} (round trips); each round runs every engine "
          f"in turn, each in fresh processes (initiator and target)")
    for r in range(1, args.rounds + 1):
        row = {"round": r}
        for e in ["memcpy"] + engines:
            here, there = ctx.Pipe()
            proc = ctx.Process(target=run, args=(e, args.scale, there))
            proc.start()
            try:
                out = here.recv()
            except EOFError:
                out = {"error": f"its process ended (exit status {proc.exitcode})"}
            proc.join(timeout=30)
            if "error" in out:
                print(f"# {e}: {out['error']}; left out", file=sys.stderr)
                continue
            if not out["checked"]:
                print(f"# {e}: WRONG BYTES in round {r}; left out", file=sys.stderr)
                continue
            for case, why in out["failed"].items():
                print(f"# {e}: {case} failed in round {r} ({why}); left out", file=sys.stderr)
            row[e] = out["result"]
        if args.json:
            print(json.dumps(row))
            continue
        print(f"\nround {r}")
        table(row)


if __name__ == "__main__":
    main()
