#!/usr/bin/env bash
# Issue 17 on one H200 (results under $OUT):
#   bash benchmarks/engine_h200.sh final   # one call of < 560 s: GPU tests, sweep -> tuned-config table,
#                                          # engine_bench with the table, profile with the table (see below)
#   bash benchmarks/engine_h200.sh bench   # engine_bench.py with --compile: adds the torch.compile'd step
# Dry run on a CPU first: python benchmarks/engine_kernels.py --smoke-cpu --out /tmp/k --write-configs;
#                         python benchmarks/engine_bench.py --smoke-cpu --out /tmp/b
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
MODE=${1:-final}
mkdir -p "$OUT"
# The packages the device image lacks (tree-sitter, pygls, ... for the test suite's imports): .whl/ from
# scripts/device_wheels.sh, carried with the call (carry [".whl"]).
if [[ ${NO_WHEELS:-0} != 1 ]] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1

# final: every step under its own timeout, each cut to what is left before DEADLINE_S seconds of this
# script (the device call's limit is 600 s). At most 8 files come back from $OUT; this mode writes 7:
# gpu_tests.log, final.log (everything else printed), engine_kernels_sweep.json, <gpu>.json (the tuned
# table, also written into engine/kernel_configs/ there, where (c) and (d) read it), engine_h200.json,
# engine_h200.md, engine_kernels_profile.json. (b) runs no profile and (d) no sweep: neither overwrites
# the other's file.
DEADLINE_S=${DEADLINE_S:-550}  # a call with less device time left: DEADLINE_S=400
left() {  # seconds for the next step: its cap, or what is left before the deadline if less
    local cap=$1 rest=$((DEADLINE_S - SECONDS))
    echo $((cap < rest ? cap : rest))
}
step() {  # step CAP COMMAND...: run it under timeout, say how long it took and how it ended
    local t
    t=$(left "$1")
    shift
    if ((t < 15)); then
        echo "=== [${SECONDS}s] SKIPPED, deadline: $*"
        return 124
    fi
    echo "=== [${SECONDS}s] (timeout ${t}s) $*"
    timeout -k 5 "$t" "$@"
    local rc=$?
    echo "=== [${SECONDS}s] rc=$rc$( ((rc == 124 || rc == 137)) && echo ' (TIMED OUT)')"
    return $rc
}
final() {
    nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv
    # (a) both test runs at once (correctness only, nothing timed; 16 cores for their compiles)
    local t
    t=$(left 140)
    echo "=== [${SECONDS}s] (timeout ${t}s each, in parallel) GPU tests -> $OUT/gpu_tests.log"
    timeout -k 5 "$t" python3 -m pytest -q tests/engine/test_triton_kernels.py -p no:cacheprovider \
        --tb=short -rf --basetemp=/tmp/pytest_triton > /tmp/tests_triton.log 2>&1 &
    local p1=$!
    timeout -k 5 "$t" python3 -m pytest -q -m gpu tests/engine -p no:cacheprovider --tb=short -rf \
        --basetemp=/tmp/pytest_gpu > /tmp/tests_gpu.log 2>&1 &
    local p2=$!
    wait $p1
    local rc1=$?
    wait $p2
    local rc2=$?
    {
        echo "### pytest -q tests/engine/test_triton_kernels.py (bf16 on the GPU): rc=$rc1"
        cat /tmp/tests_triton.log
        echo
        echo "### pytest -q -m gpu tests/engine: rc=$rc2"
        cat /tmp/tests_gpu.log
    } > "$OUT/gpu_tests.log"
    echo "triton kernels tests rc=$rc1: $(tail -n 1 /tmp/tests_triton.log)"
    echo "gpu tests rc=$rc2: $(tail -n 1 /tmp/tests_gpu.log)"
    # (b) the sweep, CUDA-graph timed; writes engine/kernel_configs/<gpu>.json and its copy in $OUT
    t=$(left 150)
    step 150 python3 benchmarks/engine_kernels.py --skip-profile --write-configs --out "$OUT" \
        --sweep-budget-s $((t * 3 / 4))
    # (c) the engine bench, with the table (skinny_config looks it up); --budget-s 0: no HF compile
    step 150 python3 benchmarks/engine_bench.py --out "$OUT" --budget-s 0 --new-tokens 128 --hf-new-tokens 32
    # (d) the per-kernel profile, with the table
    step 90 python3 benchmarks/engine_kernels.py --skip-sweep --out "$OUT"
    ls -la "$OUT" engine/kernel_configs
    echo "=== [${SECONDS}s] final done"
}

case "$MODE" in
bench)
    nvidia-smi --query-gpu=name,memory.total,clocks.sm --format=csv | tee "$OUT/gpu.txt"
    timeout 560 python3 benchmarks/engine_bench.py --out "$OUT" --budget-s 300 --new-tokens 128 \
        --hf-new-tokens 32 --compile 2>&1 | tail -60
    ;;
final)
    final 2>&1 | tee "$OUT/final.log"
    ;;
*)
    echo "usage: $0 final|bench" >&2
    exit 2
    ;;
esac
