#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs everything, builds fixtures in the session, runs pytest.
# Extra arguments go to pytest (for example: scripts/test.sh -m heavy).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh convert,test
scripts/reference_env.sh  # Transformers 5, for Decision 3.0 parity tests only
# QEMU's user-mode emulator runs the int8 checks on an AVX2-only CPU class (tests/test_cpu_classes.py);
# best effort: without root or a package index the test says it was skipped and why.
command -v qemu-x86_64 >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && { apt-get update -qq && apt-get install -y -qq qemu-user; } >/dev/null 2>&1; } || true
# Prometheus' promtool and server run the alert rules' tests (tests/test_prometheus_*.py), the same way.
{ command -v promtool && command -v prometheus; } >/dev/null 2>&1 || { [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1 \
    && { apt-get update -qq && apt-get install -y -qq --no-install-recommends prometheus; } >/dev/null 2>&1; } || true
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
