#!/usr/bin/env bash
# Installs everything the tests use, then runs lint, the VS Code client tests and the Python tests (CPU).
# GPU tests carry the `gpu` marker and skip here; run them on a GPU machine with `pytest -m gpu`.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}

bash scripts/install.sh

"$PY" -m ruff check .
"$PY" -m ruff format --check .
# the layers of docs/INTERNALS.md (contracts in pyproject.toml)
"$PY" -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())' \
    --no-cache

if [ -f vscode-client/package.json ]; then
    (cd vscode-client && npm ci --no-audit --no-fund && npm test)
fi

set +e
"$PY" -m pytest -q "$@"
status=$?
set -e
if [ "$status" -eq 5 ]; then
    echo "pytest collected no tests: the suite is missing, which is a failure" >&2
fi
exit "$status"
