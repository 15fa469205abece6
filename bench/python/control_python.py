"""The control-plane exchange of `ferry bench --control zmq`, done by the
seed's Python (protocol.py, unmodified) with pyzmq: a client sends an
encoded transfer_push, an echo process decodes it and answers with an
encoded transfer_pushed, which the client decodes. Round trips one at a
time, then a burst of one-way transfer_done messages the echo process
decodes and counts.

usage: control_python.py SECONDS          (prints JSON for ipc and tcp)
       control_python.py echo LISTEN REPLY_TO  (the echo process)
"""

import dataclasses
import json
import subprocess
import os
import socket
import sys
import tempfile
import time

import zmq

sys.path.insert(0, os.environ.get("FERRY_SEED_DIR", os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "seed")))
import protocol as seed  # noqa: E402

PUSH = seed.TransferPushMsg(
    request_id="", dest_session_id="shm:/ferry-1234-0@7f3a5c000000+1073741824",
    dest_addr=0x7F3A5C000000 + (16 << 20), transfer_size=13871104,
)


def echo(listen, reply_to):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(listen)
    push = ctx.socket(zmq.PUSH)
    push.connect(reply_to)
    counted = 0
    while True:
        frames = pull.recv_multipart()
        if not seed.is_transfer_message(frames):
            continue
        m = seed.decode_transfer_msg(frames)
        if m["msg_type"] != seed.TransferMsgType.PUSH:
            counted += 1
            continue
        rid = m["request_id"]
        if rid == "stop":
            break
        if rid == "flush":
            rid, counted = str(counted), 0
        push.send_multipart(seed.encode_transfer_msg(seed.TransferPushedMsg(request_id=rid)))
    push.close(linger=1000)
    pull.close(linger=0)
    ctx.term()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def measure(transport, seconds):
    pid = os.getpid()
    if transport == "ipc":
        tmp = tempfile.gettempdir()
        mine, theirs = f"ipc://{tmp}/ferry-pybench-{pid}-client.sock", f"ipc://{tmp}/ferry-pybench-{pid}-echo.sock"
    else:
        mine, theirs = f"tcp://127.0.0.1:{free_port()}", f"tcp://127.0.0.1:{free_port()}"
    p = subprocess.Popen([sys.executable, __file__, "echo", theirs, mine])
    try:
        return exchange(p, mine, theirs, seconds)
    finally:
        # Whatever happened, the echo process and the ipc files go.
        if p.poll() is None:
            p.kill()
            p.wait()
        for ep in (mine, theirs):
            if ep.startswith("ipc://") and os.path.exists(ep[len("ipc://"):]):
                os.unlink(ep[len("ipc://"):])


def exchange(p, mine, theirs, seconds):
    ctx = zmq.Context()
    pull = ctx.socket(zmq.PULL)
    pull.bind(mine)
    push = ctx.socket(zmq.PUSH)
    push.connect(theirs)

    def send(rid):
        msg = dataclasses.replace(PUSH, request_id=rid)
        push.send_multipart(seed.encode_transfer_msg(msg))

    def reply(timeout_ms):
        if pull.poll(timeout_ms):
            return seed.decode_transfer_msg(pull.recv_multipart())["request_id"]
        return None

    while True:
        send("hello")
        if reply(200) is not None:
            break
    # Hellos sent while the echo process started are answered late: their
    # replies must not be taken for the first round trip's.
    while reply(200) is not None:
        pass
    ids = [f"req-{i}" for i in range(1000)]
    rtts = []
    t_end = time.perf_counter() + seconds
    i = 0
    while time.perf_counter() < t_end:
        rid = ids[i % 1000]
        i += 1
        t0 = time.perf_counter_ns()
        send(rid)
        got = reply(5000)
        assert got == rid, (got, rid)
        rtts.append(time.perf_counter_ns() - t0)
    rtts.sort()
    done = seed.encode_transfer_msg(seed.TransferDoneMsg(request_id="one-way"))
    t0 = time.perf_counter()
    sent = 0
    while time.perf_counter() - t0 < seconds:
        for _ in range(1000):
            push.send_multipart(done)
            sent += 1
    send("flush")
    counted = int(reply(60000))
    elapsed = time.perf_counter() - t0
    assert counted == sent, (counted, sent)
    send("stop")
    p.wait(timeout=30)
    push.close(linger=1000)
    pull.close()
    ctx.term()
    pct = lambda q: rtts[round((len(rtts) - 1) * q)] / 1e3  # noqa: E731
    return {"round_trips": len(rtts), "p50_us": pct(0.5), "p99_us": pct(0.99), "messages_per_second": counted / elapsed}


if __name__ == "__main__":
    if sys.argv[1:2] == ["echo"]:
        echo(sys.argv[2], sys.argv[3])
        sys.exit(0)
    secs = float(sys.argv[1]) if len(sys.argv) > 1 else 2.0
    print(json.dumps({t: measure(t, secs) for t in ("ipc", "tcp")}))
