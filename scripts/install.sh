#!/usr/bin/env bash
# Installs the project and everything the assistant and the tests use into the current Python.
# An existing torch (a CUDA build on a GPU machine, say) is kept; without one, the CPU wheel keeps the
# download small.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
"$PY" -c "import torch" 2>/dev/null || "$PY" -m pip install -q "torch==2.13.0"
"$PY" -m pip install -q -e ".[all]"
# Triton: the engine's fast GPU step (engine/triton_kernels.py). CUDA torch wheels bring the Triton they were
# built with; on a CPU-only torch the tests run those kernels in Triton's interpreter, which needs a Triton
# that works with NumPy >= 2.4 (3.9 or later).
if ! "$PY" -c "import torch, sys; sys.exit(0 if torch.version.cuda else 1)" 2>/dev/null; then
    "$PY" -c "import triton, sys; sys.exit(0 if tuple(map(int, triton.__version__.split('.')[:2])) >= (3, 9) else 1)" \
        2>/dev/null || "$PY" -m pip install -q "triton>=3.9"
fi

# The validator's sandbox: bubblewrap where it can run (a Debian package); without it the workers fall back
# to Landlock + seccomp (`dice doctor` says which is in force). Installed here only when this script runs as
# root with apt-get (CI, containers); elsewhere it says how, and never asks for a password.
if ! command -v bwrap >/dev/null 2>&1; then
    if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
        { timeout 180 apt-get install -y -q bubblewrap >/dev/null 2>&1 \
            || { timeout 180 apt-get update -q >/dev/null 2>&1 \
                && timeout 180 apt-get install -y -q bubblewrap >/dev/null 2>&1; }; } \
            || echo "note: bubblewrap could not be installed: the validator sandboxes with Landlock + seccomp" >&2
    else
        echo "note: no bwrap on PATH: the validator sandboxes with Landlock + seccomp;" \
            "'sudo apt-get install bubblewrap' gives it the stronger sandbox" >&2
    fi
fi
