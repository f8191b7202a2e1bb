#!/usr/bin/env bash
# One command from a fresh clone to `vllm serve` with the plugin on the fixture pair:
# installs .venv, builds the fixtures if missing, serves on 127.0.0.1:${PORT:-8000}.
# PAIR=ci|bench picks the fixture pair; K sets num_speculative_tokens (the ceiling
# for adaptive modes); MODE=draft|ngram|hybrid|adaptive|hybrid-adaptive the plugin mode.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PAIR=${PAIR:-ci}
K=${K:-4}
paths=$(.venv/bin/python -m vllm_specdec_plugin.fixtures --pair "$PAIR" --print-paths)
TARGET=$(echo "$paths" | sed -n 's/^target=//p')
DRAFT=$(echo "$paths" | sed -n 's/^draft=//p')
source scripts/cpu_env.sh
case "${MODE:-draft}" in
  draft) mode='' ;;
  ngram) mode=',"method":"ngram"' ;;
  hybrid) mode=',"method":"hybrid"' ;;
  adaptive) mode=',"adaptive":true' ;;
  hybrid-adaptive) mode=',"method":"hybrid","adaptive":true' ;;
  *) echo "[serve] MODE must be draft, ngram, hybrid, adaptive or hybrid-adaptive (got ${MODE})" >&2; exit 2 ;;
esac
spec=$(printf '{"method":"custom_class","model":"vllm_specdec_plugin.DraftModelProposer","num_speculative_tokens":%s,"draft_load_config":{"model_loader_extra_config":{"specdec":{"preset":"configs/fixture-%s.yaml","draft_model":"%s"%s}}}}' "$K" "$PAIR" "$DRAFT" "$mode")
echo "[serve] target=$TARGET"
echo "[serve] speculative-config=$spec"
exec .venv/bin/vllm serve "$TARGET" --served-model-name "specdec-$PAIR" \
  --host 127.0.0.1 --port "${PORT:-8000}" --max-model-len "${MAX_MODEL_LEN:-1024}" \
  --speculative-config "$spec" "$@"
