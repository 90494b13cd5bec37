#!/usr/bin/env bash
# Installs the project and everything the assistant and the tests use into the current Python.
# An existing torch (a CUDA build on a GPU machine, say) is kept; without one, the CPU wheel keeps the
# download small.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[all]"
