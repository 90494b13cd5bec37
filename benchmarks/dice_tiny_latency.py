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
import sys
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
    "newfile": "a file the cache has not seen (a different first line each time) after other files: only the "
    "template's fixed opening is reused, the file and everything after it is prefilled",
}


def summary(times: list[float]) -> dict:
    times = sorted(times)
    return {
        "p50_ms": round(1e3 * statistics.median(times), 1),
        "p90_ms": round(1e3 * times[int(0.9 * (len(times) - 1))], 1),
        "min_ms": round(1e3 * times[0], 1),
    }


def thread_check(engine, prompt: list[int], remainder: int, repeats: int) -> dict:
    """Prefill forwards (whole prompt / the edit's remainder, at its slots) and one decode step after the
    prompt, each with 1 and 2 threads, interleaved."""
    runner = engine.runner
    cache = runner.new_cache(1, len(prompt) + 64, 4)
    cache.reset([0])
    shapes = {
        "prefill_full": len(prompt) // 4 * 4,
        "prefill_edit_remainder": remainder // 4 * 4,
        "decode_step": 8,
    }
    times: dict[str, list[float]] = {f"{k}_{t}thr": [] for k in shapes for t in (1, 2)}
    before = torch.get_num_threads()
    with torch.inference_mode():
        for _ in range(repeats):
            for name, width in shapes.items():
                full = shapes["prefill_full"]
                start = full if name == "decode_step" else full - width  # the remainder ends the prompt
                ids = torch.tensor([(prompt[:full] + [0] * width)[start : start + width]])
                pos = start + torch.arange(width)[None]
                for threads in (1, 2):
                    torch.set_num_threads(threads)
                    t0 = time.perf_counter()
                    if name == "decode_step":  # previous block + current one, as the decode loop runs them
                        runner.step(cache, ids, pos, torch.tensor([start]), 4)
                    else:
                        runner.prefill(cache, ids, pos, start)
                    times[f"{name}_{threads}thr"].append(time.perf_counter() - t0)
    torch.set_num_threads(before)
    out = {k: summary(v[1:]) for k, v in times.items()}  # first round: warm-up
    out["tokens"] = shapes
    return out


def first_request_check(model, prompt: list[int], new_tokens: int, repeats: int) -> dict:
    """The first request after loading, with and without ``Engine.prime_prefix_cache`` (what the assistant
    service runs right after it loads a model), alternating, a fresh engine each time; dynamic policy."""
    from engine import load_engine

    times: dict[str, list[float]] = {"primed": [], "not_primed": []}
    priming: list[float] = []
    for _ in range(repeats):
        for mode in times:
            engine = load_engine(model, device="cpu")
            engine.generate(prompt[:64], max_new_tokens=4, stop_ids=[])  # first-forward start-up costs
            engine.clear_prefix_cache()
            if mode == "primed":
                t0 = time.perf_counter()
                engine.prime_prefix_cache()
                priming.append(time.perf_counter() - t0)
            time.sleep(0.3)  # as between loading and the first keystroke
            t0 = time.perf_counter()
            engine.generate(prompt, max_new_tokens=new_tokens, policy="dynamic", threshold=0.9, stop_ids=[])
            times[mode].append(time.perf_counter() - t0)
    return {**{k: summary(v) for k, v in times.items()}, "priming_at_load": summary(priming)}


def main() -> None:
    """Long on purpose: the whole measurement protocol, read top to bottom in the order it runs (a
    benchmark script, as nanochat's are); split into helpers, the protocol would be scattered."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="checkpoint folder (default: the embedded dice-tiny)")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument(
        "--scenarios",
        default="cold,newfile,edit,repeat",
        help="comma-separated, timed round-robin (each sees the same machine load), of: "
        + "; ".join(f"{k}: {v}" for k, v in SCENARIOS.items()),
    )
    parser.add_argument(
        "--thread-repeats", type=int, default=6, help="rounds of the 1 vs 2 thread check (0: skip)"
    )
    parser.add_argument(
        "--thread-modes",
        default="1,auto",
        help="comma-separated intra-op thread policies, timed round-robin with the scenarios: 1 (always one "
        "thread, the engine's policy before engine.cpu_threads), auto (the engine's default: the cores other "
        "processes left idle since the previous request), or a fixed count",
    )
    parser.add_argument(
        "--first-repeats",
        type=int,
        default=6,
        help="rounds of the first-request-after-loading check, primed vs not (0: skip)",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for dice_tiny_cpu_latency.json")
    args = parser.parse_args()
    scenarios = args.scenarios.split(",")
    if unknown := set(scenarios) - set(SCENARIOS):
        parser.error(f"unknown scenario(s) {sorted(unknown)}; choose from {sorted(SCENARIOS)}")
    modes = args.thread_modes.split(",")
    if any(m != "auto" and not (m.isdigit() and int(m) >= 1) for m in modes):
        parser.error(f"--thread-modes: 'auto' or positive integers, got {args.thread_modes!r}")
    if 2 * (args.repeats + 1) >= len(TYPED):
        parser.error(f"--repeats must be below {len(TYPED) // 2 - 1} (one keystroke per request)")

    from engine import load_engine
    from engine.cpu_threads import ENV, CpuThreadPolicy
    from engine.prompts import infill_prompt

    hole = KERNEL_FILE.index("/* <MASK> */")
    prefix, suffix = KERNEL_FILE[:hole], KERNEL_FILE[hole + len("/* <MASK> */") :]
    # One engine per (scenario, thread mode), so one's cache entries never help another's.
    runs = [(sc, mode) for sc in scenarios for mode in modes]
    engines = {}
    for sc, mode in runs:
        engine = load_engine(args.model, device="cpu", prefix_cache_entries=0 if sc == "cold" else 4)
        engine.cpu_threads = CpuThreadPolicy(cap=torch.get_num_threads(), env={ENV: mode})
        engines[sc, mode] = engine
    tokenizer = next(iter(engines.values())).tokenizer
    typed = {mode: 0 for mode in modes}
    files = {mode: 0 for mode in modes}

    def encode(text: str, head: str = "") -> list[int]:
        prompt, response_prefix = infill_prompt(head + prefix + text, suffix)
        return tokenizer.encode(prompt + response_prefix)

    base = encode("")

    def prompt_for(scenario: str, mode: str) -> list[int]:
        if scenario == "newfile":
            files[mode] += 1
            return encode("", head=f"// tile_{files[mode]}.cu\n")
        if scenario != "edit":
            return base
        typed[mode] += 1  # one more keystroke since the last request
        return encode(TYPED[: typed[mode]])

    results: dict[str, dict] = {sc: {mode: {} for mode in modes} for sc in scenarios}
    load_samples: list[float] = []
    for policy, extra in (("static", {"steps_per_block": 4}), ("dynamic", {"threshold": 0.9})):
        kwargs = {"max_new_tokens": args.new_tokens, "policy": policy, "stop_ids": [], **extra}
        for run in runs:  # warm-up: the first request (cold for every engine)
            engines[run].generate(prompt_for(*run), **kwargs)
        times: dict[tuple, list[float]] = {run: [] for run in runs}
        tokens: dict[tuple, list[int]] = {run: [] for run in runs}
        chosen: dict[tuple, list[int]] = {run: [] for run in runs}
        reused = {run: e.prefix_cache.reused_tokens if e.prefix_cache else 0 for run, e in engines.items()}
        steps = {}
        for _ in range(args.repeats):
            for run in runs:
                ids = prompt_for(*run)
                tokens[run].append(len(ids))
                t0 = time.perf_counter()
                out = engines[run].generate(ids, **kwargs)
                times[run].append(time.perf_counter() - t0)
                assert len(out.ids[0]) == args.new_tokens
                steps[run] = out.steps
                chosen[run].append(engines[run].cpu_threads.last_choice)
            load_samples.append(os.getloadavg()[0])
        for run in runs:
            pc = engines[run].prefix_cache
            sc, mode = run
            results[sc][mode][policy] = {
                **summary(times[run]),
                "denoising_forwards": steps[run],
                "prompt_tokens_mean": round(statistics.mean(tokens[run])),
                # prompt tokens whose K/V came from the prefix cache, per timed request
                "reused_prompt_tokens_mean": round((pc.reused_tokens - reused[run]) / args.repeats)
                if pc
                else 0,
                # requests per thread count the policy chose
                "threads_chosen": {str(n): chosen[run].count(n) for n in sorted(set(chosen[run]))},
            }
            print(sc, f"threads={mode}", policy, results[sc][mode][policy], flush=True)
    engine = next(iter(engines.values()))
    threads = None
    if args.thread_repeats:
        remainder = results.get("edit", {}).get(modes[0], {}).get("static", {})
        remainder = (
            remainder["prompt_tokens_mean"] - remainder["reused_prompt_tokens_mean"] if remainder else 448
        )
        threads = thread_check(engine, base, remainder, args.thread_repeats + 1)
        load_samples.append(os.getloadavg()[0])
        print("threads", threads, flush=True)
    first = None
    if args.first_repeats:
        first = first_request_check(args.model, base, args.new_tokens, args.first_repeats)
        load_samples.append(os.getloadavg()[0])
        print("first request", first, flush=True)
    report = {
        "model": str(engine.path),
        "parameters": engine.num_parameters,
        "prompt_tokens": len(base),
        "new_tokens": args.new_tokens,
        "repeats": args.repeats,
        "scenarios": {k: SCENARIOS[k] for k in scenarios},
        "results": results,
        "thread_modes": modes,
        "thread_check": threads,
        "first_request_after_loading": first,
        "cpu_count": os.cpu_count(),
        "command": "python benchmarks/dice_tiny_latency.py " + " ".join(sys.argv[1:]),
        "load_average_1min": {
            "min": round(min(load_samples), 2),
            "median": round(statistics.median(load_samples), 2),
            "max": round(max(load_samples), 2),
        },
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
