"""A peer process for the tests: opens a tensorferry.TransferEngine, allocates and
registers memory of its own (numpy or torch), and answers the test's
commands (JSON lines on stdin, one JSON reply line each on stdout). It makes
no engine call to receive: peers write into and read from its memory on
their own. It reads notifications when told to (`watch`), checking, as each
arrives, the bytes it says were written.
"""

import hashlib
import json
import sys
import time

import numpy as np

import tensorferry
from pairs import pattern
from procs import reply


def watch(engine, bufs, n: int, name: str, seconds: float) -> list:
    """Reads notifications until `n` came (or `seconds` passed), as
    [sender, message (hex), check]: a message that is a JSON object naming
    `off`, `len` and `sha` is checked against the bytes of buffer `name`
    there the moment it is seen (check True or False); others get None."""
    got = []
    end = time.monotonic() + seconds
    while len(got) < n and time.monotonic() < end:
        for sender, message in engine.notifications():
            check = None
            try:
                said = json.loads(message)
            except ValueError:
                said = None
            if isinstance(said, dict) and "sha" in said:
                view = bufs[name][said["off"]:said["off"] + said["len"]]
                check = hashlib.sha256(view.tobytes()).hexdigest() == said["sha"]
            got.append([sender, message.hex(), check])
    return got


def main() -> None:
    spec = json.loads(sys.argv[1])
    engine = tensorferry.TransferEngine(spec["backend"], **spec.get("options", {}))
    bufs = {}
    keep = {}

    reply(ready=True, backend=engine.backend)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        try:
            if op == "alloc":
                if cmd.get("torch"):
                    import torch

                    t = torch.full((cmd["size"],), cmd.get("fill", 0), dtype=torch.uint8)
                    arr = t.numpy()
                    keep[cmd["name"]] = t
                else:
                    arr = np.full(cmd["size"], cmd.get("fill", 0), dtype=np.uint8)
                bufs[cmd["name"]] = arr
                engine.register_buffer(arr.ctypes.data, arr.nbytes)
                reply(addr=arr.ctypes.data, session=engine.session_id)
            elif op == "write":
                # Fill a buffer with a pattern, then write part of it to a peer.
                arr = bufs[cmd["name"]]
                rng = np.random.default_rng(cmd["seed"])
                arr[:] = rng.integers(0, 256, arr.nbytes, dtype=np.uint8)
                rc = engine.transfer_sync(cmd["to"], arr.ctypes.data + cmd["offset"], cmd["dst"], cmd["len"])
                reply(rc=rc, error=engine.last_error,
                      sha=hashlib.sha256(arr[cmd["offset"]:cmd["offset"] + cmd["len"]].tobytes()).hexdigest())
            elif op == "fill":
                arr = bufs[cmd["name"]]
                arr[:] = pattern(arr.nbytes, cmd["seed"])
                reply(sha=hashlib.sha256(arr.tobytes()).hexdigest())
            elif op == "watch":
                reply(got=watch(engine, bufs, cmd["n"], cmd.get("name", "pool"), cmd.get("seconds", 60)))
            elif op == "notify":
                for m in cmd["messages"]:
                    engine.notify(cmd["to"], bytes.fromhex(m))
                reply(ok=True)
            elif op == "sha":
                arr = bufs[cmd["name"]]
                view = arr[cmd.get("offset", 0):cmd.get("offset", 0) + cmd.get("len", arr.nbytes)]
                reply(sha=hashlib.sha256(view.tobytes()).hexdigest())
            elif op == "deregister":
                engine.deregister_buffer(bufs[cmd["name"]].ctypes.data)
                reply(ok=True, session=engine.session_id)
            elif op == "session":
                reply(session=engine.session_id)
            elif op == "exit":
                engine.close()
                reply(ok=True)
                return
            else:
                reply(error=f"unknown op {op}")
        except tensorferry.FerryError as e:
            reply(ferry_error=str(e), kind=e.kind)


if __name__ == "__main__":
    main()
