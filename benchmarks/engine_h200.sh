#!/usr/bin/env bash
# Issue 17 on one H200, in two device calls of < 10 min each (results under $OUT):
#   bash benchmarks/engine_h200.sh check   # GPU tests of the engine + kernel sweep + per-kernel profile
#   bash benchmarks/engine_h200.sh bench   # engine_bench.py: step times (torch graph, Triton, compiled) + rates
# Dry run on a CPU first: python benchmarks/engine_kernels.py --smoke-cpu --out /tmp/k;
#                         python benchmarks/engine_bench.py --smoke-cpu --steps-only --out /tmp/b
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# The packages the device image lacks (tree-sitter, pygls, ... for the test suite's imports): .whl/ from
# scripts/device_wheels.sh, carried with the call (carry [".whl"]).
if [[ ${NO_WHEELS:-0} != 1 ]] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
case "${1:-check}" in
check)
    timeout 200 python3 -m pytest -q -m gpu tests/engine -p no:cacheprovider 2>&1 | tail -15 | tee "$OUT/gpu_tests.log"
    timeout 120 python3 -m pytest -q tests/engine/test_triton_kernels.py -p no:cacheprovider 2>&1 | tail -3 \
        | tee -a "$OUT/gpu_tests.log"
    timeout 220 python3 benchmarks/engine_kernels.py --out "$OUT" 2>&1 | tee "$OUT/kernels.log" | tail -40
    ;;
bench)
    timeout 560 python3 benchmarks/engine_bench.py --out "$OUT" --budget-s 300 --new-tokens 128 \
        --hf-new-tokens 32 --compile 2>&1 | tail -60
    ;;
esac
