#!/usr/bin/env bash
# The project's packages that the H200 device image lacks, as cp312 wheels in .whl/ (git-excluded), to be
# carried by `run` (carry [".whl", ...]) and installed there first:
#   python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
#       .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
# The image already has torch, numpy, safetensors, tokenizers, cupy-cuda13x, accelerate, matplotlib, pyarrow,
# rich, httpx, prometheus-client, tqdm (/work/.library/device/KINDS.md). Versions: the ones installed here.
# fastapi >= 0.16x imports opentelemetry-api (its telemetry hooks) and annotated-doc: without them the serving
# GPU tests failed at import on the H200 (2026-12-05).
set -euo pipefail
cd "$(dirname "$0")/.."
grep -qxF '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
mkdir -p .whl
names=(tree-sitter tree-sitter-cuda watchdog pygls lsprotocol cattrs fastapi starlette pydantic pydantic-core
    annotated-types typing-inspection uvicorn datasketch opentelemetry-api annotated-doc)
pins=()
for name in "${names[@]}"; do
    version=$(python3 -m pip show "$name" 2>/dev/null | awk '/^Version:/ {print $2}')
    [[ -n $version ]] || { echo "not installed here: $name" >&2; exit 1; }
    pins+=("$name==$version")
done
platforms=()
for tag in manylinux_2_28 manylinux_2_27 manylinux_2_24 manylinux_2_17 manylinux2014 manylinux1; do
    platforms+=(--platform "${tag}_x86_64")
done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl "${pins[@]}"
du -sh .whl && ls .whl
