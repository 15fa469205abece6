"""An encoder and a decoder that behave as sglang 0.5.23's role instances
do (its scheduler_mixin.py), written with the seed's message classes and
pyzmq, around a ferry coordinator and a ferry denoiser:

- each registers once and waits for no acknowledgement;
- the encoder's transfer_staged always carries scalar_fields (0.5.23's
  TransferStagedMsg), and its data plane writes each request straight into
  the ferry denoiser's shared-memory pool (mapping the object its session
  id names), then reports transfer_pushed;
- the decoder owns a shared-memory pool of its own, which the ferry
  denoiser writes into: one preallocated slot (fast path; it finds the slot
  by the _prealloc_slot_id the coordinator puts in scalar_fields, as
  sglang's receiver pops it) and transfer_alloc for the rest (slow path; an
  ALLOC without room is dropped, as sglang's is);
- the decoder checks every byte it receives and returns its result as
  sglang's tensor multipart (a JSON descriptor frame, then the output
  tensor's bytes) with the request id, not as transfer_done.

usage: py_instances.py N ENC_RESULTS DEC_RESULTS WORK_DIR
"""

import dataclasses
import json
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
# One preallocated slot and seven for transfer_alloc: room for every
# request the pipeline can have in flight to the decoder, and the one it
# holds, so that no ALLOC is dropped for want of a slot.
DEC_POOL = 8 * SLOT
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

    def send_frames(who, frames):
        to_coord[who].send_multipart(frames)

    # The decoder's pool: a shared-memory object ferry's transport can map,
    # named as ferry names its own (<prefix>-<pid>-<n>, the prefix the test
    # gives its processes), so that the test removes it should this process
    # be killed before it unlinks the object itself.
    prefix = os.environ.get("FERRY_SHM_PREFIX", "ferry")
    dec_name = f"/{prefix}-{os.getpid()}-0"
    fd = os.open(f"/dev/shm{dec_name}", os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    try:
        counts = serve(n_requests, socks, send, send_frames, fd, dec_name, enc_work, dec_work)
    finally:
        os.close(fd)
        os.unlink(f"/dev/shm{dec_name}")
    emit(event="summary", **counts, requests=n_requests)
    for p in to_coord.values():
        p.close()
    ctx.term()


def serve(n_requests, socks, send, send_frames, fd, dec_name, enc_work, dec_work):
    """Runs the encoder and the decoder until every request is checked (or
    100 s pass); returns the counts."""
    os.ftruncate(fd, DEC_POOL)
    dec_pool = mmap.mmap(fd, DEC_POOL)
    dec_session = f"shm:{dec_name}@{DEC_BASE:x}+{DEC_POOL}"
    free_slots = [k * SLOT for k in range(1, DEC_POOL // SLOT)]  # for transfer_alloc
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
    peers = {}  # denoiser pools mapped by the encoder's data plane
    staged = {}  # request_id -> bytes
    counts = dict(decoded=0, sent=0, verified=0, mismatches=0, fast=0, slow=0, bad=0, alloc_dropped=0, outputs=0)
    next_n = 0
    poller = zmq.Poller()
    for s in socks:
        poller.register(s, zmq.POLLIN)
    data_size = align(align(PROMPT_BYTES) + LATENT_BYTES)
    manifest = {
        "prompt_embeds": [{"offset": 0, "shape": PROMPT_SHAPE, "dtype": "bfloat16"}],
        "latents": [{"offset": align(PROMPT_BYTES), "shape": LATENT_SHAPE, "dtype": "bfloat16"}],
    }
    held = []  # delivered to the decoder, not yet let go of
    finish = result_sender(send_frames, counts)
    # Shorter than the test's wait for the summary, so that a request that
    # never ends shows in the counts rather than as a missing summary.
    deadline = time.time() + 100
    # A dropped ALLOC fails its request at the coordinator: it ends too.
    ended = lambda: counts["verified"] + counts["mismatches"] + counts["alloc_dropped"]  # noqa: E731
    while ended() < n_requests and time.time() < deadline:
        # The encoder stages while fewer than 4 are in flight.
        while next_n < n_requests and len(staged) < 4:
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
        events = poller.poll(100)
        for s, _ in events:
            who = socks[s]
            frames = s.recv_multipart()
            if not seed.is_transfer_message(frames):
                counts["bad"] += 1
                continue
            m = seed.decode_transfer_msg(frames)
            counts["decoded"] += 1
            t = m["msg_type"]
            if t == seed.TransferMsgType.REGISTER_ACK:
                # ferry's coordinator answers; sglang's instances never wait for it.
                continue
            if who == "encoder" and t == seed.TransferMsgType.PUSH:
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
            elif who == "decoder" and t == seed.TransferMsgType.ALLOC:
                rid = m["request_id"]
                if not free_slots or m["data_size"] > SLOT:
                    # sglang's receiver logs it and answers nothing.
                    counts["alloc_dropped"] += 1
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
                slot_id = m["scalar_fields"].pop("_prealloc_slot_id", None)
                if slot_id is None:
                    assert rid in reserved, m
                    reserved.pop(rid)
                    release = lambda o=off: free_slots.append(o)  # noqa: E731
                else:
                    assert slot_id == 0 and off == 0 and prealloc_free, m
                    prealloc_free = False
                    counts["fast"] += 1

                    def release():
                        nonlocal prealloc_free
                        prealloc_free = True

                n = m["scalar_fields"]["n"]
                entry = m["manifest"]["latents"]
                entry = entry[0] if isinstance(entry, list) else entry
                start = off + entry["offset"]
                got = dec_pool[start : start + LATENT_BYTES]
                ok = got == denoised(n)
                counts["verified" if ok else "mismatches"] += 1
                # The decoder's compute holds the slot until the next
                # request is in (or the line goes quiet), so the one behind
                # finds the preallocated slot taken and goes the ALLOC way.
                held.append((rid, ok, bytes(got[:4096]), release))
                while len(held) > 1:
                    finish(*held.pop(0))
        if not events:
            while held:
                finish(*held.pop(0))
    while held:
        finish(*held.pop(0))
    for pool in peers.values():
        pool.close()
    dec_pool.close()
    return counts


def result_sender(send_frames, counts):
    """The decoder's end of a request, as sglang's: let go of the slot, then
    return the result to the coordinator as a tensor multipart."""

    def finish(rid, ok, output, release):
        release()
        # The result, as sglang's send_tensors frames it: a small "output"
        # (the latents' first 4 KiB) or the error.
        scalars = {"request_id": rid}
        tensors = []
        descs = []
        if ok:
            tensors = [output]
            descs = [{"field_name": "output", "shape": [len(output)], "dtype": "uint8", "list_index": -1}]
        else:
            scalars["error"] = "byte mismatch"
        meta = json.dumps({"tensor_descriptors": descs, "scalar_fields": scalars}, separators=(",", ":"))
        send_frames("decoder", [meta.encode(), *tensors])
        counts["outputs"] += 1

    return finish


if __name__ == "__main__":
    main()
