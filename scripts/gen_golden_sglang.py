#!/usr/bin/env python3
"""Golden wire vectors from sglang 0.5.23's released protocol.

Writes one payload per line (tests/data/golden/sglang-0.5.23.jsonl by
default), each exactly as sglang 0.5.23 encodes it:

- every dataclass of its ``transport/protocol.py`` through its own
  ``encode_transfer_msg`` (its ``TransferStagedMsg`` always carries
  ``scalar_fields``, a ``default_factory`` field, unlike the seed's);
- the denoiser's forward, ``transfer_done{staged_for_decoder}``, in the
  key order its ``scheduler_mixin.py`` builds it;
- the head's fast-path ``transfer_ready``, whose ``scalar_fields`` end in
  the ``_prealloc_slot_id`` the head appends.

ferry must decode each line and re-encode it byte for byte in its sglang
dialect (core/tests/golden.rs). ``protocol.py`` is loaded from the
installed sglang wheel by path, unmodified, without importing the rest of
sglang; run it with the sglang environment's Python (scripts/sglang-env).
"""

import argparse
import dataclasses
import importlib.util
import json
import os
import random
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import gen_golden as g  # noqa: E402  (the value generators; it loads the seed)


def released_protocol():
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("sglang is not installed in this Python (scripts/sglang-env)")
    root = list(spec.submodule_search_locations)[0]
    path = os.path.join(root, "multimodal_gen", "runtime", "disaggregation", "transport", "protocol.py")
    mod_spec = importlib.util.spec_from_file_location("sglang_0_5_23_protocol", path)
    mod = importlib.util.module_from_spec(mod_spec)
    mod_spec.loader.exec_module(mod)
    return mod


def vectors(p, rng, n):
    out = []
    for _ in range(n):
        t = rng.randrange(10)
        if t == 0:
            m = p.TransferRegisterMsg(role=rng.choice(["encoder", "denoiser", "decoder", "prompt_encoder"]), session_id=g.rstr(rng), pool_ptr=g.ru64(rng), pool_size=g.ru64(rng), work_endpoint=rng.choice(["tcp://127.0.0.1:5555", g.rstr(rng)]), preallocated_slots=g.rslots(rng))
        elif t == 1:
            # Empty scalar fields half the time: the released form writes them anyway.
            scalars = {} if rng.random() < 0.5 else g.rscalar_fields(rng)
            m = p.TransferStagedMsg(request_id=g.rstr(rng), data_size=g.ru64(rng), manifest=g.rmanifest(rng), session_id=g.rstr(rng), pool_ptr=g.ru64(rng), slot_offset=g.ru64(rng), scalar_fields=scalars)
        elif t == 2:
            m = p.TransferAllocMsg(request_id=g.rstr(rng), data_size=g.ru64(rng), source_role=rng.choice(["encoder", "denoiser"]))
        elif t == 3:
            m = p.TransferAllocatedMsg(request_id=g.rstr(rng), session_id=g.rstr(rng), pool_ptr=g.ru64(rng), slot_offset=g.ru64(rng), slot_size=g.ru64(rng))
        elif t == 4:
            m = p.TransferPushMsg(request_id=g.rstr(rng), dest_session_id=g.rstr(rng), dest_addr=g.ru64(rng), transfer_size=g.ru64(rng))
        elif t == 5:
            m = p.TransferPushedMsg(request_id=g.rstr(rng))
        elif t == 6:
            m = p.TransferReadyMsg(request_id=g.rstr(rng), manifest=g.rmanifest(rng), slot_offset=g.ru64(rng), scalar_fields=g.rscalar_fields(rng))
        elif t == 7:
            m = p.TransferDoneMsg(request_id=g.rstr(rng), error=g.ropt_str(rng))
        elif t == 8:
            # The head's fast path: the slot id appended to the relayed fields.
            scalars = dict(g.rscalar_fields(rng))
            scalars["_prealloc_slot_id"] = rng.randrange(0, 8)
            m = p.TransferReadyMsg(request_id=g.rstr(rng), manifest=g.rmanifest(rng), slot_offset=g.ru64(rng), scalar_fields=scalars)
        else:
            # The denoiser's forward, keys in the order its scheduler writes them.
            m = {
                "msg_type": p.TransferMsgType.DONE,
                "request_id": g.rstr(rng),
                "staged_for_decoder": True,
                "session_id": g.rstr(rng),
                "pool_ptr": g.ru64(rng),
                "slot_offset": g.ru64(rng),
                "data_size": g.ru64(rng),
                "manifest": g.rmanifest(rng),
                "scalar_fields": g.rscalar_fields(rng),
            }
        frames = p.encode_transfer_msg(m)
        assert frames[0] == p.TRANSFER_MAGIC
        out.append(frames[1])
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", nargs="?", default=os.path.join(HERE, "..", "tests", "data", "golden", "sglang-0.5.23.jsonl"))
    ap.add_argument("--seed", type=int, default=523)
    ap.add_argument("-n", type=int, default=400)
    args = ap.parse_args()
    p = released_protocol()
    assert "scalar_fields" in {f.name for f in dataclasses.fields(p.TransferStagedMsg)}
    lines = vectors(p, random.Random(args.seed), args.n)
    with open(args.out, "wb") as f:
        for line in lines:
            json.loads(line)
            f.write(line + b"\n")
    print(f"{len(lines)} vectors -> {args.out}")


if __name__ == "__main__":
    main()
