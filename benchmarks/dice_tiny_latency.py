"""CPU latency of an inline completion with the embedded model: 32 new tokens through ``Engine.generate``.

The prompt is what the editor sends for a hole in a kernel (``engine.prompts.infill_prompt`` of a ~40-line
.cu file, response pre-filled with the prefix); ``stop_ids=[]`` forces exactly 32 new tokens. Reported: p50 /
p90 / min over repeats, per scenario (prefix cache off / typing into the hole with the cache warm / the same
prompt again, see SCENARIOS) and decoding policy, with the prompt length, torch threads and the machine's
load average (this machine is shared, so load is part of the measurement).

  python benchmarks/dice_tiny_latency.py [--model DIR] [--repeats 20] [--scenarios cold,edit,repeat]
      [--out benchmarks/results]
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


TYPED = "float e = expf(x[row * cols + c] - max_val);"  # what the user types into the hole, key by key

SCENARIOS = {
    "cold": "prefix cache off: every request prefills its whole prompt",
    "edit": "the editor's steady state: each request follows one more keystroke typed into the hole of the "
    "same file, so the previous request's prompt is cached and only what follows the hole is prefilled",
    "repeat": "the same prompt again (the next candidate of one request): nothing to prefill",
}


def measure(engine, prompt_for, args, policy: str, extra: dict) -> dict:
    """Times ``repeats`` requests; ``prompt_for(r)`` is request r's prompt (r = -1: the warm-up)."""
    engine.generate(prompt_for(-1), max_new_tokens=args.new_tokens, policy=policy, stop_ids=[], **extra)
    pc = engine.prefix_cache
    reused_before = pc.reused_tokens if pc else 0
    times, prompt_tokens = [], []
    for r in range(args.repeats):
        ids = prompt_for(r)
        prompt_tokens.append(len(ids))
        t0 = time.perf_counter()
        out = engine.generate(ids, max_new_tokens=args.new_tokens, policy=policy, stop_ids=[], **extra)
        times.append(time.perf_counter() - t0)
        assert len(out.ids[0]) == args.new_tokens
    times.sort()
    return {
        "p50_ms": round(1e3 * statistics.median(times), 1),
        "p90_ms": round(1e3 * times[int(0.9 * (len(times) - 1))], 1),
        "min_ms": round(1e3 * times[0], 1),
        "denoising_forwards": out.steps,
        "prompt_tokens_mean": round(statistics.mean(prompt_tokens)),
        # prompt tokens whose K/V came from the prefix cache, per timed request
        "reused_prompt_tokens_mean": round((pc.reused_tokens - reused_before) / len(times)) if pc else 0,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded dice-tiny)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--scenarios",
        default="cold,edit,repeat",
        help="comma-separated, of: " + "; ".join(f"{k}: {v}" for k, v in SCENARIOS.items()),
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for dice_tiny_cpu_latency.json")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    if unknown := set(scenarios) - set(SCENARIOS):
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {sorted(SCENARIOS)}")
    if args.repeats >= len(TYPED):
        parser.error(f"--repeats must be below {len(TYPED)} (one keystroke per request)")

    from engine import load_engine
    from engine.prompts import infill_prompt

    hole = KERNEL_FILE.index("/* <MASK> */")
    prefix, suffix = KERNEL_FILE[:hole], KERNEL_FILE[hole + len("/* <MASK> */") :]
    engines = {}
    load_average = {}

    def encode(engine, typed: str) -> list[int]:
        prompt, response_prefix = infill_prompt(prefix + typed, suffix)
        return engine.tokenizer.encode(prompt + response_prefix)

    results: dict[str, dict] = {}
    for scenario in scenarios:
        cache = 0 if scenario == "cold" else 4
        if cache not in engines:
            engines[cache] = load_engine(args.model, device="cpu", prefix_cache_entries=cache)
        engine = engines[cache]
        if scenario == "edit":
            offset = {"n": 0}  # each policy types on from where the previous one stopped

            def prompt_for(r: int, engine=engine, offset=offset) -> list[int]:
                offset["n"] += 1
                return encode(engine, TYPED[: offset["n"] % len(TYPED)])
        else:
            fixed = encode(engine, "")

            def prompt_for(r: int, fixed=fixed) -> list[int]:
                return fixed

        results[scenario] = {}
        for policy, extra in (("static", {"steps_per_block": 4}), ("dynamic", {"threshold": 0.9})):
            results[scenario][policy] = measure(engine, prompt_for, args, policy, extra)
            print(scenario, policy, results[scenario][policy], flush=True)
        load_average[scenario] = [round(x, 2) for x in os.getloadavg()]
    engine = next(iter(engines.values()))
    report = {
        "model": str(engine.path),
        "parameters": engine.num_parameters,
        "prompt_tokens": len(encode(engine, "")),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "scenarios": {k: SCENARIOS[k] for k in scenarios},
        "results": results,
        "torch_threads_prefill_and_decode": 1,
        "cpu_count": os.cpu_count(),
        "load_average_after_each_scenario": load_average,
        "cpu": platform.processor() or platform.machine(),
        "torch": torch.__version__,
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
    }
    print(json.dumps(report, indent=2))
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "dice_tiny_cpu_latency.json").write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
