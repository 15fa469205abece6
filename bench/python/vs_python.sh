#!/usr/bin/env bash
# Side by side on this machine, in one run: ferry against the Python it
# replaces, with the ratio.
#
#   bench/python/vs_python.sh [wire|slots|control|all] [SECONDS]
#
# wire:  the seed's encode_transfer_msg + decode_transfer_msg against
#        ferry's encode + decode, on byte-identical payloads
# slots: a Python buddy allocator (bench/python/buddy_python.py) against ferry's,
#        on the same request streams
# control: two processes over ZeroMQ (ipc:// and tcp://127.0.0.1): round
#        trips of transfer_push → transfer_pushed and the one-way rate, the
#        seed's Python with pyzmq (bench/python/control_python.py) against ferry's
set -euo pipefail
cd "$(dirname "$0")/../.."
what=${1:-all}
seconds=${2:-3}
export FERRY_SEED_DIR=${FERRY_SEED_DIR:-$(pwd)/../shared/seed}
cargo build --release --quiet -p tensorferry-cli --bin ferry
ferry=target/release/ferry

compare() {
    python3 - "$1" "$2" "$3" <<'PY'
import json, sys
title, py, rs = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
print(f"{title:<18} {'python/s':>14} {'ferry/s':>14} {'ratio':>8}")
for name in py:
    p, r = py[name]["per_second"], rs[name]["per_second"]
    print(f"{name:<18} {p:>14,.0f} {r:>14,.0f} {r / p:>7.1f}x")
PY
}

if [ "$what" = wire ] || [ "$what" = all ]; then
    if ! diff <(python3 bench/python/wire_seed.py --print-payloads) <("$ferry" bench wire --print-payloads) >/dev/null; then
        echo "error: ferry and the seed encode different payloads; the comparison would be unfair" >&2
        exit 1
    fi
    py=$(python3 bench/python/wire_seed.py --seconds "$seconds")
    rs=$("$ferry" bench wire --seconds "$seconds" --format json)
    compare "wire (enc+dec)" "$py" "$rs"
fi
if [ "$what" = slots ] || [ "$what" = all ]; then
    py=$(python3 bench/python/buddy_python.py --seconds "$seconds")
    rs=$("$ferry" bench slots --seconds "$seconds" --format json)
    compare "slots (ops)" "$py" "$rs"
fi
if [ "$what" = control ] || [ "$what" = all ]; then
    py=$(python3 bench/python/control_python.py "$seconds")
    rs=$("$ferry" bench --control zmq --seconds "$seconds" --json)
    python3 - "$py" "$rs" <<'PY'
import json, sys
py, rs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'control (zmq)':<18} {'python':>12} {'ferry':>12} {'ratio':>8}")
for t in ("ipc", "tcp"):
    for key, unit, lower_better in (("p50_us", "µs", True), ("p99_us", "µs", True), ("messages_per_second", "msg/s", False)):
        p, r = py[t][key], rs[t][key]
        ratio = p / r if lower_better else r / p
        print(f"{t + ' ' + key:<18} {p:>12,.1f} {r:>12,.1f} {ratio:>7.2f}x")
PY
fi
