#!/usr/bin/env bash
# Creates .venv (Python 3.11) and installs the project with the extras asked for.
# Usage: scripts/bootstrap.sh [EXTRAS]   e.g. "convert,test". Idempotent and quick when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
extras="${1:-convert}"
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
if [ ! -x .venv/bin/python ]; then
    "$py" -m venv .venv
    .venv/bin/python -m pip install -q --upgrade pip
fi
stamp=".venv/.installed-$(cat pyproject.toml | sha256sum | cut -c1-16)-${extras//,/_}"
if [ ! -f "$stamp" ]; then
    # torch==2.13.0 must be in the same command as anything that may pull torch (CPU wheel; see toolchain notes).
    .venv/bin/python -m pip install -q -e ".[${extras}]" "torch==2.13.0"
    touch "$stamp"
fi
