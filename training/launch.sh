#!/usr/bin/env bash
# Launch `dice train sft` through accelerate with NVLink multicast kept off (NCCL, PyTorch symmetric memory,
# NVSHMEM): on shared multi-GPU hosts a program using it can take the host's GPUs out of service.
#   training/launch.sh CONFIG [accelerate flags...] -- [dice train sft flags...]
#   e.g. training/launch.sh training/configs/fsdp.yaml --num_processes 8 -- --data runs/c/train.jsonl --model M
# Several nodes: run it on each node with --machine_rank R --main_process_ip HEAD (see fsdp_multinode.yaml).
set -euo pipefail
if [[ $# -lt 1 ]]; then
    sed -n '2,6p' "$0" >&2
    exit 2
fi
config=$1
shift
launch_args=()
while [[ $# -gt 0 && $1 != "--" ]]; do
    launch_args+=("$1")
    shift
done
[[ $# -gt 0 ]] && shift
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
# The accelerate console script is not on PATH in every environment (a venv's python3 alone): use the module.
launcher=(accelerate launch)
command -v accelerate >/dev/null || launcher=("${PYTHON:-python3}" -m accelerate.commands.launch)
exec "${launcher[@]}" --config_file "$config" "${launch_args[@]}" -m dice train sft "$@"
