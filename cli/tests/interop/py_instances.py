"""An encoder and a decoder written with the seed's message classes and
pyzmq, around a ferry coordinator and a ferry denoiser. The encoder's data
plane writes each request straight into the ferry denoiser's shared-memory
pool (mapping the object its session id names); the decoder owns a
shared-memory pool of its own, which the ferry denoiser writes into, offers
one preallocated slot (fast path) and answers transfer_alloc for the rest
(slow path), and checks every byte it receives.

usage: py_instances.py N ENC_RESULTS DEC_RESULTS WORK_DIR
"""

import dataclasses
import mmap
import os
import sys
import time

import zmq

from common import (
    LATENT_BYTES,
    LATENT_SHAPE,
    PROMPT_BYTES,
    PROMPT_SHAPE,
    align,
    denoised,
    emit,
    seed,
    tensor,
)

SLOT = 16 << 20
DEC_POOL = 4 * SLOT
DEC_BASE = 0x7E00_0000_0000  # the decoder's pool as peers address it


def shm_session(session_id):
    """(object name, base, length) of a ferry shared-memory session id."""
    rest = session_id[len("shm:"):]
    name, tail = rest.rsplit("@", 1)
    base, length = tail.split("+")
    return name, int(base, 16), int(length)


def main():
    n_requests = int(sys.argv[1])
    enc_results, dec_results, work_dir = sys.argv[2:5]
    ctx = zmq.Context()
    enc_work = f"ipc://{work_dir}/py-encoder.sock"
    dec_work = f"ipc://{work_dir}/py-decoder.sock"
    socks = {}
    for name, ep in (("encoder", enc_work), ("decoder", dec_work)):
        s = ctx.socket(zmq.PULL)
        s.bind(ep)
        socks[s] = name
    to_coord = {}
    for name, ep in (("encoder", enc_results), ("decoder", dec_results)):
        p = ctx.socket(zmq.PUSH)
        p.setsockopt(zmq.LINGER, 2000)
        p.connect(ep)
        to_coord[name] = p

    def send(who, msg):
        to_coord[who].send_multipart(seed.encode_transfer_msg(msg))

    # The decoder's pool: a shared-memory object ferry's transport can map,
    # named as ferry names its own (<prefix>-<pid>-<n>, the prefix the test
    # gives its processes), so that the test removes it should this process
    # be killed before it unlinks the object itself.
    prefix = os.environ.get("FERRY_SHM_PREFIX", "ferry")
    dec_name = f"/{prefix}-{os.getpid()}-0"
    fd = os.open(f"/dev/shm{dec_name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        counts = serve(n_requests, socks, send, fd, dec_name, enc_work, dec_work)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{dec_name}")
    emit(event="summary", **counts, requests=n_requests)
    for p in to_coord.values():
        p.close()
    ctx.term()


def serve(n_requests, socks, send, fd, dec_name, enc_work, dec_work):
    """Runs the encoder and the decoder until every request is checked (or
    two minutes pass); returns the counts."""
    os.ftruncate(fd, DEC_POOL)
    dec_pool = mmap.mmap(fd, DEC_POOL)
    dec_session = f"shm:{dec_name}@{DEC_BASE:x}+{DEC_POOL}"
    free_slots = [SLOT, 2 * SLOT, 3 * SLOT]  # for transfer_alloc
    prealloc_free = True
    reserved = {}  # request_id -> offset (slow path)

    send("encoder", seed.TransferRegisterMsg(role="encoder", session_id="py-encoder", work_endpoint=enc_work))
    send(
        "decoder",
        seed.TransferRegisterMsg(
            role="decoder",
            session_id=dec_session,
            pool_ptr=DEC_BASE,
            pool_size=DEC_POOL,
            work_endpoint=dec_work,
            preallocated_slots=[{"offset": 0, "size": SLOT, "slot_id": 0, "addr": DEC_BASE}],
        ),
    )
    acked = set()
    peers = {}  # denoiser pools mapped by the encoder's data plane
    staged = {}  # request_id -> bytes
    counts = dict(decoded=0, sent=0, verified=0, mismatches=0, fast=0, slow=0, bad=0)
    next_n = 0
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    data_size = align(align(PROMPT_BYTES) + LATENT_BYTES)
    manifest = {
        "prompt_embeds": [{"offset": 0, "shape": PROMPT_SHAPE, "dtype": "bfloat16"}],
        "latents": [{"offset": align(PROMPT_BYTES), "shape": LATENT_SHAPE, "dtype": "bfloat16"}],
    }
    deadline = time.time() + 120
    while counts["verified"] + counts["mismatches"] < n_requests and time.time() < deadline:
        # The encoder stages while fewer than 4 are in flight.
        while "encoder" in acked and next_n < n_requests and len(staged) < 4:
            n = next_n
            next_n += 1
            rid = f"py-{n}"
            staged[rid] = tensor(n, 0, PROMPT_BYTES) + tensor(n, 1, LATENT_BYTES)
            msg = dataclasses.asdict(
                seed.TransferStagedMsg(
                    request_id=rid, data_size=data_size, manifest=manifest, session_id="py-encoder"
                )
            )
            # What sglang's scheduler adds beside the seed's fields.
            msg["scalar_fields"] = {"n": n, "prompt": "a red fox", "t_commit_ns": time.time_ns()}
            send("encoder", msg)
        for s, _ in poller.poll(100):
            who = socks[s]
            frames = s.recv_multipart()
            if not seed.is_transfer_message(frames):
                counts["bad"] += 1
                continue
            m = seed.decode_transfer_msg(frames)
            counts["decoded"] += 1
            t = m["msg_type"]
            if t == seed.TransferMsgType.REGISTER_ACK:
                if m.get("accepted", True):
                    acked.add(who)
            elif who == "encoder" and t == seed.TransferMsgType.PUSH:
                rid = m["request_id"]
                data = staged.pop(rid)
                name, base, length = shm_session(m["dest_session_id"])
                if name not in peers:
                    f = os.open(f"/dev/shm{name}", os.O_RDWR)
                    peers[name] = mmap.mmap(f, length)
                    os.close(f)
                off = m["dest_addr"] - base
                assert 0 <= off and off + m["transfer_size"] <= length
                peers[name][off : off + len(data)] = data
                send("encoder", seed.TransferPushedMsg(request_id=rid))
                counts["sent"] += 1
            elif who == "encoder" and t == "transfer_abort":
                staged.pop(m["request_id"], None)
            elif who == "decoder" and t == seed.TransferMsgType.ALLOC:
                rid = m["request_id"]
                if not free_slots or m["data_size"] > SLOT:
                    send("decoder", {"msg_type": "transfer_alloc_reject", "request_id": rid,
                                     "session_id": dec_session, "retryable": True, "reason": "pool full"})
                    continue
                off = free_slots.pop()
                reserved[rid] = off
                counts["slow"] += 1
                send(
                    "decoder",
                    seed.TransferAllocatedMsg(
                        request_id=rid, session_id=dec_session, pool_ptr=DEC_BASE, slot_offset=off, slot_size=SLOT
                    ),
                )
            elif who == "decoder" and t == seed.TransferMsgType.READY:
                rid = m["request_id"]
                off = m["slot_offset"]
                if rid in reserved:
                    reserved.pop(rid)
                    release = lambda o=off: free_slots.append(o)  # noqa: E731
                else:
                    assert off == 0 and prealloc_free, m
                    prealloc_free = False
                    counts["fast"] += 1

                    def release():
                        nonlocal prealloc_free
                        prealloc_free = True

                n = m["scalar_fields"]["n"]
                entry = m["manifest"]["latents"]
                entry = entry[0] if isinstance(entry, list) else entry
                start = off + entry["offset"]
                ok = dec_pool[start : start + LATENT_BYTES] == denoised(n)
                counts["verified" if ok else "mismatches"] += 1
                release()
                send("decoder", seed.TransferDoneMsg(request_id=rid, error=None if ok else "byte mismatch"))
    for pool in peers.values():
        pool.close()
    dec_pool.close()
    return counts


if __name__ == "__main__":
    main()
