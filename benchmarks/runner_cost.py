"""What the judge/runner split costs per candidate (issue 15, item 1), and whether CUDA IPC works under the
isolation in force.

This process plays the judge (as a worker does: not dumpable, CUDA started), the product's zygote forks one
runner per candidate. Per candidate: the time until the runner is ready (fork, CUDA start in the runner,
the candidate's import with its extension served from the build cache, ``ModelNew`` built), the kernel
launch check (CUPTI starts in each runner), and the whole verdict, with and without timing.

    python3 benchmarks/runner_cost.py --out results.jsonl            # on a GPU machine
    python3 benchmarks/runner_cost.py --smoke-cpu --out /tmp/x.jsonl # the GPU path emulated on the CPU

``--cu N`` adds N ``.cu`` spec runs (a vector kernel, 1 Mi elements): the fill's runner started, its module
compiled by CuPy (the first run; later ones find CuPy's cache), the spec's launch compared and timed.

``--variant open`` runs the runner without its Landlock layer and the judge dumpable (diagnosis only: if
CUDA IPC fails in the default, this says whether the isolation is why).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.validator.conftest import RELU_REF, STANDINS, EmulatedJudge, candidate  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--candidates", type=int, default=8)
    ap.add_argument("--smoke-cpu", action="store_true")
    ap.add_argument("--cu", type=int, default=0, help=".cu spec runs after the candidates")
    ap.add_argument("--variant", choices=["default", "open"], default="default")
    args = ap.parse_args()
    root = Path(tempfile.mkdtemp(prefix="dice-runner-cost-"))
    os.environ.setdefault("DICE_CACHE_DIR", str(root / "cache"))
    if args.smoke_cpu:
        (root / "standins.py").write_text(STANDINS + CU_STANDIN)
        os.environ.update(DICE_VALIDATOR_EMULATE="cpu", DICE_EMULATED_EXTENSIONS=str(root / "standins.py"))
    import torch

    from dice.validator import judge as judge_module
    from dice.validator import kernelbench
    from dice.validator.zygote_client import not_dumpable

    gpu = torch.cuda.is_available() and not args.smoke_cpu
    if gpu:
        torch.cuda.init()  # before not_dumpable, as a worker does
    if args.variant == "default":
        not_dumpable()
    else:
        original = judge_module.runner_args
        judge_module.runner_args = lambda ctx, d: {**original(ctx, d), "landlock": False}
    ctx = EmulatedJudge(root / "judge")
    ctx.gpu, ctx.emulated = gpu, not gpu
    ctx.cache_dir = Path(os.environ["DICE_CACHE_DIR"]) / "validator"
    if gpu:
        ctx.device_name = torch.cuda.get_device_name()
        os.environ.setdefault("TORCH_CUDA_ARCH_LIST", "{}.{}".format(*torch.cuda.get_device_capability()))
    honest = candidate("level1_19_relu.py")
    rows = []
    with args.out.open("a") as out:
        started = time.perf_counter()
        ctx.zygote._ensure()
        row = {"what": "zygote start", "seconds": time.perf_counter() - started, "variant": args.variant}
        rows.append(row)
        out.write(json.dumps(row) + "\n")
        for i in range(args.candidates):
            timing = i % 2 == 1
            t0 = time.perf_counter()
            verdict, _ = kernelbench._run_judged(ctx, RELU_REF, honest, False, timing)
            row = {
                "what": "relu candidate",
                "index": i,
                "timing": timing,
                "seconds": time.perf_counter() - t0,
                "status": verdict.status,
                "message": verdict.message,
                "ready_s": _number(r"runner ready ([\d.]+) s", verdict.log),
                "ready_phases": _phases(verdict.log),
                "launch_s": _number(r"one profiled forward in the runner, ([\d.]+) s", verdict.log),
                "variant": args.variant,
                "device": ctx.device_name,
            }
            if verdict.status != "correct":
                row["log"] = verdict.log[-3000:]
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps({k: v for k, v in row.items() if k != "log"}), flush=True)
            if verdict.status != "correct":
                print(verdict.log[-3000:], flush=True)
        for i in range(args.cu):
            row = _cu_run(ctx, i, "cuda" if gpu else "cpu")
            rows.append(row)
            out.write(json.dumps(row) + "\n")
            out.flush()
            print(json.dumps(row), flush=True)
    ctx.zygote.close()
    return 0 if all(r.get("status", "correct") == "correct" for r in rows) else 1


CU_SOURCE = """__global__ void twice(const float* x, float* y, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) y[i] = 2.0f * x[i];
}
"""
CU_SPEC = """
import numpy as np
import torch

def inputs():
    return [torch.rand(1 << 20, device="DEVICE")]

def reference(x):
    return 2 * x

def launch(module, x):
    y = torch.empty_like(x)
    n = x.numel()
    module.twice(((n + 255) // 256,), (256,), (x, y, np.int32(n)))
    return y
"""
CU_STANDIN = """

def twice(grid, block, args):
    args[1].copy_(2 * args[0])
"""


def _cu_run(ctx: EmulatedJudge, index: int, device: str) -> dict[str, object]:
    from dice.validator import cu

    t0 = time.perf_counter()
    verdict, _ = cu._run_spec(ctx, CU_SOURCE, ["twice"], CU_SPEC.replace("DEVICE", device), "k.cu", [], "")
    match = re.search(r"kernel's process ready ([\d.]+) s \(([^)]*)\)", verdict.log or "")
    pairs = (item.rsplit(" ", 1) for item in (match.group(2).split(", ") if match else []))
    row = {
        "what": "cu spec",
        "index": index,
        "seconds": time.perf_counter() - t0,
        "status": verdict.status,
        "message": verdict.message,
        "ready_s": float(match.group(1)) if match else None,
        "ready_phases": {k: float(v) for k, v in pairs if v.replace(".", "", 1).isdigit()},
        "speedup": verdict.speedup,
        "device": ctx.device_name,
    }
    if verdict.status != "correct":
        row["log"] = verdict.log[-3000:]
    return row


def _phases(text: str) -> dict[str, float]:
    """The runner's own split of its start (``cuda 0.41, sandbox 0.01, ...`` in the log)."""
    match = re.search(r"after the fork: ([^)]*)\)", text or "")
    pairs = (item.rsplit(" ", 1) for item in (match.group(1).split(", ") if match else []))
    return {k: float(v) for k, v in pairs if v.replace(".", "", 1).isdigit()}


def _number(pattern: str, text: str) -> float | None:
    match = re.search(pattern, text or "")
    return float(match.group(1)) if match else None


if __name__ == "__main__":
    sys.exit(main())
