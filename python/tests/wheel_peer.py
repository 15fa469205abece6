"""One side of test_wheels.py's two-process transfer, run by the fresh
venv's interpreter from a directory outside the tree (test_wheels.py copies
this file there): it uses nothing but the installed wheels and the standard
library (no numpy, no test helpers).

    wheel_peer.py '{"role": "receiver", "backend": ..., "options": {...}, ...}'

The receiver registers a zeroed buffer, says where it is (one JSON line:
session id, address, and what it loaded), then, told "check" on stdin,
waits for the sender's notification and compares every byte of the buffer
with what it must hold, and answers with the result. The sender registers
a pattern, writes it into the receiver's buffer (transfer_sync for the
first part, post_write with a notification for the rest), and reports.
Both report which files of ferry and of libfabric this process loaded
(from /proc/self/maps and the modules' __file__).
"""

import json
import random
import sys
import time


def pattern(n: int, seed: int) -> bytes:
    return random.Random(seed).randbytes(n)


def loaded() -> dict:
    """What this process loaded: the libfabric files mapped, and where each
    of ferry's modules came from."""
    libs = set()
    with open("/proc/self/maps") as maps:
        for line in maps:
            fields = line.split(None, 5)
            if len(fields) == 6 and "libfabric" in fields[5]:
                libs.add(fields[5].strip())
    modules = {}
    for name, module in list(sys.modules.items()):
        if name.split(".")[0] in ("tensorferry", "tensorferry_fabric", "_tensorferry_sglang"):
            modules[name] = getattr(module, "__file__", None)
    return {"libfabric": sorted(libs), "modules": modules, "prefix": sys.prefix, "path": sys.path}


def say(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


def main() -> None:
    spec = json.loads(sys.argv[1])
    import ctypes

    import tensorferry

    engine = tensorferry.TransferEngine(spec["backend"], **spec["options"])
    size, offset, length, split = spec["size"], spec["offset"], spec["length"], spec["split"]
    if spec["role"] == "receiver":
        buf = (ctypes.c_ubyte * size)()
        addr = ctypes.addressof(buf)
        engine.register_buffer(addr, size)
        say(session=engine.session_id, addr=addr, backend=engine.backend, loaded=loaded())
        for line in sys.stdin:
            if line.strip() != "check":
                say(error=f"unknown command {line.strip()!r}")
                continue
            notes = []
            end = time.monotonic() + 30
            while not notes and time.monotonic() < end:
                notes = engine.notifications()
                if not notes:
                    time.sleep(0.01)
            got = bytes(buf)
            expect = bytes(offset) + pattern(length, spec["seed"]) + bytes(size - offset - length)
            wrong = [i for i in range(0, size, 4096) if got[i:i + 4096] != expect[i:i + 4096]]
            say(
                equal=got == expect,
                wrong_pages=wrong[:10],
                notifications=[[sender, message.hex()] for sender, message in notes],
            )
        engine.close()
    else:
        src = (ctypes.c_ubyte * length).from_buffer_copy(pattern(length, spec["seed"]))
        base = ctypes.addressof(src)
        engine.register_buffer(base, length)
        to, dst = spec["to"], spec["addr"] + offset
        rc = engine.transfer_sync(to, base, dst, split)
        error = engine.last_error
        done = None
        if rc == 0:
            with engine.post_write(to, [base + split], [dst + split], [length - split], notify=b"written") as transfer:
                done = transfer.wait(60)
        say(rc=rc, error=error, done=done, backend=engine.backend, session=engine.session_id, loaded=loaded())
        engine.close()


if __name__ == "__main__":
    main()
