#!/bin/bash
# Device call 1: keep shard 1 of the target weights on the (warm) machine for call 2.
set -e
cd "$(dirname "$0")/../.."
mkdir -p /root/stash
cp experiments/distill_ceiling/part1/weights1.bin /root/stash/weights1.bin
sha256sum /root/stash/weights1.bin | tee ${OUT:-/tmp}/stash_sha256.txt
df -h /root | tail -1; nvidia-smi --query-gpu=name,memory.total,memory.used --format=csv
