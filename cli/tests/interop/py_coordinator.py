"""A coordinator written with the seed's message classes and pyzmq, in
sglang's socket layout: one PULL per role for results, a PUSH to each
instance's work endpoint. It relays N requests encoder → denoiser → decoder
between ferry instances, taking a receiver's preallocated slot when one is
free (fast path) and asking with transfer_alloc otherwise (slow path).
Every message is read with the seed's decode_transfer_msg and written with
its encode_transfer_msg.

usage: py_coordinator.py N ENC_RESULTS DEN_RESULTS DEC_RESULTS
"""

import sys
import time

import zmq

from common import emit, seed

ROLES = ["encoder", "denoiser", "decoder"]


def main():
    n_requests = int(sys.argv[1])
    ctx = zmq.Context()
    pulls = {}
    for role, ep in zip(ROLES, sys.argv[2:5]):
        s = ctx.socket(zmq.PULL)
        s.bind(ep)
        pulls[s] = role
    pushes = {}
    members = {r: [] for r in ROLES}  # role -> [member]
    by_session = {}
    transfers = {}  # (request_id, leg) -> transfer
    rr = {r: 0 for r in ROLES}
    counts = dict(decoded=0, delivered=0, failed=0, fast=0, slow=0, messages=0, bad=0)

    def send(endpoint, msg):
        if endpoint not in pushes:
            p = ctx.socket(zmq.PUSH)
            p.setsockopt(zmq.LINGER, 2000)
            p.connect(endpoint)
            pushes[endpoint] = p
        pushes[endpoint].send_multipart(seed.encode_transfer_msg(msg))

    def push(t, dest_addr):
        send(
            t["sender"]["endpoint"],
            seed.TransferPushMsg(
                request_id=t["id"],
                dest_session_id=t["receiver"]["session_id"],
                dest_addr=dest_addr,
                transfer_size=t["data_size"],
            ),
        )

    poller = zmq.Poller()
    for s in pulls:
        poller.register(s, zmq.POLLIN)
    emit(event="ready")
    deadline = time.time() + 120
    while counts["delivered"] + counts["failed"] < n_requests and time.time() < deadline:
        for s, _ in poller.poll(200):
            role = pulls[s]
            frames = s.recv_multipart()
            if not seed.is_transfer_message(frames):
                continue
            try:
                m = seed.decode_transfer_msg(frames)
                counts["decoded"] += 1
            except ValueError:
                counts["bad"] += 1
                continue
            t = m["msg_type"]
            if t == seed.TransferMsgType.REGISTER:
                member = dict(
                    role=role,
                    session_id=m["session_id"],
                    endpoint=m["work_endpoint"],
                    pool_ptr=m["pool_ptr"],
                    slots=[dict(s, free=True) for s in m["preallocated_slots"]],
                )
                members[role].append(member)
                by_session[m["session_id"]] = member
                send(
                    member["endpoint"],
                    {
                        "msg_type": seed.TransferMsgType.REGISTER_ACK,
                        "session_id": m["session_id"],
                        "role": role,
                        "accepted": True,
                        "error": None,
                    },
                )
            elif t == seed.TransferMsgType.STAGED:
                leg = ROLES.index(role)
                nxt = ROLES[leg + 1]
                pool = members[nxt]
                receiver = pool[rr[nxt] % len(pool)]
                rr[nxt] += 1
                tr = dict(
                    id=m["request_id"],
                    leg=leg,
                    data_size=m["data_size"],
                    manifest=m["manifest"],
                    scalar_fields=m.get("scalar_fields") or {},
                    sender=by_session[m["session_id"]],
                    receiver=receiver,
                    slot=None,
                )
                transfers[(tr["id"], leg)] = tr
                slot = next((x for x in receiver["slots"] if x["free"] and x["size"] >= tr["data_size"]), None)
                if slot is not None:
                    slot["free"] = False
                    tr["slot"] = slot
                    tr["slot_offset"] = slot["offset"]
                    counts["fast"] += 1
                    push(tr, slot["addr"])
                else:
                    counts["slow"] += 1
                    send(
                        receiver["endpoint"],
                        seed.TransferAllocMsg(request_id=tr["id"], data_size=tr["data_size"], source_role=role),
                    )
            elif t == seed.TransferMsgType.ALLOCATED:
                tr = transfers[(m["request_id"], ROLES.index(role) - 1)]
                tr["slot_offset"] = m["slot_offset"]
                push(tr, m["pool_ptr"] + m["slot_offset"])
            elif t == seed.TransferMsgType.PUSHED:
                tr = transfers[(m["request_id"], ROLES.index(role))]
                if m.get("success", True) is False:
                    counts["failed"] += 1
                    continue
                send(
                    tr["receiver"]["endpoint"],
                    seed.TransferReadyMsg(
                        request_id=tr["id"],
                        manifest=tr["manifest"],
                        slot_offset=tr["slot_offset"],
                        scalar_fields=tr["scalar_fields"],
                    ),
                )
            elif t == seed.TransferMsgType.DONE:
                tr = transfers.pop((m["request_id"], ROLES.index(role) - 1))
                if tr["slot"] is not None:
                    tr["slot"]["free"] = True
                if m.get("error"):
                    counts["failed"] += 1
                elif role == "decoder":
                    counts["delivered"] += 1
            else:
                counts["bad"] += 1
    emit(event="summary", **counts, in_flight=len(transfers))
    for p in pushes.values():
        p.close()
    ctx.term()


if __name__ == "__main__":
    main()
