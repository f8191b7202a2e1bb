#!/usr/bin/env bash
# One command from a fresh clone to `vllm serve` with the plugin on the fixture pair:
# installs .venv, builds the fixtures if missing, serves on 127.0.0.1:${PORT:-8000}.
# PAIR=ci|bench picks the fixture pair; K sets num_speculative_tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PAIR=${PAIR:-ci}
K=${K:-4}
paths=$(.venv/bin/python -m vllm_specdec_plugin.fixtures --pair "$PAIR" --print-paths)
TARGET=$(echo "$paths" | sed -n 's/^target=//p')
DRAFT=$(echo "$paths" | sed -n 's/^draft=//p')
source scripts/cpu_env.sh
spec=$(printf '{"method":"custom_class","model":"vllm_specdec_plugin.DraftModelProposer","num_speculative_tokens":%s,"draft_load_config":{"model_loader_extra_config":{"specdec":{"preset":"configs/fixture-%s.yaml","draft_model":"%s"}}}}' "$K" "$PAIR" "$DRAFT")
echo "[serve] target=$TARGET"
echo "[serve] speculative-config=$spec"
exec .venv/bin/vllm serve "$TARGET" --served-model-name "specdec-$PAIR" \
  --host 127.0.0.1 --port "${PORT:-8000}" --max-model-len "${MAX_MODEL_LEN:-1024}" \
  --speculative-config "$spec" "$@"
