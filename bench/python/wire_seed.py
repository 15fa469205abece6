#!/usr/bin/env python3
"""Time the seed's own encode_transfer_msg + decode_transfer_msg on the
messages that `ferry bench wire` times (same field values, same bytes).

Prints one JSON object: {"transfer_staged": {"per_second": ..., "payload_bytes": ...}, ...}
With --print-payloads, prints the payloads instead (one per line).
"""

import argparse
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.environ.get("FERRY_SEED_DIR", os.path.join(HERE, "..", "..", "..", "shared", "seed")))
import protocol as seed  # noqa: E402

MANIFEST = {
    "prompt_embeds": [{"offset": 0, "shape": [1, 512, 4096], "dtype": "bfloat16"}],
    "pooled_prompt_embeds": [{"offset": 4194304, "shape": [1, 4096], "dtype": "bfloat16"}],
    "latents": [{"offset": 4202496, "shape": [1, 16, 21, 90, 160], "dtype": "bfloat16", "list_index": 0}],
    "timesteps": [{"offset": 14088192, "shape": [1], "dtype": "float32"}],
}


def staged():
    return seed.TransferStagedMsg(
        request_id="req-000042-3f9c2a7e",
        data_size=14088704,
        manifest=MANIFEST,
        session_id="10.0.0.7:5557/mlx5_0",
        pool_ptr=140245832663040,
        slot_offset=268435456,
    )


def push():
    return seed.TransferPushMsg(
        request_id="req-000042-3f9c2a7e",
        dest_session_id="10.0.0.9:5557/mlx5_1",
        dest_addr=139912345698304,
        transfer_size=14088704,
    )


def measure(make, seconds):
    msg = make()
    n = 0
    start = time.perf_counter()
    while True:
        for _ in range(256):
            frames = seed.encode_transfer_msg(msg)
            seed.decode_transfer_msg(frames)
        n += 256
        elapsed = time.perf_counter() - start
        if elapsed >= seconds:
            return n / elapsed, len(frames[1])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--seconds", type=float, default=2.0)
    ap.add_argument("--print-payloads", action="store_true")
    args = ap.parse_args()
    workloads = [("transfer_staged", staged), ("transfer_push", push)]
    if args.print_payloads:
        for _, make in workloads:
            print(seed.encode_transfer_msg(make())[1].decode())
        return
    out = {}
    for name, make in workloads:
        rate, size = measure(make, args.seconds)
        out[name] = {"per_second": round(rate, 1), "payload_bytes": size}
    print(json.dumps(out))


if __name__ == "__main__":
    main()
