"""An encoder instance in its own process (tensorferry.Instance): stages and
commits ``count`` requests of deterministic tensors (the test regenerates
them to check every byte), then reports what became of them as one JSON
line on stdout."""

import json
import sys

import numpy as np

import tensorferry


def tensors(i: int) -> dict:
    """Request ``i``'s tensors: numpy arrays and torch tensors, one list
    field, several dtypes (bfloat16 among them)."""
    import torch

    rng = np.random.default_rng(1000 + i)
    g = torch.Generator().manual_seed(i)
    return {
        "latents": rng.standard_normal((2, 4, 32, 32), dtype=np.float32),
        "prompt_embeds": [
            torch.randn(77, 64, generator=g).to(torch.bfloat16),
            torch.arange(i, i + 3, dtype=torch.int64),
        ],
        "mask": rng.integers(0, 2, (1, 100)).astype(bool),
    }


def main() -> None:
    spec = json.loads(sys.argv[1])
    inst = tensorferry.Instance(
        "encoder",
        coordinator=spec["coordinator"],
        endpoint=spec["endpoint"],
        backend=spec["backend"],
        **spec.get("options", {}),
    )
    inst.wait_registered(10)
    sent, reasons = 0, []
    for i in range(spec["count"]):
        with inst.stage(f"req-{i}", tensors(i)) as st:
            st.commit({"i": i, "note": "from the encoder"})
    for _ in range(spec["count"]):
        o = inst.next_outcome(30)
        if o is None:
            reasons.append("no outcome")
        elif o.sent:
            sent += 1
        else:
            reasons.append(o.reason)
    stats = inst.stats()
    inst.close()
    print(json.dumps({"sent": sent, "reasons": reasons, "stats": stats}))


if __name__ == "__main__":
    main()
