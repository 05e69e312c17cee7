#!/usr/bin/env bash
# Creates .venv-ref: Transformers 5 for the Decision 3.0 converter's parity reference (see
# scripts/reference-requirements.txt for why it is a second environment). Idempotent and quick when up to date.
set -euo pipefail
cd "$(dirname "$0")/.."
py="${PYTHON:-python3.11}"
command -v "$py" >/dev/null 2>&1 || py=python3
if [ ! -x .venv-ref/bin/python ]; then
    "$py" -m venv .venv-ref
    .venv-ref/bin/python -m pip install -q --upgrade pip
fi
stamp=".venv-ref/.installed-$(sha256sum scripts/reference-requirements.txt | cut -c1-16)"
if [ ! -f "$stamp" ]; then
    .venv-ref/bin/python -m pip install -q -r scripts/reference-requirements.txt
    touch "$stamp"
fi
