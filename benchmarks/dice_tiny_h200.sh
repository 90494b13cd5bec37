#!/usr/bin/env bash
# Issue 21's GPU stages on one H200, in two device calls of < 10 min each (everything under $OUT).
# First, here (CPU): bash scripts/build_dice_tiny.sh corpus && bash scripts/build_dice_tiny.sh rltasks
#                    bash scripts/device_wheels.sh                      # .whl/: packages the image lacks
#                    bash scripts/build_dice_tiny.sh smoke              # the same stages on a slice, CPU
# Then each call, with carry [".whl", "runs/dice-tiny-data/train_rows.npz", "runs/dice-tiny-data/heldout_rows.npz",
#   "runs/dice-tiny-data/tokenizer", "runs/dice-tiny-data/init_config.json", "runs/dice-tiny-data/rl"]
#   (the second call also carries the first's sft/final, copied back to runs/dice-tiny/sft/final):
#   bash benchmarks/dice_tiny_h200.sh sft   # block-diffusion SFT, 8 min of training, export -> $OUT/sft
#   SFT_CONTINUE=1 bash benchmarks/dice_tiny_h200.sh sft   # the same, from the carried runs/dice-tiny/sft/final
#   PACK=1 ... sft   # pack the training rows on the device first (carry runs/dice-tiny-data/train.jsonl.gz and
#                    #   train_files.jsonl.gz instead of train_rows.npz: with the plain-code rows it is 33 MB)
#   bash benchmarks/dice_tiny_h200.sh rl    # BiC-RL phase infill (compile reward, 16 CPU cores) -> $OUT/rl
# The sft stage also leaves its export on the device as runs/dice-tiny/sft-next, so an rl call right after
# it on the same warm machine starts from it without carrying it back (RL_FROM=runs/dice-tiny/sft-next).
# The carry limit (64 MiB) counts the tracked files too (~30 MB, the shipped model included): to continue
# from the shipped model, copy engine/models/dice-tiny to runs/dice-tiny/sft/final on the device instead of
# carrying it (benchmarks/results/dice_tiny_v2_h100.md has the calls as run).
# The held-out evaluation (benchmarks/tiny_heldout.py, nvcc per candidate) runs back here on the CPU:
#   bash scripts/build_dice_tiny.sh eval
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
# Dry run on a CPU: SMOKE=1 NO_WHEELS=1 OUT=/tmp/dt bash benchmarks/dice_tiny_h200.sh sft (then rl, with
# runs/dice-tiny/sft/final copied from /tmp/dt/sft/final): the smoke stages of build_dice_tiny.sh, same paths.
export SMOKE_RUN=$OUT
if [[ ${NO_WHEELS:-0} != 1 ]] && ls .whl/*.whl > /dev/null 2>&1; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
        .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nvidia-smi --query-gpu=name,memory.total --format=csv

pack_final() {  # DIR ARCHIVE: DIR as ARCHIVE.part-aa, -ab, ... (15 MB each); here: cat parts | tar xz
    tar czf - -C "$(dirname "$1")" "$(basename "$1")" | split -b 15M - "$2.part-" && rm -rf "$1"
    ls -la "$2".part-*
}
case "${1:-sft}" in
sft)
    if [[ ${SFT_CONTINUE:-0} == 1 ]]; then
        [[ -d runs/dice-tiny/sft/final ]] || { echo "carry runs/dice-tiny/sft/final" && exit 2; }
        export SFT_FROM=runs/dice-tiny/sft/final
    fi
    RUN=$OUT SFT_MINUTES=${SFT_MINUTES:-8} timeout "${SFT_TIMEOUT:-570}" bash scripts/build_dice_tiny.sh train 2>&1 \
        | tee "$OUT/sft.log" | grep -v "━" | tail -40
    rm -rf "$OUT/sft/checkpoints"  # the resumable state: not needed back here
    # kept on the device for a following `rl` call on the same warm machine (RL_FROM=runs/dice-tiny/sft-next)
    rm -rf runs/dice-tiny/sft-next && mkdir -p runs/dice-tiny && cp -r "$OUT/sft/final" runs/dice-tiny/sft-next
    # At most 8 files of <= 16 MiB come back: final/ (19 MB of weights) travels as one archive in parts.
    pack_final "$OUT/sft/final" "$OUT/sft_final.tgz"
    ;;
rl)
    # RL_FROM: the SFT model (default the carried runs/dice-tiny/sft/final); RL_ARGS: more `dice train rl`
    # flags; E2E_TASKS=FILE: then E2E_STEPS of phase e2e from the infill run's final/ (E2E_TIMEOUT seconds).
    from=${RL_FROM:-runs/dice-tiny/sft/final}
    [[ -d $from ]] || { echo "no SFT model at $from (carry runs/dice-tiny/sft/final)" && exit 2; }
    mkdir -p "$OUT/sft" && cp -r "$from" "$OUT/sft/final"
    RUN=$OUT timeout "${RL_TIMEOUT:-570}" bash scripts/build_dice_tiny.sh rl 2>&1 | tee "$OUT/rl.log" | tail -60
    if [[ -n ${E2E_TASKS:-} && -d $OUT/rl/final ]]; then
        timeout "${E2E_TIMEOUT:-150}" python3 -m dice train rl --phase e2e --model "$OUT/rl/final" \
            --tasks "$E2E_TASKS" --out "$OUT/rl_e2e" --steps "${E2E_STEPS:-2}" --tasks-per-step 8 \
            --group-size 8 --max-new-tokens 512 --lr 2e-5 --kl-mode ref --eval-every 0 --seed 0 \
            --no-save-state 2>&1 | tee "$OUT/rl_e2e.log" | tail -30
    fi
    # a finished run needs only final/ back here (as an archive); one cut by the time limit leaves its last
    # checkpoint (--save-every 4) on the device only: too large and too many files to come back
    if [[ -d $OUT/rl/final ]]; then
        pack_final "$OUT/rl/final" "$OUT/rl_final.tgz"
    fi
    rm -rf "$OUT/rl/checkpoints" "$OUT/rl_e2e/final" "$OUT/rl_e2e/checkpoints"
    rm -rf "$OUT/sft" "$OUT/rl/schedule.jsonl" "$OUT/rl_e2e/schedule.jsonl"
    # at most 8 files come back: the runs' small files (metrics, curves, configs, logs) in one archive
    tar czf "$OUT/rl_runs.tgz" -C "$OUT" rl rl_e2e rl.log rl_e2e.log --ignore-failed-read 2>/dev/null
    rm -rf "$OUT/rl" "$OUT/rl_e2e"
    ls -la "$OUT"
    ;;
esac
