#!/usr/bin/env bash
# Starts the server on the embedded default models, converting them first when models/ is missing or stale.
# Extra arguments go to `python -m edge_runtime serve` (for example --port 8200).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh convert
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
.venv/bin/python -m converters default --out models
exec .venv/bin/python -m edge_runtime serve --models models.yaml "$@"
