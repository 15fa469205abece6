#!/usr/bin/env python3
"""Generate ferry's golden wire vectors with the seed's own encoder.

Writes, into the directory given as the first argument (default
tests/data/golden):

  canonical.jsonl        one payload per line, exactly as the seed's
                         encode_transfer_msg writes it (ferry's compatible
                         extensions are added the way docs/design.md says:
                         extension fields only when they differ from their
                         defaults, appended after the seed's fields)
  loose.jsonl            the same messages written differently: other key
                         order, whitespace, unknown and missing keys, repeated
                         keys, raw UTF-8, gratuitous escapes, other spellings
                         of the same numbers
  loose.canonical.jsonl  line for line, what the seed's Python encodes after
                         decoding the loose line and building its dataclass
  floats.jsonl           transfer_ready messages whose scalar_fields hold
                         floats of random bit patterns, halfway ties and
                         specials, spelled in several ways
  floats.canonical.jsonl line for line, the seed's encoding of each

The seed module (../shared/seed/protocol.py) is imported unmodified. The
output is deterministic for a given seed (--seed).
"""

import argparse
import dataclasses
import json
import math
import os
import random
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
SEED_DIR = os.environ.get(
    "FERRY_SEED_DIR", os.path.join(HERE, "..", "..", "shared", "seed")
)
sys.path.insert(0, SEED_DIR)
import protocol as seed  # noqa: E402

SEP = (",", ":")

# ferry's messages beyond the seed, with the field order ferry writes.
# Every field of these types is always written (no seed form exists).
EXTRA_TYPES = {
    "transfer_register_ack": [
        ("session_id", ""),
        ("role", ""),
        ("accepted", True),
        ("error", None),
    ],
    "transfer_alloc_reject": [
        ("request_id", ""),
        ("session_id", ""),
        ("retryable", True),
        ("reason", ""),
    ],
    "transfer_abort": [("request_id", ""), ("reason", "")],
    "transfer_deregister": [("session_id", ""), ("draining", False), ("reason", "")],
}
# Extension fields of seed messages: written only when not the default.
EXTENSIONS = {
    "transfer_staged": [("scalar_fields", {})],
    "transfer_pushed": [("success", True), ("error", None)],
    "transfer_alloc": [("receiver_session_id", "")],
    "transfer_ready": [("dest_session_id", "")],
    "transfer_abort": [("source_role", "")],
}
SEED_CLASSES = {
    c.msg_type: c
    for c in (
        seed.TransferRegisterMsg,
        seed.TransferStagedMsg,
        seed.TransferAllocMsg,
        seed.TransferAllocatedMsg,
        seed.TransferPushMsg,
        seed.TransferPushedMsg,
        seed.TransferReadyMsg,
        seed.TransferDoneMsg,
    )
}


def canonical(d):
    """What ferry (and the seed, for what it can express) encodes for the
    message whose decoded JSON object is `d`: known fields in order, defaults
    for missing ones, unknown ones dropped."""
    t = d["msg_type"]
    if t in SEED_CLASSES:
        cls = SEED_CLASSES[t]
        names = [f.name for f in dataclasses.fields(cls)]
        msg = cls(**{k: d[k] for k in names if k in d})
        payload = seed.encode_transfer_msg(msg)[1]
        # A null scalar_fields reads as {}, as TransferReadyMsg's does.
        exts = [(k, d.get(k, dflt) if d.get(k) is not None or dflt is None else dflt) for k, dflt in EXTENSIONS.get(t, [])]
        exts = [(k, v) for (k, v), (_, dflt) in zip(exts, EXTENSIONS.get(t, [])) if v != dflt]
        if not exts:
            return payload
        out = dataclasses.asdict(msg)
        out.update(exts)
        return json.dumps(out, separators=SEP).encode()
    out = {"msg_type": t}
    for k, dflt in EXTRA_TYPES[t]:
        out[k] = d.get(k, dflt)
    for k, dflt in EXTENSIONS.get(t, []):
        if d.get(k, dflt) != dflt:
            out[k] = d[k]
    return json.dumps(out, separators=SEP).encode()


# ---------------------------------------------------------------- values

ALPHABET = (
    list("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_./:")
    + list(' "\\/\b\f\n\r\t\x00\x01\x1f\x7f')
    + list("é中ß€ÿĀ\u2028\u2029\ufeff\uffff")
    + ["\U0001f600", "\U00010000", "\U0010ffff", "\U0001d11e"]
)


def rstr(rng, n=None):
    if n is None:
        n = rng.choice([0, 1, 3, 8, 16, 40])
    if rng.random() < 0.4:
        return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz0123456789-_") for _ in range(n))
    return "".join(rng.choice(ALPHABET) for _ in range(n))


U64_EXTREMES = [0, 1, 255, 256, 511, 512, 2**31, 2**32 - 1, 2**32, 2**53 + 1, 2**63 - 1, 2**63, 2**64 - 2, 2**64 - 1]


def ru64(rng):
    r = rng.random()
    if r < 0.3:
        return rng.choice(U64_EXTREMES)
    if r < 0.6:
        return rng.randrange(0, 1 << 40)
    return rng.randrange(0, 1 << 64)


SPECIAL_FLOATS = [math.nan, math.inf, -math.inf, 1e-05, -0.0, 0.0, 1e16, 1e15, 0.1, 1e-4, 5e-324, 1.7976931348623157e308, 2.5, -1.5e-300, 123456789.125]


def rfloat(rng):
    if rng.random() < 0.4:
        return rng.choice(SPECIAL_FLOATS)
    return rng.uniform(-1, 1) * 10 ** rng.randint(-30, 30)


def rscalar(rng, depth=0):
    kinds = ["str", "int", "bigint", "float", "bool", "none"]
    if depth < 5:
        kinds += ["list", "dict"]
    k = rng.choice(kinds)
    if k == "str":
        return rstr(rng)
    if k == "int":
        return rng.randint(-(2**63), 2**64)
    if k == "bigint":
        return rng.randint(10**25, 10**30) * rng.choice([1, -1])
    if k == "float":
        return rfloat(rng)
    if k == "bool":
        return rng.random() < 0.5
    if k == "none":
        return None
    if k == "list":
        return [rscalar(rng, depth + 1) for _ in range(rng.randint(0, 4))]
    return {rstr(rng, rng.randint(1, 8)): rscalar(rng, depth + 1) for _ in range(rng.randint(0, 4))}


def rscalar_fields(rng):
    r = rng.random()
    if r < 0.2:
        return {}
    d = {
        "prompt": rstr(rng, rng.randint(0, 60)),
        "height": rng.choice([480, 720, 1080]),
        "guidance_scale": rng.choice([1e-05, 7.5, 5.0, math.nan]),
        "seed": rng.randint(0, 2**32),
    }
    for _ in range(rng.randint(0, 5)):
        d[rstr(rng, rng.randint(1, 10))] = rscalar(rng)
    return d


DTYPES = ["float16", "float32", "float64", "bfloat16", "int8", "int16", "int32", "int64", "uint8", "bool", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64", "complex64", "complex128"]


def rmanifest(rng):
    r = rng.random()
    nfields = 0 if r < 0.1 else (rng.randint(1, 4) if r < 0.85 else rng.randint(10, 40))
    m = {}
    off = 0
    for _ in range(nfields):
        name = rstr(rng, rng.randint(1, 12)) if rng.random() < 0.3 else rng.choice(["prompt_embeds", "latents", "timesteps", "negative_prompt_embeds", "image_latents", "pooled"]) + str(rng.randint(0, 99))
        is_list = rng.random() < 0.3
        n = rng.randint(1, 6) if is_list else 1
        entries = []
        for i in range(n):
            shape = [rng.choice([1, 2, 16, 21, 90, 160, 512, 4096, rng.randrange(0, 1 << 20)]) for _ in range(rng.randint(0, 6))]
            e = {"offset": off, "shape": shape, "dtype": rng.choice(DTYPES)}
            if is_list:
                e["list_index"] = i
            off += 512 * rng.randint(1, 1 << 16)
            entries.append(e)
        m[name] = entries
    return m


def rslots(rng):
    base = ru64(rng) & ~0xFFF
    out = []
    for i in range(rng.choice([0, 0, 1, 2, 4, 8, 64])):
        off = i * (1 << 24)
        out.append({"offset": off, "size": 1 << 24, "slot_id": i, "addr": (base + off) % (1 << 64)})
    return out


def ropt_str(rng):
    return None if rng.random() < 0.5 else rstr(rng)


def rmsg(rng, t):
    if t == "transfer_register":
        return dataclasses.asdict(seed.TransferRegisterMsg(role=rng.choice(["encoder", "denoiser", "decoder", rstr(rng)]), session_id=rstr(rng), pool_ptr=ru64(rng), pool_size=ru64(rng), work_endpoint=rng.choice(["tcp://10.0.0.1:5555", "ipc:///tmp/ferry.sock", rstr(rng)]), preallocated_slots=rslots(rng)))
    if t == "transfer_staged":
        d = dataclasses.asdict(seed.TransferStagedMsg(request_id=rstr(rng), data_size=ru64(rng), manifest=rmanifest(rng), session_id=rstr(rng), pool_ptr=ru64(rng), slot_offset=ru64(rng)))
        d["scalar_fields"] = rscalar_fields(rng)
        return d
    if t == "transfer_alloc":
        d = dataclasses.asdict(seed.TransferAllocMsg(request_id=rstr(rng), data_size=ru64(rng), source_role=rstr(rng)))
        d["receiver_session_id"] = rstr(rng) if rng.random() < 0.5 else ""
        return d
    if t == "transfer_allocated":
        return dataclasses.asdict(seed.TransferAllocatedMsg(request_id=rstr(rng), session_id=rstr(rng), pool_ptr=ru64(rng), slot_offset=ru64(rng), slot_size=ru64(rng)))
    if t == "transfer_push":
        return dataclasses.asdict(seed.TransferPushMsg(request_id=rstr(rng), dest_session_id=rstr(rng), dest_addr=ru64(rng), transfer_size=ru64(rng)))
    if t == "transfer_pushed":
        d = dataclasses.asdict(seed.TransferPushedMsg(request_id=rstr(rng)))
        d["success"] = rng.random() < 0.6
        d["error"] = ropt_str(rng)
        return d
    if t == "transfer_ready":
        d = dataclasses.asdict(seed.TransferReadyMsg(request_id=rstr(rng), manifest=rmanifest(rng), slot_offset=ru64(rng), scalar_fields=rscalar_fields(rng)))
        d["dest_session_id"] = rstr(rng) if rng.random() < 0.5 else ""
        return d
    if t == "transfer_done":
        return dataclasses.asdict(seed.TransferDoneMsg(request_id=rstr(rng), error=ropt_str(rng)))
    if t == "transfer_register_ack":
        return {"msg_type": t, "session_id": rstr(rng), "role": rstr(rng), "accepted": rng.random() < 0.7, "error": ropt_str(rng)}
    if t == "transfer_alloc_reject":
        return {"msg_type": t, "request_id": rstr(rng), "session_id": rstr(rng), "retryable": rng.random() < 0.5, "reason": rstr(rng)}
    if t == "transfer_abort":
        d = {"msg_type": t, "request_id": rstr(rng), "reason": rstr(rng)}
        d["source_role"] = rstr(rng) if rng.random() < 0.5 else ""
        return d
    if t == "transfer_deregister":
        return {"msg_type": t, "session_id": rstr(rng), "draining": rng.random() < 0.5, "reason": rstr(rng)}
    raise ValueError(t)


ALL_TYPES = list(SEED_CLASSES) + list(EXTRA_TYPES)
# Added after the first vectors were made (see `main`).
LATER_TYPES = {"transfer_deregister"}

# ---------------------------------------------------------------- loose writer


def ws(rng):
    return rng.choice(["", "", " ", "  ", "\t", "\r", " \t "])


def loose_str(rng, s):
    out = ['"']
    for ch in s:
        c = ord(ch)
        r = rng.random()
        if ch == '"':
            out.append('\\"' if r < 0.7 else "\\u0022")
        elif ch == "\\":
            out.append("\\\\" if r < 0.7 else "\\u005C")
        elif ch == "/" and r < 0.5:
            out.append("\\/")
        elif c < 0x20 or ch in "\u2028\u2029" and r < 0.5:
            out.append("\\u%04X" % c if r < 0.5 else "\\u%04x" % c)
        elif c > 0xFFFF:
            if r < 0.5:
                out.append(ch)
            else:
                v = c - 0x10000
                out.append("\\u%04X\\u%04x" % (0xD800 | (v >> 10), 0xDC00 | (v & 0x3FF)))
        elif c > 0x7E or r < 0.05:
            out.append(ch if (c > 0x7E and r < 0.6) else "\\u%04x" % c)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def loose_float(rng, x):
    if math.isnan(x):
        return "NaN"
    if math.isinf(x):
        return "Infinity" if x > 0 else "-Infinity"
    forms = [repr(x), "%.17g" % x, "%.17e" % x, repr(x).upper(), "%.20E" % x]
    s = rng.choice(forms)
    if "." not in s and "e" not in s.lower() and "n" not in s.lower():
        s += ".0"  # keep it a float token
    return s


def loose(rng, v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if v is None:
        return "null"
    if isinstance(v, int):
        return str(v)
    if isinstance(v, float):
        return loose_float(rng, v)
    if isinstance(v, str):
        return loose_str(rng, v)
    if isinstance(v, list):
        if not v:
            return "[" + ws(rng) + "]"
        return "[" + ws(rng) + ("," + ws(rng)).join(loose(rng, x) + ws(rng) for x in v) + "]"
    if isinstance(v, dict):
        return loose_obj(rng, list(v.items()))
    raise TypeError(type(v))


def loose_obj(rng, items):
    if not items:
        return "{" + ws(rng) + "}"
    parts = [ws(rng) + loose_str(rng, k) + ws(rng) + ":" + ws(rng) + loose(rng, v) + ws(rng) for k, v in items]
    return "{" + ",".join(parts) + "}"


def loosen(rng, d):
    """A different text for (nearly) the same message, and the object that
    Python's json.loads makes of it."""
    items = list(d.items())
    if rng.random() < 0.5:
        rng.shuffle(items)
    if rng.random() < 0.3:
        # Drop some fields: the decoder must use the defaults.
        items = [(k, v) for k, v in items if k == "msg_type" or rng.random() < 0.6]
    if rng.random() < 0.4:
        for _ in range(rng.randint(1, 3)):
            items.insert(rng.randrange(len(items) + 1), ("x_" + rstr(rng, 5), rscalar(rng)))
    if rng.random() < 0.2 and len(items) > 1:
        # A repeated key: the last occurrence wins, as in Python.
        k, _ = rng.choice([kv for kv in items if kv[0] != "msg_type"] or items)
        if k != "msg_type":
            items.insert(0, (k, rscalar(rng)))
    if rng.random() < 0.1:
        for i, (k, v) in enumerate(items):
            if k in ("manifest", "scalar_fields"):
                items[i] = (k, None)  # None → {} in the seed's __post_init__
    text = ws(rng) + loose_obj(rng, items) + ws(rng)
    return text


def float_vectors(rng, n):
    """(payload, canonical) pairs that pin down float printing: Python's
    repr picks, among the shortest strings that round-trip, the correctly
    rounded one (ties to even)."""
    vals = [struct.unpack("<d", struct.pack("<Q", rng.getrandbits(64)))[0] for _ in range(n)]
    vals += [float(2**50 + i) + 0.25 for i in range(0, 4000, 97)]  # 17-digit ties
    vals += [i * 0.125 for i in range(-64, 64)] + SPECIAL_FLOATS
    out = []
    for f in vals:
        finite = f == f and abs(f) != math.inf
        for form in ([repr(f), "%.17e" % f, "%.25G" % f] if finite else [json.dumps(f)]):
            text = '{"msg_type":"transfer_ready","request_id":"f","scalar_fields":{"x":%s,"y":[%s]}}' % (form, form)
            out.append((text.encode(), canonical(json.loads(text))))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("outdir", nargs="?", default=os.path.join(HERE, "..", "tests", "data", "golden"))
    ap.add_argument("--seed", type=int, default=20261129)
    ap.add_argument("--per-type", type=int, default=60)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    os.makedirs(args.outdir, exist_ok=True)
    canon_lines, loose_lines, loose_canon = [], [], []
    # Types added later draw from a generator of their own, so that adding
    # one leaves every earlier vector (and the floats after them) as it was.
    later = random.Random(args.seed + 1)
    for t in ALL_TYPES:
        r = later if t in LATER_TYPES else rng
        for _ in range(args.per_type):
            d = rmsg(r, t)
            c = canonical(d)
            assert b"\n" not in c
            # The seed must read back what it wrote.
            assert seed.decode_transfer_msg([seed.TRANSFER_MAGIC, c])["msg_type"] == t
            canon_lines.append(c)
            for _ in range(2):
                text = loosen(r, d)
                assert "\n" not in text
                parsed = json.loads(text)
                loose_lines.append(text.encode("utf-8"))
                loose_canon.append(canonical(parsed))
    floats = float_vectors(rng, 3000)
    for name, lines in (
        ("canonical.jsonl", canon_lines),
        ("loose.jsonl", loose_lines),
        ("loose.canonical.jsonl", loose_canon),
        ("floats.jsonl", [a for a, _ in floats]),
        ("floats.canonical.jsonl", [b for _, b in floats]),
    ):
        with open(os.path.join(args.outdir, name), "wb") as f:
            for line in lines:
                f.write(line + b"\n")
    print(f"{len(canon_lines)} canonical, {len(loose_lines)} loose, {len(floats)} float vectors in {args.outdir}")


if __name__ == "__main__":
    main()
