#!/usr/bin/env bash
# Installs everything the tests use, then runs lint, the Python tests (CPU) and the VS Code client tests.
# GPU tests carry the `gpu` marker and skip here; run them on a GPU machine with `pytest -m gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash scripts/install.sh

"$PY" -m ruff check .

set +e
"$PY" -m pytest -q "$@"
status=$?
set -e
# pytest exits 5 when nothing was collected; that is a failure of the suite, not a pass.
if [ "$status" -ne 0 ]; then
    exit "$status"
fi

if [ -f vscode-client/package.json ]; then
    (cd vscode-client && npm ci --no-audit --no-fund && npm test)
fi
