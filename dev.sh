#!/bin/bash
# issue 15, session 3: GPU tests of the judged .cu path, fresh timing inputs, the dependence check; then
# the agreement subset, runner cost and the degenerate tests. Results under $OUT as they come.
set -u
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD TORCH_CUDA_ARCH_LIST=9.0 DICE_SHARED_DATA=$PWD/.whl/data DICE_CACHE_DIR=$PWD/build/dc
part=${1:-1}
log=$OUT/gpu_tests.log
if [ "$part" = 1 ]; then
  echo "## $(date -u +%FT%TZ) part 1 on $(nvidia-smi --query-gpu=name --format=csv,noheader)" | tee -a $log
  echo "## DICE_GPU_TEST_PROBLEMS=5,19,47 pytest -m gpu test_judge test_cu_seeds test_gpu" | tee -a $log
  DICE_GPU_TEST_PROBLEMS=5,19,47 timeout 520 python3 -m pytest -q -m gpu -W ignore::FutureWarning \
    tests/validator/test_judge.py tests/validator/test_cu_seeds.py tests/validator/test_gpu.py \
    --durations=12 2>&1 | tail -60 | tee -a $log
fi
if [ "$part" = 2 ]; then
  echo "## $(date -u +%FT%TZ) part 2: runner_cost --candidates 4 --cu 5" | tee -a $log
  timeout 120 python3 benchmarks/runner_cost.py --candidates 4 --cu 5 --out $OUT/runner_cost.jsonl 2>&1 | tail -12 | cut -c1-700
  echo "## $(date -u +%FT%TZ) agreement subset (103)" | tee -a $log
  timeout 330 python3 benchmarks/validator_agreement.py --tasks build/agreement_s15.jsonl --workers 16 \
    --shuffle-seed -1 --budget-s 230 --grace-s 40 --out-dir $OUT/agree 2>&1 | tail -8
  echo "## $(date -u +%FT%TZ) degenerate" | tee -a $log
  timeout 110 python3 -m pytest -q -m gpu -W ignore::FutureWarning tests/validator/test_degenerate.py 2>&1 | tail -5 | tee -a $log
fi
