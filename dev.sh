#!/bin/bash
# issue 15, session 3, call 3: runner cost with .cu runs (CuPy's cache moved into the runner's own), and an
# agreement subset WITH timing (fresh inputs every round) and the dependence check (tight "same output").
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 DICE_SHARED_DATA=$PWD/.whl/data DICE_CACHE_DIR=$PWD/build/dc
log=$OUT/gpu_tests.log
echo "## $(date -u +%FT%TZ) runner_cost --candidates 4 --cu 6" | tee -a $log
timeout 100 python3 benchmarks/runner_cost.py --candidates 4 --cu 6 --out $OUT/runner_cost.jsonl 2>&1 | grep -v NVML | tail -12 | cut -c1-600
echo "## $(date -u +%FT%TZ) agreement subset b (40, --pr67-timing)" | tee -a $log
timeout 300 python3 benchmarks/validator_agreement.py --tasks build/agreement_s15b.jsonl --workers 16 --pr67-timing \
  --shuffle-seed -1 --budget-s 220 --grace-s 50 --out-dir $OUT/agree 2>&1 | tail -6
echo "## $(date -u +%FT%TZ) done" | tee -a $log
