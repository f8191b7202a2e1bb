#!/bin/bash
# Device call 2: the experiment. Extra arguments go to distill_ceiling.py
# (e.g. --budget 400). BUDGET env var = --budget (default 420 s, counted from python start).
set -o pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/dc_out}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false
W1=/root/stash/weights1.bin
[ -f "$W1" ] || W1=experiments/distill_ceiling/part1/weights1.bin
if [ ! -f "$W1" ]; then echo "NO weights1.bin: run call 1 (stash.sh) first, within 30 s" | tee "$OUT/log.txt"; exit 3; fi
want=$(cat experiments/distill_ceiling/part2/weights1.sha256 2>/dev/null | cut -d' ' -f1)
got=$(sha256sum "$W1" | cut -d' ' -f1)
echo "weights1: $W1 sha256 $got (want $want)" | tee "$OUT/log.txt"
[ -z "$want" ] || [ "$want" = "$got" ] || { echo "weights1.bin sha256 mismatch" | tee -a "$OUT/log.txt"; exit 4; }
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv 2>&1 | tee -a "$OUT/log.txt"
python3 experiments/distill_ceiling/distill_ceiling.py --weights1 "$W1" --part2 experiments/distill_ceiling/part2 \
  --out "$OUT/results.json" --budget "${BUDGET:-420}" "$@" 2>&1 | tee -a "$OUT/log.txt"
rc=$?
echo "exit $rc" | tee -a "$OUT/log.txt"
exit $rc
