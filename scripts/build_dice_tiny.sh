#!/usr/bin/env bash
# Rebuild the embedded model dice-tiny exactly as shipped in engine/models/dice-tiny.
#   scripts/build_dice_tiny.sh corpus   # CPU: corpus + held-out split + BPE tokenizer + packed rows (~5 min)
#   scripts/build_dice_tiny.sh train    # GPU (one H200, ~7 min): block-diffusion SFT from random init
#   scripts/build_dice_tiny.sh ship     # copy the trained model into engine/models/dice-tiny
# DATA: the shared data folder (KernelBench, KernelBench PR-67, CUDA-L1; see each SOURCE.md).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=${DATA:-../shared/data}
WORK=${WORK:-runs/dice-tiny-data}
RUN=${RUN:-runs/dice-tiny}
stage=${1:-all}

if [[ $stage == corpus || $stage == all ]]; then
    "$PY" -m dice train corpus --data-dir "$DATA" --out "$WORK" --seed 0 --heldout-fraction 0.08 \
        --cu-variants 16 --tokenizer-vocab 4096 --model-template training/configs/dice_tiny.json
    for split in train heldout; do
        "$PY" -m dice train pack --examples "$WORK/$split.jsonl.gz" --tokenizer "$WORK/tokenizer" \
            --seq-len 4096 --block-size 4 --out "$WORK/${split}_rows.npz"
    done
fi

if [[ $stage == train || $stage == all ]]; then
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    "$PY" -m dice train sft --data "$WORK/train_rows.npz" --eval-data "$WORK/heldout_rows.npz" \
        --init-config "$WORK/init_config.json" --tokenizer "$WORK/tokenizer" --out "$RUN" \
        --seed 0 --micro-batch-size 16 --lr 2e-3 --min-lr-ratio 0.1 --warmup-ratio 0.03 --weight-decay 0.1 \
        --max-steps 8000 --max-minutes 7 --log-every 20 --eval-every 2000 --eval-rows 128 \
        --final-eval-rows 1052 --save-dtype bfloat16
fi

if [[ $stage == ship || $stage == all ]]; then
    dest=engine/models/dice-tiny
    mkdir -p "$dest"
    cp "$RUN/final/"{config.json,model.safetensors,sft_config.json} "$dest/"
    cp "$WORK/tokenizer/"{tokenizer.json,tokenizer_config.json} "$dest/"
    cp "$RUN/"{loss_curve.csv,eval_curve.csv,loss_curve.png,summary.json} "$dest/"
fi
