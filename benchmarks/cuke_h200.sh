#!/usr/bin/env bash
# Issue 19 on one H200: `dice cuke build` with the GPU validator (correct under the full protocol, >= 2x
# faster than eager PyTorch, timed live) over the KernelBench-format pairs, in one device call.
#
# The pairs travel in .devdata/ (git-excluded; ../shared does not travel with a call):
#   mkdir -p .devdata/kernelbench && cp -r ../shared/data/kernelbench-pr67-dsr1 ../shared/data/cuda-l1 .devdata/ \
#     && cp ../shared/data/kernelbench/{problems.jsonl,SOURCE.md,LICENSE} .devdata/kernelbench/
#   bash scripts/device_wheels.sh                          # .whl/: packages the image lacks
# then run with carry [".whl", ".devdata"]:
#   LIMIT=12 bash benchmarks/cuke_h200.sh                  # a probe: 12 records per source
#   bash benchmarks/cuke_h200.sh                           # everything (LIMIT=0), under BUILD_TIMEOUT
# Back under $OUT (at most 8 files): build.log, card.md, report.json, report.png, sft.jsonl, and the
# build's cache packed as cache.tgz (a later call resumes from it: CACHE_IN=path/to/cache.tgz, carried).
# Dry run on a CPU: NO_WHEELS=1 LIMIT=4 EXTRA=--no-gpu OUT=/tmp/ck bash benchmarks/cuke_h200.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
LIMIT=${LIMIT:-0}
BUILD_TIMEOUT=${BUILD_TIMEOUT:-480}
mkdir -p "$OUT"
if [[ ${NO_WHEELS:-0} != 1 ]] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl 2>&1 | grep -v "already exists" || true
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,memory.total --format=csv
BUILD=/tmp/cuke-build
rm -rf "$BUILD" && mkdir -p "$BUILD"
if [[ -n ${CACHE_IN:-} && -f $CACHE_IN ]]; then
    tar xzf "$CACHE_IN" -C "$BUILD" && echo "resuming from $CACHE_IN"
fi
sources=()
for s in .devdata/kernelbench-pr67-dsr1 .devdata/cuda-l1 .devdata/kernelbench/problems.jsonl; do
    [[ -e $s ]] && sources+=(--source "$s")
done
limit=()
((LIMIT > 0)) && limit=(--limit "$LIMIT")
start=$SECONDS
# shellcheck disable=SC2086
timeout -k 10 "$BUILD_TIMEOUT" python3 -m dice.cli cuke build "${sources[@]}" "${limit[@]}" --out "$BUILD" \
    ${EXTRA:-} 2>&1 | tee "$OUT/build.log" | tail -40
echo "build rc=${PIPESTATUS[0]} after $((SECONDS - start)) s" | tee -a "$OUT/build.log"
for f in card.md report.json report.png sft.jsonl; do
    [[ -f $BUILD/$f ]] && cp "$BUILD/$f" "$OUT/"
done
[[ -d $BUILD/cache ]] && tar czf "$OUT/cache.tgz" -C "$BUILD" cache && ls -la "$OUT/cache.tgz"
