#!/usr/bin/env bash
# One command from a fresh clone to the test suite: installs .venv, builds the ci
# fixture pair if missing, runs pytest (unit + engine tiers; gpu tests skip without a
# GPU; slow tier only with SPECDEC_SLOW=1). Extra args go to pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/python -m specdec_fixtures --pair ci
# The wheel a production user installs: entry point loads, no test-only module inside.
bash scripts/check_wheel.sh
# Prometheus for the monitoring tests (Debian package, no root). If it cannot be
# fetched those tests skip and say why; they never fake a pass.
bash scripts/fetch_prometheus.sh || echo "[test] Prometheus not fetched: its tests will skip"
source scripts/cpu_env.sh
markers="not slow"
[ "${SPECDEC_SLOW:-0}" = 1 ] && markers=""
exec .venv/bin/python -m pytest ${markers:+-m "$markers"} "$@"
