#!/usr/bin/env python3
"""ferry's vLLM-omni connector (``tensorferry.vllm_omni.FerryConnector``) beside
vLLM-omni's own ``SharedMemoryConnector`` (the default for an edge with no
connector), on the same payloads, in one run, from a sender process that
puts to a receiver process that gets, as two stages of vLLM-omni would:

- 1 MiB mixed: a dict of the tensors a stage hands on (a float32 latent,
  a bfloat16 hidden state, int64 token ids, a bool mask, a nested list with
  a float32 and an int32 tensor), scalars, strings, None and a little
  bytes: median latency of ``put``, of ``get`` (polled, and waited for
  with ``get_with_deadline``: each payload is sent twice, once each way,
  the order alternating) and of put and polled get together;
- 64 MiB: a float32 tensor of 64 MiB in a small dict: median ``put``,
  ``get`` and the two together, and the throughput, the payload's tensor
  bytes over put + get (the whole hand-over) and over get alone; and the
  first 64 MiB put, and put + get, of the run (a warm-up, left out of the
  medians): its region of the pool is one no payload used before, so
  this is what a fresh pool costs.

``get`` is timed from its first call until it returns the object, polled
in a tight loop as vLLM-omni's receive thread polls it, or by
``get_with_deadline`` called until it returns it (vLLM-omni's
SharedMemoryConnector's returns at once, as its ``get``); the metadata that
``put`` returns reaches the receiver over a pipe, as vLLM-omni's
orchestrator passes it on, and the receiver starts its clock when it has
it. Both connectors are created through vLLM-omni's factory
(``OmniConnectorFactory.create_connector``). Every payload, warm-ups
included, is made in the sender from a seed, made again in the receiver
from the same seed and compared with what ``get`` returned (dtypes,
shapes, ``torch.equal``, every other value); a round in which a connector
delivers a wrong payload (or fails) leaves its figures out and says what
differed. ferry's connector is measured once its pool's pages are made
(it makes them in a thread from when it is made, as a stage loads its
model meanwhile). Received objects are dropped (and ferry's byte buffers
released) before the next put, and the sender cleans each key up once
the receiver has it.

Connectors take turns, round after round, each in fresh processes (a
sender and a receiver of its own; forked from a server that has imported
vLLM-omni once, as that import takes ~10 s of CPU); each round prints its
table, and the last table is the median of the rounds, because the
machines these run on are shared and noisy. Both processes run torch with
one intra-op thread, as vLLM's workers serve
(``set_torch_threads_for_runtime``); ``--torch-threads 0`` keeps torch's
default (one per core), with which, on a busy 2-core host, every
parallel tensor copy waits for a descheduled thread (a 1 MiB put of ferry,
six ``copy_`` calls, took ~14 ms instead of ~0.1 ms).

    pip install vllm==0.30.0 vllm-omni==0.30.0 ./python
    python3 bench/python/vllm_omni_connectors.py [--rounds 3] [--iters 50,10]
        [--connectors shm,ferry,nixl] [--pool-size 268435456] [--torch-threads 1]
        [--ferry-old SITE]

``nixl`` is vLLM-omni's own NixlConnector (vLLM's NIXL wrapper, UCX),
where NIXL is installed. ``--ferry-old SITE`` adds ``ferry-old``: the
``tensorferry`` package in the directory SITE (another build's
site-packages), run beside the one the interpreter imports, for before
and after figures from one run.

vLLM-omni's ``MooncakeTransferEngineConnector`` is left out: it cannot
start on a host without an NVIDIA GPU, as it pins its memory pool
(``torch.empty(...).pin_memory()``: "Found no NVIDIA driver on your
system"), even with ``memory_pool_device: cpu`` and the TCP protocol. The
run tries to create it through the factory once and prints what happened
(``--no-mooncake-check`` skips that); where ``mooncake-transfer-engine``
is not installed, the factory fails before the pool ("Mooncake not
available") and the run tries the pool's ``pin_memory()`` alone. This is a benchmark, not a test: it
asserts nothing about speed.
"""

import argparse
import json
import importlib.util
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

# vLLM logs at INFO on import in every process; keep its errors. Its
# import also starts two background Pythons (humming's CUDA kernel
# launcher and NVRTC builds, ~2.5 s of CPU each, failing without CUDA)
# unless told not to: they would share the cores with the measurements.
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("HUMMING_DISABLE_PARALLEL_BUILD", "1")

MiB = 1 << 20
FROM, TO = "0", "1"
#: A get that has not returned the object after this long fails.
GET_TIMEOUT_S = 60.0
#: Untimed (but checked) iterations before the timed ones, per size.
WARMUP = {"small": 3, "large": 1}

CONNECTORS = {
    "shm": "SharedMemoryConnector",
    "ferry": "FerryConnector",
    "nixl": "NixlConnector",
    "ferry-old": "FerryConnector",
}
#: The modules each needs (left out where one is missing).
NEEDS = {"shm": "vllm_omni", "ferry": "tensorferry.vllm_omni", "nixl": "nixl", "ferry-old": "vllm_omni"}

#: The figures, in the order they print: (key, label, unit); the speed-up
#: of a time is the other's over ferry's, of a rate ferry's over the other's.
FIGURES = [
    ("s_put", "1 MiB mixed: put p50", "µs"),
    ("s_get", "1 MiB mixed: get p50 (polled)", "µs"),
    ("s_get_dl", "1 MiB mixed: get p50 (deadline)", "µs"),
    ("s_pg", "1 MiB mixed: put+get p50", "µs"),
    ("l_put", "64 MiB: put p50", "ms"),
    ("l_get", "64 MiB: get p50", "ms"),
    ("l_pg", "64 MiB: put+get p50", "ms"),
    ("l_first_put", "64 MiB: first put (fresh)", "ms"),
    ("l_first_pg", "64 MiB: first put+get", "ms"),
    ("l_pg_rate", "64 MiB: size/(put+get)", "GB/s"),
    ("l_get_rate", "64 MiB: size/get", "GB/s"),
]


# ---- the payloads, made from a seed on both sides --------------------------

def payload(kind: str, seed: int):
    import torch

    g = torch.Generator().manual_seed(seed)
    if kind == "small":
        return {
            "latent": torch.randn(64, 16, 128, generator=g),  # float32, 512 KiB
            "hidden": torch.randn(256, 768, generator=g).to(torch.bfloat16),  # 384 KiB
            "ids": torch.randint(0, 151_936, (8192,), generator=g, dtype=torch.int64),  # 64 KiB
            "mask": torch.rand(8192, generator=g) < 0.5,  # bool, 8 KiB
            "request_id": f"chatcmpl-{seed:08x}",
            "step": seed,
            "temperature": 0.7 + seed / 1e6,
            "finished": bool(seed & 1),
            "stop_reason": None,
            "extra": [
                torch.randn(4, 1024, generator=g),  # 16 KiB
                {"codes": torch.randint(0, 4096, (16, 512), generator=g, dtype=torch.int32),  # 32 KiB
                 "speaker": "Chelsie", "lengths": [seed % 97, 512, 16]},
                "tail",
            ],
            "header": bytes(range(256)) * 4,  # 1 KiB
        }
    return {
        "audio": torch.rand(16 * MiB, generator=g),  # float32, 64 MiB
        "lengths": torch.randint(1, 1 << 20, (8,), generator=g, dtype=torch.int64),
        "sample_rate": 24_000,
        "request_id": f"chatcmpl-{seed:08x}",
        "finished": True,
    }


def tensor_bytes(obj) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return obj.nbytes
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def difference(want, got, path: str = "payload"):
    """Where ``got`` differs from ``want`` (a sentence), or None. Tensors by
    dtype, shape and ``torch.equal``; bytes also as a buffer with ``.tensor``
    (ferry's raw bytes); lists and tuples alike (msgpack makes lists of
    tuples); everything else by type and value."""
    import torch

    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path}: a {type(got).__name__}, not a tensor"
        if got.dtype != want.dtype or tuple(got.shape) != tuple(want.shape):
            return f"{path}: {got.dtype} {tuple(got.shape)}, not {want.dtype} {tuple(want.shape)}"
        if got.device.type != "cpu":
            got = got.cpu()
        if not torch.equal(got, want):
            return f"{path}: other values"
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict):
            return f"{path}: a {type(got).__name__}, not a dict"
        if set(got) != set(want):
            return f"{path}: keys {sorted(got)}, not {sorted(want)}"
        for k in want:
            d = difference(want[k], got[k], f"{path}[{k!r}]")
            if d:
                return d
        return None
    if isinstance(want, (list, tuple)):
        if not isinstance(got, (list, tuple)) or len(got) != len(want):
            return f"{path}: {type(got).__name__} {got!r:.60}, not a sequence of {len(want)}"
        for i, (w, x) in enumerate(zip(want, got)):
            d = difference(w, x, f"{path}[{i}]")
            if d:
                return d
        return None
    if isinstance(want, bytes) and hasattr(got, "tensor"):
        got = got.tensor.numpy().tobytes()
    if isinstance(want, bytes) and isinstance(got, bytes) and got != want:
        at = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        return f"{path}: {len(got)} bytes, not {len(want)}, first differing at {at}"
    if type(got) is not type(want) or got != want:
        return f"{path}: {got!r:.60}, not {want!r:.60}"
    return None


def release(obj) -> None:
    """Release ferry's byte buffers in a received object (its tensors are
    views, freed when the last reference goes)."""
    if isinstance(obj, dict):
        for v in obj.values():
            release(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            release(v)
    elif hasattr(obj, "release") and hasattr(obj, "tensor"):
        obj.release()


# ---- the processes ----------------------------------------------------------

def create(name: str, extra: dict, threads: int = 0):
    if threads:
        import torch

        torch.set_num_threads(threads)
    extra = dict(extra)
    old_site = extra.pop("old_site", None)
    if old_site is not None:
        # ferry-old: the tensorferry of another build, imported first.
        if "tensorferry" in sys.modules:
            raise RuntimeError("ferry-old: tensorferry was imported before its site could be put first")
        sys.path.insert(0, old_site)
    from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
    from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec

    cls = CONNECTORS[name]
    if name.startswith("ferry") and cls not in OmniConnectorFactory.list_registered_connectors():
        import tensorferry.vllm_omni

        tensorferry.vllm_omni.register()
    if old_site is not None:
        import tensorferry

        if not tensorferry.__file__.startswith(old_site):
            raise RuntimeError(f"ferry-old: imported {tensorferry.__file__}, not the one in {old_site}")
    conn = OmniConnectorFactory.create_connector(ConnectorSpec(name=cls, extra=extra))
    # ferry makes its pool's pages in a thread from the start (as a stage
    # loads its model): measured once they are made.
    until = time.monotonic() + 60
    while conn.health().get("pool_prefault_seconds", 0) is None and time.monotonic() < until:
        time.sleep(0.01)
    return conn


def receiver(name: str, extra: dict, threads: int, link) -> None:
    """Gets what the sender announces: ``(kind, seed, key, metadata)`` in,
    ``{"get_ns"} | {"wrong"} | {"error"}`` back, after checking the payload
    and dropping it."""
    try:
        conn = create(name, extra, threads)
    except Exception:
        link.send({"error": "receiver: creating the connector:\n" + traceback.format_exc()})
        return
    link.send({"ready": True})
    timeout_ns = int(GET_TIMEOUT_S * 1e9)
    while True:
        msg = link.recv()
        if msg is None:
            break
        kind, seed, key, meta, waits = msg
        try:
            get, clock = conn.get, time.perf_counter_ns
            t0 = clock()
            if waits:
                until = time.monotonic() + GET_TIMEOUT_S
                while True:
                    r = conn.get_with_deadline(FROM, TO, key, meta, deadline=until)
                    if r is not None or time.monotonic() >= until:
                        break
            else:
                while True:
                    r = get(FROM, TO, key, meta)
                    if r is not None or clock() - t0 > timeout_ns:
                        break
            dt = clock() - t0
            if r is None:
                raise TimeoutError(f"get({key!r}) returned None for {GET_TIMEOUT_S:.0f} s")
            got = r[0]
            del r
            wrong = difference(payload(kind, seed), got)
            release(got)
            del got
            link.send({"wrong": wrong} if wrong else {"get_ns": dt})
        except Exception:
            link.send({"error": f"receiver: get({key!r}):\n" + traceback.format_exc()})
    try:
        conn.close()
    except Exception:
        pass


def sender(name: str, extra: dict, threads: int, iters: dict, rnd: int, link, report) -> None:
    """Puts each payload, hands the metadata to the receiver, waits for its
    answer, cleans the key up; reports the put and get times per size (the
    1 MiB payloads twice: polled, and waited for by ``get_with_deadline``,
    in turns), and the first 64 MiB put and get."""
    out = {"put": {}, "get": {}, "get_dl": {}, "bytes": {}, "first": None}
    conn = None
    try:
        conn = create(name, extra, threads)
        ready = link.recv()
        if "error" in ready:
            report.send(ready)
            return
        for kind in ("small", "large"):
            puts, gets, gets_dl = [], [], []
            for i in range(WARMUP[kind] + iters[kind]):
                # The 1 MiB payloads both ways, in turns; the 64 MiB polled.
                ways = ((False, True) if i % 2 else (True, False)) if kind == "small" else (False,)
                for waits in ways:
                    seed = (rnd * 1000 + i) * 4 + 2 * waits + (kind == "large")
                    data = payload(kind, seed)
                    out["bytes"][kind] = tensor_bytes(data)
                    key = f"ferrybench-{os.getpid()}-{kind}-{i}-{int(waits)}"
                    t0 = time.perf_counter_ns()
                    ok, size, meta = conn.put(FROM, TO, key, data)
                    dt = time.perf_counter_ns() - t0
                    del data
                    if not ok:
                        report.send({"error": f"sender: put({key!r}) of the {kind} payload returned "
                                              f"{(ok, size, meta)!r:.300}"})
                        return
                    link.send((kind, seed, key, meta, waits))
                    ans = link.recv()
                    conn.cleanup(key)
                    if "get_ns" not in ans:
                        ans.setdefault("kind", kind)
                        report.send(ans)
                        return
                    if kind == "large" and out["first"] is None:
                        out["first"] = (dt, ans["get_ns"])
                    if i < WARMUP[kind]:
                        continue
                    if waits:
                        gets_dl.append(ans["get_ns"])
                    else:
                        puts.append(dt)
                        gets.append(ans["get_ns"])
            out["put"][kind], out["get"][kind], out["get_dl"][kind] = puts, gets, gets_dl
        report.send(out)
    except Exception:
        report.send({"error": "sender:\n" + traceback.format_exc()})
    finally:
        try:
            link.send(None)
        except Exception:
            pass
        if conn is not None:
            try:
                conn.close()
            except Exception:
                pass


def mooncake_check(report) -> None:
    """Creates vLLM-omni's Mooncake transfer-engine connector through the
    factory, CPU pool and TCP; says what happened."""
    extra = {"protocol": "tcp", "memory_pool_size": 64 * MiB, "memory_pool_device": "cpu"}
    try:
        from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
        from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec

        c = OmniConnectorFactory.create_connector(
            ConnectorSpec(name="MooncakeTransferEngineConnector", extra=extra))
        c.close()
        report.send(f"created with {extra} (not measured here)")
        return
    except Exception as e:
        said = f"{type(e).__name__}: {e}"
    if importlib.util.find_spec("mooncake") is None:
        # Without the package the connector fails before its pool; try
        # what its pool does, torch.empty(size).pin_memory().
        import torch

        try:
            torch.empty(extra["memory_pool_size"], dtype=torch.uint8).pin_memory()
            pin = "pin_memory() of its pool works here"
        except Exception as e:
            pin = f"its pool's pin_memory(): {type(e).__name__}: {str(e).split('. ')[0]}"
        said = f"mooncake-transfer-engine not installed ({said}); {pin}"
    report.send(said)


# ---- the coordinator --------------------------------------------------------

def run_pair(ctx, name: str, extra: dict, threads: int, iters: dict, rnd: int) -> dict:
    link_s, link_r = ctx.Pipe()
    rep_here, rep_there = ctx.Pipe(duplex=False)
    rx = ctx.Process(target=receiver, args=(name, extra, threads, link_r), daemon=True)
    tx = ctx.Process(target=sender, args=(name, extra, threads, iters, rnd, link_s, rep_there), daemon=True)
    rx.start()
    tx.start()
    for end in (link_s, link_r, rep_there):
        end.close()  # so that a process that dies is seen as EOF
    try:
        out = rep_here.recv() if rep_here.poll(600) else {"error": "no answer in 600 s"}
    except EOFError:
        out = {"error": f"the sender ended (exit status {tx.exitcode})"}
    for p in (tx, rx):
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()
    return out


def figures(out: dict) -> dict:
    f = {}
    for kind, p in (("small", "s"), ("large", "l")):
        puts, gets = out["put"].get(kind), out["get"].get(kind)
        if not puts:
            continue
        both = [a + b for a, b in zip(puts, gets)]
        unit = 1e3 if kind == "small" else 1e6
        f[f"{p}_put"] = statistics.median(puts) / unit
        f[f"{p}_get"] = statistics.median(gets) / unit
        f[f"{p}_pg"] = statistics.median(both) / unit
        if kind == "small":
            if out["get_dl"].get(kind):
                f["s_get_dl"] = statistics.median(out["get_dl"][kind]) / unit
        else:
            if out.get("first"):
                f["l_first_put"] = out["first"][0] / unit
                f["l_first_pg"] = sum(out["first"]) / unit
            n = out["bytes"][kind]
            f["l_pg_rate"] = statistics.median(n / t for t in both)  # bytes/ns = GB/s
            f["l_get_rate"] = statistics.median(n / t for t in gets)
    return f


def table(row: dict, names: list) -> None:
    others = [n for n in names if n != "ferry"] if "ferry" in names else []
    head = f"  {'figure':<31} {'unit':<5}" + "".join(f" {n:>10}" for n in names)
    print(head + "".join(f" {'vs ' + n:>13}" for n in others))
    for key, label, unit in FIGURES:
        line = f"  {label:<31} {unit:<5}"
        for n in names:
            v = row.get(n, {}).get(key)
            line += f" {v:>10.2f}" if v is not None else f" {'-':>10}"
        for n in others:
            a, b = row.get("ferry", {}).get(key), row.get(n, {}).get(key)
            if a and b:
                line += f" {(a / b if unit == 'GB/s' else b / a):>12.2f}x"
            else:
                line += f" {'-':>13}"
        print(line)
    if others:
        print("  (vs X: X's time over ferry's, ferry's GB/s over X's; above 1, ferry is faster)")


def leftovers() -> list:
    try:
        return [f for f in os.listdir("/dev/shm") if "ferrybench-" in f]
    except OSError:
        return []


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", default="50,10", help="timed iterations: 1 MiB,64 MiB")
    ap.add_argument("--connectors", default="shm,ferry,nixl")
    ap.add_argument("--ferry-old", metavar="SITE",
                    help="also run ferry-old: the tensorferry package in SITE (another build's site-packages)")
    ap.add_argument("--pool-size", type=int, default=256 * MiB, help="FerryConnector's pool_size (bytes)")
    ap.add_argument("--backend", default="local", help="FerryConnector's backend")
    ap.add_argument("--torch-threads", type=int, default=1,
                    help="torch's intra-op threads in the sender and receiver (0: torch's default)")
    ap.add_argument("--no-mooncake-check", action="store_true")
    ap.add_argument("--json", action="store_true",
                    help="also print the median of the rounds as one JSON line, last (bench/python/latency.py reads it)")
    args = ap.parse_args()
    small, large = (int(x) for x in args.iters.split(","))
    iters = {"small": small, "large": large}
    extras = {"shm": {}, "nixl": {}, "ferry": {"backend": args.backend, "pool_size": args.pool_size}}
    wanted = args.connectors.split(",")
    if args.ferry_old:
        extras["ferry-old"] = {**extras["ferry"], "old_site": os.path.abspath(args.ferry_old)}
        if "ferry-old" not in wanted:
            wanted.insert(wanted.index("ferry") + 1 if "ferry" in wanted else len(wanted), "ferry-old")

    names = []
    for n in wanted:
        if n not in CONNECTORS or (n == "ferry-old" and not args.ferry_old):
            sys.exit(f"unknown connector {n!r} (known: {', '.join(CONNECTORS)}; ferry-old with --ferry-old)")
        module = NEEDS[n]
        try:
            found = importlib.util.find_spec(module) is not None
        except Exception:  # the parent package fails to import
            found = False
        if found:
            names.append(n)
        else:
            print(f"# {n}: {module} not installed; left out", file=sys.stderr)
    if not names:
        sys.exit("no connector to measure")

    # Fresh processes per round and connector, forked from a server that
    # has imported vLLM-omni (and torch) once.
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "vllm_omni.distributed.omni_connectors.factory"])
    before = set(leftovers())

    if not args.no_mooncake_check:
        here, there = ctx.Pipe(duplex=False)
        p = ctx.Process(target=mooncake_check, args=(there,))
        p.start()
        there.close()
        try:
            said = here.recv() if here.poll(300) else "no answer in 300 s"
        except EOFError:
            said = f"its process ended (exit status {p.exitcode})"
        p.join(timeout=30)
        if p.is_alive():
            p.kill()
            p.join()
        print(f"# MooncakeTransferEngineConnector: {said}; left out")

    print(f"# {os.cpu_count()} cpus; medians of {small} (1 MiB mixed) and {large} (64 MiB) "
          f"hand-overs after {WARMUP['small']} and {WARMUP['large']} warm-ups; each round runs "
          f"every connector in turn, each in fresh processes (sender and receiver); torch "
          f"intra-op threads: {args.torch_threads or 'torch default'}")
    rows = []
    for r in range(1, args.rounds + 1):
        row = {}
        for n in (names if r % 2 else names[::-1]):
            out = run_pair(ctx, n, extras[n], args.torch_threads, iters, r)
            if "error" in out:
                print(f"# {n}: failed in round {r}; left out:\n{out['error']}", file=sys.stderr)
                continue
            if "wrong" in out:
                print(f"# {n}: WRONG PAYLOAD ({out['kind']}) in round {r}: {out['wrong']}; left out",
                      file=sys.stderr)
                continue
            row[n] = figures(out)
        rows.append(row)
        print(f"\nround {r}")
        table(row, names)
    med = {}
    for n in names:
        for key, _, _ in FIGURES:
            vals = [row[n][key] for row in rows if key in row.get(n, {})]
            if vals:
                med.setdefault(n, {})[key] = statistics.median(vals)
    if len(rows) > 1:
        print(f"\nmedian of {len(rows)} rounds")
        table(med, names)
    if args.json:
        print(json.dumps(med))
    stale = sorted(set(leftovers()) - before)
    if stale:
        print(f"# left in /dev/shm by the connectors (removed): {', '.join(stale)}", file=sys.stderr)
        for f in stale:
            try:
                os.remove(os.path.join("/dev/shm", f))
            except OSError:
                pass


if __name__ == "__main__":
    main()
