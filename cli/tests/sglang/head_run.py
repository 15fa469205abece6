#!/usr/bin/env python3
"""ferry instances under sglang's released head, driven as a user would.

Starts sglang 0.5.23's real ``DiffusionServer`` (from the PyPI wheel,
unmodified) on 127.0.0.1 with the endpoints ``sglang serve --disagg-role
server`` derives from its flags: the client frontend ROUTER at the
scheduler port P, the encoder, denoiser and decoder result endpoints at
P+1, P+2, P+3, and the instances' work endpoints as ``--encoder-urls``,
``--denoiser-urls`` and ``--decoder-urls`` list them. In front of it run
``ferry instance --workload sglang`` processes (one encoder, two
denoisers, one decoder; shared-memory data plane), and a client on the
frontend sends ``pickle([Req])`` per request, as sglang's HTTP server does.

Every reply must carry the decoder's ``output`` tensor, byte for byte what
ferry's decoder makes for that request id (each role checked every byte it
received; their summaries say so). With ``--kill-denoiser-after N`` one
denoiser is SIGKILLed once N replies came back: the survivors go on, and
the requests the dead one held end at the head as failures (its timeout).

Prints one JSON line with the figures and exits 0 if every check held.
"""

import argparse
import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time

import zmq


def free_ports(n):
    """n distinct ports free on 127.0.0.1 (bound then released)."""
    socks, ports = [], []
    for _ in range(n):
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        socks.append(s)
        ports.append(s.getsockname()[1])
    for s in socks:
        s.close()
    return ports


def fnv1a(data: bytes) -> int:
    h = 0xCBF29CE484222325
    for b in data:
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def mix(z: int) -> int:
    # splitmix64's finalizer, as ferry's cli/src/pipeline/data.rs
    m = 0xFFFFFFFFFFFFFFFF
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & m
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & m
    return z ^ (z >> 31)


def expected_output(request_id: str, length: int, tensor: int = 7) -> bytes:
    """What ferry's decoder returns for request_id (data.rs `fill`)."""
    n = fnv1a(request_id.encode())
    words = (length + 7) // 8
    out = b"".join(
        mix((n << 40 & 0xFFFFFFFFFFFFFFFF) ^ (tensor << 32) ^ i).to_bytes(8, "little")
        for i in range(words)
    )
    return out[:length]


class Instance:
    """One ferry instance process; its stdout JSON lines are collected."""

    def __init__(self, ferry, role, name, head_port, work, timeout):
        offset = {"encoder": 1, "denoiser": 2, "decoder": 3}[role]
        cmd = [
            ferry, "instance", "--workload", "sglang", "--role", role,
            "--name", name, "--control", "zmq",
            "--coordinator", f"tcp://127.0.0.1:{head_port + offset}",
            "--endpoint", work, "--head-timeout", str(timeout),
            "--exit-on-stdin-close",
        ]
        self.name = name
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        self.lines = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self):
        for line in self.proc.stdout:
            line = line.strip()
            if line:
                self.lines.append(json.loads(line))

    def event(self, name):
        return next((e for e in self.lines if e.get("event") == name), None)

    def wait_for(self, name, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            e = self.event(name)
            if e is not None:
                return e
            if self.proc.poll() is not None:
                self.reader.join(1)
                raise RuntimeError(f"{self.name} exited {self.proc.returncode}: {self.lines}")
            time.sleep(0.02)
        raise RuntimeError(f"{self.name}: no {name} within {timeout}s: {self.lines}")

    def finish(self):
        """Closes stdin (a stop, with --exit-on-stdin-close) and returns the
        summary."""
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(30)
        self.reader.join(5)
        return self.event("summary")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ferry", required=True, help="the ferry binary")
    ap.add_argument("--requests", type=int, default=32)
    ap.add_argument("--head-timeout", type=float, default=60.0)
    ap.add_argument("--kill-denoiser-after", type=int, default=0)
    ap.add_argument("--window", type=int, default=8, help="client requests in flight")
    args = ap.parse_args()

    # Imported here so that --help works without the environment.
    import torch
    from sglang.multimodal_gen.configs.sample.sampling_params import SamplingParams
    from sglang.multimodal_gen.runtime.disaggregation.orchestrator import DiffusionServer
    from sglang.multimodal_gen.runtime.pipelines_core.schedule_batch import Req

    head, w_enc, w_d0, w_d1, w_dec = free_ports(5)
    # P+1..P+3 must be free too: the head binds them.
    while True:
        probe = free_ports(1)[0]
        try:
            for k in range(4):
                s = socket.socket()
                s.bind(("127.0.0.1", probe + k))
                s.close()
            head = probe
            break
        except OSError:
            continue
    ep = lambda p: f"tcp://127.0.0.1:{p}"  # noqa: E731
    server = DiffusionServer(
        frontend_endpoint=ep(head),
        encoder_work_endpoints=[ep(w_enc)],
        denoiser_work_endpoints=[ep(w_d0), ep(w_d1)],
        decoder_work_endpoints=[ep(w_dec)],
        encoder_result_endpoint=ep(head + 1),
        denoiser_result_endpoint=ep(head + 2),
        decoder_result_endpoint=ep(head + 3),
        timeout_s=args.head_timeout,
    )
    server.start()
    if not server.wait_ready(30):
        raise SystemExit("the head did not bind its sockets")

    t = args.head_timeout
    insts = [
        Instance(args.ferry, "encoder", "encoder-0", head, ep(w_enc), t),
        Instance(args.ferry, "denoiser", "denoiser-0", head, ep(w_d0), t),
        Instance(args.ferry, "denoiser", "denoiser-1", head, ep(w_d1), t),
        Instance(args.ferry, "decoder", "decoder-0", head, ep(w_dec), t),
    ]
    failures = []
    replies = {}
    killed = None
    try:
        for i in insts:
            i.wait_for("registered", 30)
        # The head registers each instance once (it acknowledges none).
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            st = server.get_stats()
            if (st["encoder_peers"], st["denoiser_peers"], st["decoder_peers"]) == (1, 2, 1):
                break
            time.sleep(0.05)
        else:
            raise RuntimeError(f"the head did not register every instance: {server.get_stats()}")

        ctx = zmq.Context()
        client = ctx.socket(zmq.DEALER)
        client.connect(ep(head))
        sent = 0
        t0 = time.monotonic()
        ids = [f"req-{k:04d}" for k in range(args.requests)]
        limit = time.monotonic() + args.head_timeout * 2 + 60
        while len(replies) < args.requests and time.monotonic() < limit:
            while sent < args.requests and sent - len(replies) < args.window:
                req = Req(sampling_params=SamplingParams(prompt=f"prompt {sent}"))
                req.request_id = ids[sent]
                # As a REQ socket frames it: an empty delimiter, then the payload.
                client.send_multipart([b"", pickle.dumps([req])])
                sent += 1
            if client.poll(100):
                _, payload = client.recv_multipart()
                out = pickle.loads(payload)
                rid = None
                err = getattr(out, "error", None)
                tensor = getattr(out, "output", None)
                if tensor is not None:
                    raw = tensor.contiguous().view(torch.uint8).numpy().tobytes()
                    rid = next(
                        (r for r in ids if r not in replies and expected_output(r, len(raw)) == raw),
                        None,
                    )
                    if rid is None:
                        failures.append("an output that matches no request's bytes")
                        continue
                    replies[rid] = ("ok", list(tensor.shape))
                else:
                    rid = next((r for r in ids if r not in replies and r in (err or "")), None)
                    replies[rid or f"?{len(replies)}"] = ("error", err)
                if (
                    args.kill_denoiser_after
                    and killed is None
                    and len(replies) >= args.kill_denoiser_after
                ):
                    killed = insts[2]
                    killed.proc.send_signal(signal.SIGKILL)
                    killed.proc.wait(10)
        elapsed = time.monotonic() - t0
        client.close(0)
        ctx.term()
        # A staged slot waits out the head's timeout (scaled) before it is
        # given up; let it, so the summaries can show nothing held.
        if killed is not None:
            time.sleep(args.head_timeout * 1.1 + 2)
    finally:
        summaries = {}
        for i in insts:
            if i is killed:
                continue
            try:
                summaries[i.name] = i.finish()
            except Exception as e:  # noqa: BLE001
                failures.append(f"{i.name}: {e}")
        server.stop()

    ok = [r for r, (kind, _) in replies.items() if kind == "ok"]
    errors = {r: v for r, (kind, v) in replies.items() if kind == "error"}
    if len(replies) != args.requests:
        failures.append(f"{len(replies)} of {args.requests} requests answered")
    for name, s in summaries.items():
        if s is None:
            failures.append(f"{name} printed no summary")
            continue
        if s["mismatches"] or s["errors"]:
            failures.append(f"{name}: {s['mismatches']} mismatches, {s['errors']} errors")
        if s["requests_held"] != 0 or s["live_slots"] != s["prealloc_slots"]:
            failures.append(f"{name} still holds slots: {s}")
    enc = summaries.get("encoder-0") or {}
    dec = summaries.get("decoder-0") or {}
    if killed is None:
        if len(ok) != args.requests:
            failures.append(f"only {len(ok)} of {args.requests} outputs: {errors}")
        if enc.get("staged") != args.requests or dec.get("verified") != args.requests:
            failures.append(f"encoder staged {enc.get('staged')}, decoder verified {dec.get('verified')}")
    else:
        survivor = summaries.get("denoiser-0") or {}
        if not errors:
            failures.append("no request failed although a denoiser was killed")
        if not all("timeout" in (e or "") or "error" in (e or "") for e in errors.values()):
            failures.append(f"failures without a reason: {errors}")
        if survivor.get("verified", 0) <= 0:
            failures.append("the surviving denoiser verified nothing")
        if len(ok) <= args.kill_denoiser_after:
            failures.append(f"nothing completed after the kill ({len(ok)} outputs)")
    result = {
        "requests": args.requests,
        "outputs": len(ok),
        "failed": len(errors),
        "killed": killed.name if killed else None,
        "seconds": round(elapsed, 3),
        "head": {k: v for k, v in server.get_stats().items() if k.endswith("_peers")},
        "summaries": summaries,
        "failures": failures,
    }
    print(json.dumps(result), flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
