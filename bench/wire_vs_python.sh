#!/usr/bin/env bash
# Side by side on this machine, in one run: the seed's Python
# encode_transfer_msg + decode_transfer_msg against ferry's encode + decode,
# on byte-identical payloads. Prints both rates and their ratio.
#
#   bench/wire_vs_python.sh [SECONDS]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-3}
export FERRY_SEED_DIR=${FERRY_SEED_DIR:-$(pwd)/../shared/seed}
cargo build --release --quiet --bin ferry
ferry=target/release/ferry
if ! diff <(python3 bench/wire_seed.py --print-payloads) <("$ferry" bench wire --print-payloads) >/dev/null; then
    echo "error: ferry and the seed encode different payloads; the comparison would be unfair" >&2
    exit 1
fi
echo "payloads are byte-identical; timing ${seconds}s per workload per side"
py=$(python3 bench/wire_seed.py --seconds "$seconds")
rs=$("$ferry" bench wire --seconds "$seconds" --format json)
python3 - "$py" "$rs" <<'PY'
import json, sys
py, rs = json.loads(sys.argv[1]), json.loads(sys.argv[2])
print(f"{'message':<18} {'python/s':>12} {'ferry/s':>14} {'ratio':>8}")
for name in py:
    p, r = py[name]["per_second"], rs[name]["per_second"]
    print(f"{name:<18} {p:>12,.0f} {r:>14,.0f} {r / p:>7.1f}x")
PY
