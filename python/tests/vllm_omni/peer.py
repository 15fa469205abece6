"""One stage of a two-stage vLLM-omni pipeline (stage 0 sends to stage 1
through ``FerryConnector``), driven by test_vllm_omni.py over its stdin and
stdout, one JSON object a line.

It runs in vLLM-omni's environment with ferry's wheel installed as a user
installs it: the connector comes from vLLM-omni's own plugin loading,
config parsing and factory, nothing of them patched.

    python peer.py '{"role": "sender"|"receiver", "extra": {...}}'
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from typing import Any, Dict, Optional

# Answers go to the test on the stdout this process was given; everything
# else that writes to stdout (vLLM logs there) goes to stderr.
_answers = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)

import numpy as np
import torch

MiB = 1 << 20


def payload(i: int) -> Any:
    """Payload ``i``: the same on both sides, from ``i`` alone."""
    g = torch.Generator().manual_seed(i)
    big = i in (6, 104, 195)
    shape = (16 * MiB,) if big else (1 + i % 13, 1 + (i * 7) % 211)
    kind = i % 6
    if kind == 0:
        return {
            "latent": torch.randn(shape, generator=g),
            "ids": torch.randint(0, 1 << 40, (1 + i % 97,), generator=g, dtype=torch.int64),
            "mask": torch.randint(0, 2, (3, 1 + i % 31), generator=g).bool(),
            "meta": {"step": i, "name": f"req-{i}", "scale": 0.5, "none": None},
            "list": [torch.randn(4, 8, generator=g).to(torch.bfloat16), "x", 3],
            "pair": (torch.arange(i % 5), 1.5),
        }
    if kind == 1:
        return torch.randn(shape, generator=g).to(torch.bfloat16)
    if kind == 2:
        # A raw KV block, as vLLM-omni's KV manager sends bytes.
        n = 64 * MiB if big else 4096 * (1 + i % 64)
        return torch.randint(0, 256, (n,), generator=g, dtype=torch.uint8).numpy().tobytes()
    if kind == 3:
        return [
            [torch.randn(shape, generator=g), torch.randint(-5, 5, (7,), generator=g)],
            [torch.ones(2, 3, dtype=torch.bool), torch.zeros(0, 4)],
            torch.tensor(float(i)),
        ]
    if kind == 4:
        return {"kv": torch.randint(0, 256, (8, 4096), generator=g, dtype=torch.uint8), "layer": i}
    return {
        "np_f32": np.arange(i + 1, dtype=np.float32).reshape(1, -1),
        "np_i64": np.full((2, 2), i, dtype=np.int64)[:, ::-1],
        "strided": torch.randn(8, 6, generator=g)[:, ::2],
        "nested": {"deep": [{"t": torch.randn(5, generator=g).to(torch.float16)}]},
    }


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    return t.contiguous().view(-1).view(torch.uint8)


def same(got: Any, want: Any, path: str = "payload") -> Optional[str]:
    """Why ``got`` is not ``want`` (None when it is): types, dtypes, shapes
    and every byte."""
    if isinstance(want, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"{path}: {type(got).__name__}, not a tensor"
        if got.dtype != want.dtype or got.shape != want.shape:
            return f"{path}: {got.dtype}{tuple(got.shape)}, not {want.dtype}{tuple(want.shape)}"
        if not torch.equal(_bytes_of(got), _bytes_of(want)):
            return f"{path}: bytes differ"
        return None
    if isinstance(want, np.ndarray):
        if not isinstance(got, np.ndarray) or got.dtype != want.dtype or got.shape != want.shape:
            return f"{path}: {got!r} is not an array like {want.dtype}{want.shape}"
        return None if np.array_equal(got, want) else f"{path}: values differ"
    if isinstance(want, bytes):
        data = got.to_bytes() if hasattr(got, "to_bytes") else got
        return None if data == want else f"{path}: bytes differ"
    if isinstance(want, (list, tuple)):
        if type(got) is not type(want) or len(got) != len(want):
            return f"{path}: {type(got).__name__} of {len(got)}, not {type(want).__name__} of {len(want)}"
        for k, (a, b) in enumerate(zip(got, want)):
            why = same(a, b, f"{path}[{k}]")
            if why:
                return why
        return None
    if isinstance(want, dict):
        if not isinstance(got, dict) or set(got) != set(want):
            return f"{path}: keys {sorted(got) if isinstance(got, dict) else got!r}"
        for k in want:
            why = same(got[k], want[k], f"{path}[{k!r}]")
            if why:
                return why
        return None
    return None if got == want and type(got) is type(want) else f"{path}: {got!r}, not {want!r}"


def connector(role: str, extra: Dict[str, Any]) -> Any:
    from vllm_omni.distributed.omni_connectors.factory import OmniConnectorFactory
    from vllm_omni.distributed.omni_connectors.utils.config import ConnectorSpec
    from vllm_omni.distributed.omni_connectors.utils.initialization import (
        create_connectors_from_config,
        get_connectors_config_for_stage,
        load_omni_transfer_config,
    )
    from vllm_omni.plugins import load_omni_general_plugins

    # What every vLLM-omni process does at start: the wheel's entry point
    # registers FerryConnector.
    load_omni_general_plugins()
    config = load_omni_transfer_config(
        config_dict={
            "runtime": {"connectors": {"ferry": {"name": "FerryConnector", "extra": extra}}},
            "stage_args": [
                {"stage_id": 0, "output_connectors": {"to_stage_1": "ferry"}},
                {"stage_id": 1, "input_connectors": {"from_stage_0": "ferry"}, "engine_input_source": [0]},
            ],
        }
    )
    if role == "sender":
        return create_connectors_from_config(config.connectors, caller_stage_id="0")[("0", "1")]
    spec = get_connectors_config_for_stage(config, 1)["from_stage_0"]["spec"]
    return OmniConnectorFactory.create_connector(ConnectorSpec(name=spec["name"], extra=spec["extra"]))


def receive(conn: Any, cmd: Dict[str, Any], key: str) -> Dict[str, Any]:
    """As vLLM-omni's receive thread: polls get() until it answers (an
    exception it raises is the answer, as its type and message)."""
    start = time.monotonic()
    result = None
    try:
        while result is None and time.monotonic() - start < cmd.get("within", 60):
            result = conn.get("0", "1", key, cmd["meta"])
    except Exception as e:
        return {"ok": False, "why": str(e), "raised": type(e).__name__}
    if result is None:
        why = conn.health()["last_error"] or "nothing within the time"
        conn.abandon_get(key)  # as vLLM-omni does when it gives up
        return {"ok": False, "why": why}
    got, size = result
    why = same(got, payload(cmd["i"]))
    if hasattr(got, "release"):
        got.release()
    del got, result
    return {"ok": why is None, "why": why, "size": size}


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    spec = json.loads(sys.argv[1])
    role, extra = spec["role"], spec["extra"]
    conn = connector(role, extra)
    say({"ready": type(conn).__name__, "health": conn.health()})
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        key = cmd.get("key", f"req-{cmd.get('i')}")
        if op == "put":
            data = payload(cmd["i"])
            ok, size, meta = conn.put("0", "1", key, data)
            say({"ok": ok, "size": size, "meta": meta})
        elif op == "get":
            say(receive(conn, cmd, key))
        elif op == "make":
            # Another connector in this process, from its own extra,
            # through vLLM-omni's factory as the first: what making it
            # raises, else (with "meta") what its get returns; then closed.
            try:
                other = connector(cmd.get("role", "receiver"), {"backend": "local", **cmd["extra"]})
            except Exception as e:
                say({"made": False, "raised": type(e).__name__, "why": str(e)})
                continue
            try:
                answer: Dict[str, Any] = {"made": True, "health": other.health()}
                if "meta" in cmd:
                    answer["get"] = receive(other, cmd, key)
            finally:
                other.close()
            say(answer)
        elif op == "get_by_deadline":
            start = time.monotonic()
            try:
                result = conn.get_with_deadline("0", "1", key, cmd["meta"], deadline=start + cmd["seconds"])
            except Exception as e:
                say({"outcome": "raised", "raised": type(e).__name__, "why": str(e)})
                continue
            elapsed = time.monotonic() - start
            outcome = "none" if result is None else (same(result[0], payload(cmd["i"])) or "data")
            del result
            say({"outcome": outcome, "elapsed": elapsed})
        elif op == "until_reading":
            # Poll until a read is in flight (with its claim granted, if
            # "granted"), or, if it ran faster than the polls, done.
            start = time.monotonic()
            state = "claiming"
            while time.monotonic() - start < 30:
                h = conn.health()
                if h["gets_reading"] and (h["gets_granted"] or not cmd.get("granted")):
                    state = "reading"
                    break
                result = conn.get("0", "1", key, cmd["meta"])
                if result is not None:
                    state = "done"
                    del result
                    break
            say({"state": state})
        elif op == "poll":
            # get() until it answers or reports a failure.
            errors = conn.health()["errors"]
            start = time.monotonic()
            outcome = "nothing"
            while time.monotonic() - start < cmd.get("within", 30):
                result = conn.get("0", "1", key, cmd["meta"])
                if result is not None:
                    why = same(result[0], payload(cmd["i"]))
                    outcome = "data" if why is None else f"wrong data: {why}"
                    del result
                    break
                if conn.health()["errors"] > errors:
                    outcome = "failed"
                    break
            say({"outcome": outcome})
        elif op == "get_once":
            # One call (what it raises is the answer); with "i", whether
            # what it returned is payload i.
            try:
                result = conn.get("0", "1", key, cmd["meta"])
            except Exception as e:
                say({"got": False, "raised": type(e).__name__, "why": str(e)})
                continue
            answer = {"got": result is not None}
            if result is not None and "i" in cmd:
                answer["wrong"] = same(result[0], payload(cmd["i"]))
            say(answer)
            del result
        elif op == "abandon":
            conn.abandon_get(key)
            say({"ok": True})
        elif op == "cleanup":
            conn.cleanup(key)
            say({"ok": True})
        elif op == "health":
            say(conn.health())
        elif op == "info":
            say(conn.get_connection_info())
        elif op == "exit":
            conn.close()
            say({"closed": conn.health()["status"]})
            return


def say(obj: Dict[str, Any]) -> None:
    _answers.write(json.dumps(obj, default=str) + "\n")
    _answers.flush()


if __name__ == "__main__":
    main()
