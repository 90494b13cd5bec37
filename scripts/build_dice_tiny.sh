#!/usr/bin/env bash
# Rebuild the embedded model dice-tiny end to end: CuKe-style data -> block-diffusion SFT -> BiC-RL (infill).
#
#   scripts/build_dice_tiny.sh corpus    # CPU (~2 min): real CUDA code (cuda-corpus, split by project and file,
#                                        #   deduplicated against the held-out side and realproj) + KernelBench
#                                        #   pairs (split by problem); BPE tokenizer; packed rows
#   scripts/build_dice_tiny.sh rltasks   # CPU (~5 min): .cu infill tasks (holes NVRTC can check) of the
#                                        #   training files (RL) and of the held-out files (RL's evaluation)
#   scripts/build_dice_tiny.sh pack      # CPU: only the training rows again (what corpus ends with); the rows
#                                        #   hold the training files as plain code too unless CODE_LM=0
#   scripts/build_dice_tiny.sh train     # GPU: block-diffusion SFT from random init (SFT_FROM=DIR: from that
#                                        #   checkpoint instead, a fresh LR schedule: more training for a model;
#                                        #   PACK=1: pack the rows first, when they are not there)
#   scripts/build_dice_tiny.sh rl        # GPU: BiC-RL phase infill from the SFT model, compile reward
#   scripts/build_dice_tiny.sh eval      # CPU: held-out holes of never-seen projects, validated as the product
#                                        #   validates (benchmarks/tiny_heldout.py), SFT and RL models; latency
#   scripts/build_dice_tiny.sh ship      # copy the chosen model (SHIP=rl|sft) into engine/models/dice-tiny
#                                        #   (SFT_CHAIN="RUN1 RUN2 ...": the SFT runs that continued each other;
#                                        #   SHIP_HOLES=byte|line: how its prompts are cut, default byte)
#   scripts/build_dice_tiny.sh smoke     # CPU: every stage above on a slice, a few steps (checks the script;
#                                        #   SMOKE=1 with one stage name runs that stage of it)
#
# DATA: the shared data folder (cuda-corpus, realproj, KernelBench, KernelBench PR-67, CUDA-L1; each SOURCE.md).
# MODEL: the config template (default training/configs/dice_tiny_realcode.json).
# The GPU stages read WORK and write RUN;
# on the device machine carry WORK's packed rows, tokenizer, init_config.json and rl/ (a few tens of MB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DATA=${DATA:-../shared/data}
WORK=${WORK:-runs/dice-tiny-data}
RUN=${RUN:-runs/dice-tiny}
MODEL=${MODEL:-training/configs/dice_tiny_realcode.json}
SHIP=${SHIP:-rl}
stage=${1:-all}

# SFT and RL budgets; the smoke stage shrinks everything. SFT runs until SFT_STEPS or SFT_MINUTES of training,
# whichever comes first, its cosine LR decaying over that same budget (--lr-schedule time).
SFT_STEPS=${SFT_STEPS:-12000}
SFT_MINUTES=${SFT_MINUTES:-9}
RL_STEPS=${RL_STEPS:-5}  # ~90 s a step on one H200 (benchmarks/results/dice_tiny_realcode_h200.md)
RL_TASKS=${RL_TASKS_PER_STEP:-64}
SEQ_LEN=${SEQ_LEN:-3072}
EVAL_HOLES=${EVAL_HOLES:-60}
CORPUS_EXTRA=()
RLTASKS_LIMIT=()
SFT_EXTRA=(--mixed-precision auto)
RL_EXTRA=()
if [[ $stage == smoke || ${SMOKE:-0} == 1 ]]; then
    WORK=${SMOKE_WORK:-runs/dice-tiny-smoke-data}
    RUN=${SMOKE_RUN:-runs/dice-tiny-smoke}
    SFT_STEPS=4 SFT_MINUTES=0 RL_STEPS=1 RL_TASKS=2 SEQ_LEN=2048 EVAL_HOLES=2
    CORPUS_EXTRA=(--holes-per-kb 0.05 --max-holes-per-file 2 --cu-variants 1)
    RLTASKS_LIMIT=(--limit 400)
    SFT_EXTRA=(--micro-batch-size 2 --attention dense --compile no --eval-rows 2 --final-eval-rows 2
        --lr-schedule steps)
    RL_EXTRA=(--group-size 2 --max-new-tokens 16 --rollout-rows 4 --micro-batch-size 2 --device cpu
        --validator-workers 2)
fi
# The training rows; PACK=1: packed by the train stage when absent (on the device: the .npz with the
# plain-code rows is over the carry limit), as safetensors (no compression time).
[[ ${PACK:-0} == 1 ]] && TRAIN_ROWS=${TRAIN_ROWS:-$WORK/train_rows.safetensors}
TRAIN_ROWS=${TRAIN_ROWS:-$WORK/train_rows.npz}

corpus() {
    "$PY" -m dice train corpus --data-dir "$DATA" --out "$WORK" --seed 0 --heldout-fraction 0.08 \
        --cu-variants 16 --holes-per-kb 1.0 --max-holes-per-file 32 --tokenizer-vocab 8192 \
        --model-template "$MODEL" "${CORPUS_EXTRA[@]}"
    pack_rows train "$TRAIN_ROWS"
    "$PY" -m dice train pack --examples "$WORK/heldout.jsonl.gz" --tokenizer "$WORK/tokenizer" \
        --seq-len "$SEQ_LEN" --block-size 4 --out "$WORK/heldout_rows.npz"
}

pack_rows() {  # SPLIT OUT: the split's examples, and (CODE_LM=1, the default) its files as plain-code rows:
    # the pre-training half a from-scratch model otherwise lacks (the held-out rows stay infill only, so
    # their loss compares across builds)
    local code=()
    [[ ${CODE_LM:-1} == 1 ]] && code=(--code-files "$WORK/$1_files.jsonl.gz")
    "$PY" -m dice train pack --examples "$WORK/$1.jsonl.gz" --tokenizer "$WORK/tokenizer" \
        --seq-len "$SEQ_LEN" --block-size 4 --out "$2" "${code[@]}"
}

rltasks() {
    # CuKe's .cu tasks, cut only from each side's files of the corpus split (train_files / heldout_files);
    # compile-only here (--no-gpu): the reward of a .cu task without a dice-spec is the compile check.
    # CuKe also holds some of its input out (cu_infill_heldout.jsonl); on the train side that part is
    # simply unused, on the held-out side cu_infill.jsonl is the evaluation set.
    for side in train heldout; do
        "$PY" -m dice cuke build --source "$WORK/${side}_files.jsonl.gz" --out "$WORK/rl/$side" --no-gpu \
            --cu-holes-per-file 8 "${RLTASKS_LIMIT[@]}"
    done
}

train() {
    export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
    local init=(--init-config "$WORK/init_config.json")
    [[ -n ${SFT_FROM:-} ]] && init=(--model "$SFT_FROM")
    if [[ ${PACK:-0} == 1 && ! -s $TRAIN_ROWS ]]; then
        local t0=$SECONDS
        pack_rows train "$TRAIN_ROWS" | tail -12 && echo "packed $TRAIN_ROWS in $((SECONDS - t0)) s"
    fi
    "$PY" -m dice train sft --data "$TRAIN_ROWS" --eval-data "$WORK/heldout_rows.npz" \
        "${init[@]}" --tokenizer "$WORK/tokenizer" --out "$RUN/sft" \
        --seq-len "$SEQ_LEN" --seed 0 --micro-batch-size 16 --lr "${SFT_LR:-2e-3}" --min-lr-ratio 0.1 --warmup-ratio 0.03 \
        --weight-decay 0.1 --max-steps "$SFT_STEPS" --max-minutes "$SFT_MINUTES" --lr-schedule time --log-every 20 \
        --eval-every 2000 --eval-rows 128 --final-eval-rows 512 --save-dtype bfloat16 "${SFT_EXTRA[@]}"
}

rl() {
    # Phase infill on the .cu tasks: reward 1 when the filled file compiles (NVRTC, device code), group
    # z-scores, TraceRL. The prompts are cut as the assistant cuts them for this model (its dice.json: whole
    # lines) inside a 5 KB window (the SFT examples were drawn from 1.5-6 KB; 6 KB prompts of symbol-dense files
    # overflow the 3,072-position context).
    # The held-out files' tasks (never trained on, by SFT or RL) are RL's model-selection set.
    local eval=()
    [[ -s $WORK/rl/heldout/cu_infill.jsonl ]] && eval=(--eval-tasks "$WORK/rl/heldout/cu_infill.jsonl")
    "$PY" -m dice train rl --phase infill --model "$RUN/sft/final" --out "$RUN/rl" \
        --tasks "$WORK/rl/train/cu_infill.jsonl" "${eval[@]}" \
        --steps "$RL_STEPS" --tasks-per-step "$RL_TASKS" --cu-window-bytes 5000 --max-new-tokens 64 \
        --lr 2e-5 --kl-mode ref --eval-every 8 --eval-max 128 --save-every 4 --seed 0 "${RL_EXTRA[@]}" \
        ${RL_ARGS:-}
}

evaluate() {
    for name in sft rl; do
        [[ -d $RUN/$name/final ]] || continue
        "$PY" benchmarks/tiny_heldout.py --model "$RUN/$name/final" --holes "$EVAL_HOLES" \
            --results "$RUN/eval-$name"
    done
}

ship() {
    dest=engine/models/dice-tiny
    src=$RUN/$SHIP/final
    rm -rf "$dest.new" && mkdir -p "$dest.new"
    cp "$src/"{config.json,model.safetensors,tokenizer.json,tokenizer_config.json,dice.json} "$dest.new/"
    # the resolved SFT configuration (an RL export carries its rl_config.json as well)
    for f in sft_config.json rl_config.json; do [[ -f $src/$f ]] && cp "$src/$f" "$dest.new/"; done
    [[ -f $dest.new/sft_config.json ]] || cp "$RUN/sft/final/sft_config.json" "$dest.new/"
    if [[ -n ${SFT_CHAIN:-} ]]; then
        # SFT_CHAIN="DIR1 DIR2 ...": the SFT runs that continued each other (SFT_FROM), the first from random
        # init: one set of curves and sft_stages.json (each run's configuration and summary)
        # shellcheck disable=SC2086
        "$PY" benchmarks/join_sft_curves.py --runs $SFT_CHAIN --out "$dest.new/" \
            --stages-out "$dest.new/sft_stages.json"
        cp "${SFT_CHAIN##* }/summary.json" "$dest.new/"
    else
        cp "$RUN/sft/"{loss_curve.csv,eval_curve.csv,loss_curve.png,summary.json} "$dest.new/"
    fi
    [[ -f $dest/MODEL_CARD.md ]] && cp "$dest/MODEL_CARD.md" "$dest.new/"
    # How the assistant cuts a hole's prompt for the shipped model (dice.json "infill_holes"): the training
    # examples are cut at whole lines, but dice-tiny v3 fills real projects' statement holes better when
    # prompted at the mask's bytes (benchmarks/results/dice_tiny_v3_hole_cut.md): SHIP_HOLES=line keeps the
    # training cut.
    "$PY" - "$dest.new/dice.json" "${SHIP_HOLES:-byte}" <<'PYEOF'
import json, sys
path, cut = sys.argv[1], sys.argv[2]
settings = json.load(open(path, encoding="utf-8"))
settings["infill_holes"] = cut
open(path, "w", encoding="utf-8").write(json.dumps(settings, indent=2) + "\n")
PYEOF
    rm -rf "$dest" && mv "$dest.new" "$dest"
}

case $stage in
    corpus) corpus ;;
    pack) pack_rows train "$TRAIN_ROWS" ;;
    rltasks) rltasks ;;
    train) train ;;
    rl) rl ;;
    eval) evaluate ;;
    ship) ship ;;
    gpu) train && rl ;;
    smoke) corpus && rltasks && train && rl && evaluate ;;
    all) corpus && rltasks && train && rl && evaluate && ship ;;
    *) echo "unknown stage $stage (corpus|pack|rltasks|train|rl|eval|ship|gpu|smoke|all)" >&2 && exit 2 ;;
esac
