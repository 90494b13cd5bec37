"""CPU latency of an inline completion with the embedded model: 32 new tokens through ``Engine.generate``.

The prompt is what the editor sends for a hole in a kernel (``engine.prompts.infill_prompt`` of a ~40-line
.cu file, response pre-filled with the prefix); ``stop_ids=[]`` forces exactly 32 new tokens. Reported: p50 /
p90 / min over repeats, per decoding policy, with the prompt length, torch threads and the machine's load
average (this machine is shared, so load is part of the measurement).

  python benchmarks/dice_tiny_latency.py [--model DIR] [--repeats 20] [--out benchmarks/results]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import torch

KERNEL_FILE = """#include <cuda_runtime.h>

#define BLOCK 256

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_down_sync(0xffffffff, v, offset);
    }
    return v;
}

__global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows, int cols) {
    int row = blockIdx.x;
    if (row >= rows) return;
    __shared__ float shared[BLOCK];
    float max_val = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        max_val = fmaxf(max_val, x[row * cols + c]);
    }
    shared[threadIdx.x] = max_val;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    max_val = shared[0];
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        /* <MASK> */
    }
    sum = warp_sum(sum);
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        y[row * cols + c] /= sum;
    }
}
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded dice-tiny)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--out", type=Path, default=None, help="folder for dice_tiny_cpu_latency.json")
    args = parser.parse_args()

    from engine import load_engine
    from engine.prompts import infill_prompt

    engine = load_engine(args.model, device="cpu")
    hole = KERNEL_FILE.index("/* <MASK> */")
    prefix, suffix = KERNEL_FILE[:hole], KERNEL_FILE[hole + len("/* <MASK> */") :]
    prompt, response_prefix = infill_prompt(prefix, suffix)
    ids = engine.tokenizer.encode(prompt + response_prefix)
    results = {}
    for policy, extra in (("static", {"steps_per_block": 4}), ("dynamic", {"threshold": 0.9})):
        engine.generate(ids, max_new_tokens=args.new_tokens, policy=policy, stop_ids=[], **extra)  # warm-up
        times = []
        for _ in range(args.repeats):
            t0 = time.perf_counter()
            out = engine.generate(ids, max_new_tokens=args.new_tokens, policy=policy, stop_ids=[], **extra)
            times.append(time.perf_counter() - t0)
            assert len(out.ids[0]) == args.new_tokens
        times.sort()
        results[policy] = {
            "p50_ms": round(1e3 * statistics.median(times), 1),
            "p90_ms": round(1e3 * times[int(0.9 * (len(times) - 1))], 1),
            "min_ms": round(1e3 * times[0], 1),
            "denoising_forwards": out.steps,
        }
        print(policy, results[policy], flush=True)
    # Prefill alone: one block of new tokens committed in one step.
    t_prefill = []
    for _ in range(max(3, args.repeats // 4)):
        t0 = time.perf_counter()
        engine.generate(ids, max_new_tokens=4, policy="static", steps_per_block=1, stop_ids=[])
        t_prefill.append(time.perf_counter() - t0)
    report = {
        "model": str(engine.path),
        "parameters": engine.num_parameters,
        "prompt_tokens": len(ids),
        "new_tokens": args.new_tokens,
        "prefill_plus_one_block_p50_ms": round(1e3 * statistics.median(t_prefill), 1),
        "policies": results,
        "torch_threads": torch.get_num_threads(),
        "cpu_count": os.cpu_count(),
        "load_average": os.getloadavg(),
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dice_tiny_cpu_latency.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
