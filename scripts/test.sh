#!/usr/bin/env bash
# The whole test suite on a fresh machine: installs everything, builds fixtures in the session, runs pytest.
# Extra arguments go to pytest (for example: scripts/test.sh -m heavy).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/bootstrap.sh convert,test
scripts/reference_env.sh  # Transformers 5, for Decision 3.0 parity tests only
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false
exec .venv/bin/python -m pytest "$@"
