"""Validator benchmark: seconds per validated candidate (cold and warm) on the .cu and KernelBench paths,
a plain ``load_inline`` build of the same extension in the same run, and candidates per minute with the
pool at full width.

    python benchmarks/validator_bench.py --problems-file PROBLEMS.jsonl [--workers 8] [--results DIR]
    python benchmarks/validator_bench.py --builds-only [--budget-s S] [--build-parallel 1,4,16] [--results D]
    python benchmarks/validator_bench.py --smoke-cpu [--results DIR]     # the build section on CPU, C++-only

KernelBench candidates are the hand-written ones in tests/validator/candidates (10 level-1 problems, a
correct and a wrong candidate each). Without a GPU only the compile-only numbers are produced.
Writes validator_bench.json, validator_bench.md and validator_bench.png to --results. The build-speed section
(``--builds``, ``--builds-only``, ``--smoke-cpu``; benchmarks/build_speed.py) writes validator_build_bench
.jsonl (one line per measurement, as it goes), .json and .md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.validator import ValidatorPool, gpu_available  # noqa: E402

CANDIDATES = ROOT / "tests" / "validator" / "candidates"
PROBLEMS = {
    5: "scale",
    19: "relu",
    21: "sigmoid",
    22: "tanh",
    25: "swish",
    26: "gelu",
    28: "hardsigmoid",
    29: "softplus",
    30: "softsign",
    47: "sum",
}
PLAIN_PROBLEM = 5  # the candidate whose extension is also built with a plain load_inline

VECTOR_ADD = """__global__ void add(const float* a, const float* b, float* c, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) c[i] = a[i] + b[i];
}
/* dice-spec
import numpy as np
import torch

def inputs():
    n = 1 << 24
    return [torch.rand(n, device="cuda"), torch.rand(n, device="cuda"), n]

def reference(a, b, n):
    return a + b

def launch(module, a, b, n):
    c = torch.empty_like(a)
    module.add(((n + 255) // 256,), (256,), (a, b, c, np.int32(n)))
    return c
*/
"""


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "cpus": os.cpu_count(),
        "platform": platform.platform(),
    }
    try:
        import torch

        info["torch"] = torch.__version__
        if torch.cuda.is_available():
            info["gpu"] = torch.cuda.get_device_name()
    except ImportError:
        pass
    try:
        import cupy

        info["cupy"] = cupy.__version__
    except ImportError:
        pass
    return info


def timed(fn: Any) -> tuple[float, Any]:
    start = time.perf_counter()
    out = fn()
    return time.perf_counter() - start, out


def bench_cu(cache: Path) -> dict[str, Any]:
    os.environ["DICE_CACHE_DIR"] = str(cache)
    out: dict[str, Any] = {}
    cold, pool = timed(lambda: ValidatorPool(1, cache_verdicts=False))
    with pool:
        first_s, v = timed(lambda: pool.validate_cu(VECTOR_ADD))
        out["cold_s"] = cold + first_s  # pool + worker start, NVRTC, CuPy module build, run, timing
        out["cold_status"] = v.status
        warm = [timed(lambda: pool.validate_cu(VECTOR_ADD))[0] for _ in range(5)]
        out["warm_s"] = statistics.median(warm)
        out["speedup_vs_torch"] = v.speedup
        # compile-only of fresh texts: what the editor pays per candidate without a spec
        compile_only = []
        for i in range(5):
            text = VECTOR_ADD.split("/* dice-spec")[0].replace("a[i] + b[i]", f"a[i] + b[i] * {i + 2}.f")
            compile_only.append(timed(lambda t=text: pool.validate_cu(t))[0])
        out["compile_only_warm_s"] = statistics.median(compile_only)
    return out


ADVERSARIAL = sorted(p.name for p in CANDIDATES.glob("adv_*.py"))


def kb_jobs(refs: dict[int, str]) -> list[tuple[str, str, str, bool, str]]:
    """(name, reference, candidate, timing, expected status) for the whole hand-written test set: correct
    candidates first (their distinct builds start at once; timed), then the wrong twins and the adversarial
    cases, which reuse those builds and stop at correctness or a guard."""
    order = [PLAIN_PROBLEM] + [p for p in PROBLEMS if p != PLAIN_PROBLEM]
    jobs = []
    for pid in order:
        name = f"level1_{pid}_{PROBLEMS[pid]}.py"
        jobs.append((name, refs[pid], (CANDIDATES / name).read_text(), True, "correct"))
    for pid in order:
        name = f"level1_{pid}_{PROBLEMS[pid]}_wrong.py"
        jobs.append((name, refs[pid], (CANDIDATES / name).read_text(), False, "incorrect"))
    for name in ADVERSARIAL:
        expected = "correct" if name == "adv_half_precision_compute.py" else "rejected"
        jobs.append((name, refs[19], (CANDIDATES / name).read_text(), True, expected))
    return jobs


def plain_load_inline(candidate: Path, build_root: Path) -> subprocess.Popen[bytes]:
    """The candidate imported by a plain python process: torch's own load_inline, a fresh build folder."""
    env = dict(os.environ, TORCH_EXTENSIONS_DIR=str(build_root))
    env.pop("MAX_JOBS", None)
    code = (
        "import importlib.util, time, sys\nt = time.perf_counter()\n"
        f"spec = importlib.util.spec_from_file_location('plain_candidate', {str(candidate)!r})\n"
        "m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)\n"
        "print('PLAIN_SECONDS', time.perf_counter() - t)\n"
    )
    return subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )


def bench_kb(
    refs: dict[int, str], workers: int, tmp: Path, cache: Path | None, warm_wide: int, checkpoint: Any
) -> dict[str, Any]:
    out: dict[str, Any] = {"workers": workers}
    jobs = kb_jobs(refs)
    plain_name = jobs[0][0]
    os.environ["DICE_CACHE_DIR"] = str(cache or tmp / "kb_cache")

    # Cold: empty build cache, pool at full width over the whole test set; a plain load_inline build of the
    # first candidate's extension runs alongside, on the same machine under the same load.
    plain = plain_load_inline(CANDIDATES / plain_name, tmp / "plain_ext")
    start = time.perf_counter()
    latency: dict[str, float] = {}
    with ValidatorPool(workers, cache_verdicts=False) as pool:
        futures = {}
        for name, ref, cand, timing, _ in jobs:
            fut = pool.submit_kernelbench(ref, cand, timing=timing)
            fut.add_done_callback(lambda f, n=name: latency.__setitem__(n, time.perf_counter() - start))
            futures[name] = fut
        verdicts = {name: fut.result() for name, fut in futures.items()}
        out["cold_wide_wall_s"] = time.perf_counter() - start
    out["cold_candidates"] = len(jobs)
    out["cold_candidates_per_min"] = 60.0 * len(jobs) / out["cold_wide_wall_s"]
    out["cold_single_s"] = latency[plain_name]
    out["cold_single_status"] = verdicts[plain_name].status
    out["as_expected"] = sum(verdicts[n].status == e for n, _, _, _, e in jobs)
    out["per_candidate"] = {
        name: {
            "expected": expected,
            "status": verdicts[name].status,
            "latency_s": round(latency[name], 2),
            "speedup": verdicts[name].speedup,
            "ref_ms": verdicts[name].ref_ms,
            "new_ms": verdicts[name].new_ms,
            "message": verdicts[name].message[:300],
        }
        for name, _, _, _, expected in jobs
    }
    plain_out = plain.communicate(timeout=900)[0].decode(errors="replace")
    seconds = [line.split()[1] for line in plain_out.splitlines() if line.startswith("PLAIN_SECONDS")]
    out["plain_load_inline_s"] = float(seconds[0]) if seconds else None
    if not seconds:
        out["plain_load_inline_log"] = plain_out[-2000:]
    print("kernelbench cold:", json.dumps({k: v for k, v in out.items() if k != "per_candidate"}), flush=True)
    checkpoint(out)

    # Warm: same build cache. A fresh single-worker pool (worker start + cached build + full protocol), then
    # the same candidate again in that warm worker.
    ref, cand = jobs[0][1], jobs[0][2]
    with ValidatorPool(1, cache_verdicts=False) as pool:
        out["warm_fresh_worker_s"], v = timed(lambda: pool.validate_kernelbench(ref, cand))
        out["warm_fresh_worker_status"] = v.status
        out["warm_worker_s"], v = timed(lambda: pool.validate_kernelbench(ref, cand))
        out["warm_worker_correctness_only_s"], _ = timed(
            lambda: pool.validate_kernelbench(ref, cand, timing=False)
        )
        out["warm_log"] = v.log[:1500]
    if warm_wide > 0:
        start = time.perf_counter()
        with ValidatorPool(workers, cache_verdicts=False) as pool:
            warm_futures = [pool.submit_kernelbench(r, c, timing=t) for _, r, c, t, _ in jobs[:warm_wide]]
            warm_statuses = [f.result().status for f in warm_futures]
        out["warm_wide_wall_s"] = time.perf_counter() - start
        out["warm_wide_candidates"] = len(warm_futures)
        out["warm_candidates_per_min"] = 60.0 * len(warm_futures) / out["warm_wide_wall_s"]
        out["warm_statuses_match_cold"] = warm_statuses == [verdicts[n].status for n, *_ in jobs[:warm_wide]]
    return out


def write_results(results: dict[str, Any], out_dir: Path) -> None:
    """Long on purpose: one report template written out in the order it reads, not logic."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "validator_bench.json").write_text(json.dumps(results, indent=2) + "\n")
    cu, kb = results.get("cu", {}), results.get("kernelbench", {})
    lines = [
        "# Validator benchmark",
        "",
        f"- command: `{results['command']}`",
        f"- machine: {json.dumps(results['machine'])}",
        f"- date (UTC): {results['date']}",
        "",
        "| what | seconds |",
        "| --- | --- |",
    ]

    def row(label: str, value: Any) -> None:
        if isinstance(value, float):
            lines.append(f"| {label} | {value:.2f} |")

    row(".cu cold (pool start, NVRTC + CuPy build, run, timing)", cu.get("cold_s"))
    row(".cu warm (same worker)", cu.get("warm_s"))
    row(".cu compile-only, new text, warm worker", cu.get("compile_only_warm_s"))
    row(
        "KernelBench cold, one candidate (build + 5 trials + timing), pool at full width",
        kb.get("cold_single_s"),
    )
    row("plain `load_inline` build of the same extension, same run", kb.get("plain_load_inline_s"))
    row("KernelBench warm build cache, fresh worker", kb.get("warm_fresh_worker_s"))
    row("KernelBench warm worker (full protocol, timing)", kb.get("warm_worker_s"))
    row("KernelBench warm worker, correctness only", kb.get("warm_worker_correctness_only_s"))
    if kb:
        lines += [
            "",
            "| pool at full width | candidates | wall s | candidates/min |",
            "| --- | --- | --- | --- |",
            f"| cold ({kb['workers']} workers) | {kb['cold_candidates']} | {kb['cold_wide_wall_s']:.1f} | "
            f"{kb['cold_candidates_per_min']:.1f} |",
        ]
        if "warm_wide_wall_s" in kb:
            lines.append(
                f"| warm ({kb['workers']} workers) | {kb['warm_wide_candidates']} | "
                f"{kb['warm_wide_wall_s']:.1f} | {kb['warm_candidates_per_min']:.1f} |"
            )
        lines += [
            "",
            f"Verdicts as expected: {kb['as_expected']}/{kb['cold_candidates']}",
            "",
            "| candidate | expected | status | done after s (cold pass) | speedup |",
            "| --- | --- | --- | --- | --- |",
        ]
        for name, rec in kb["per_candidate"].items():
            speedup = f"{rec['speedup']:.2f}" if rec["speedup"] else "-"
            lines.append(f"| {name} | {rec['expected']} | {rec['status']} | {rec['latency_s']} | {speedup} |")
    (out_dir / "validator_bench.md").write_text("\n".join(lines) + "\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        labels, values = [], []
        for label, key, src in [
            (".cu cold", "cold_s", cu),
            (".cu warm", "warm_s", cu),
            ("KB cold (pool)", "cold_single_s", kb),
            ("plain load_inline", "plain_load_inline_s", kb),
            ("KB warm, new worker", "warm_fresh_worker_s", kb),
            ("KB warm worker", "warm_worker_s", kb),
        ]:
            if isinstance(src.get(key), float):
                labels.append(label)
                values.append(src[key])
        fig, ax = plt.subplots(figsize=(8, 3.5))
        ax.barh(labels, values, color="tab:blue")
        for i, v in enumerate(values):
            ax.text(v, i, f" {v:.2f} s", va="center", fontsize=8)
        ax.set_xscale("log")
        ax.set_xlabel("seconds per validated candidate")
        title = results["machine"].get("gpu", "no GPU")
        if kb:
            title += f" · {kb['cold_candidates_per_min']:.1f} candidates/min cold, {kb['workers']} workers"
        ax.set_title(title, fontsize=9)
        fig.tight_layout()
        fig.savefig(out_dir / "validator_bench.png", dpi=120)
    except ImportError:
        pass


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--problems-file", type=Path, default=None)
    parser.add_argument("--workers", type=int, default=12)
    parser.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--skip-kernelbench", action="store_true")
    parser.add_argument(
        "--cache-dir",
        type=Path,
        default=None,
        help="KernelBench build cache (must start empty for cold numbers; default: a temp dir)",
    )
    parser.add_argument(
        "--warm-wide",
        type=int,
        default=0,
        metavar="N",
        help="also re-validate the first N candidates at full width with the warm cache",
    )
    parser.add_argument("--builds", action="store_true", help="also run the build-speed section")
    parser.add_argument("--builds-only", action="store_true", help="run only the build-speed section")
    parser.add_argument("--smoke-cpu", action="store_true", help="the build section on CPU, C++-only, small")
    parser.add_argument("--budget-s", type=float, default=None, help="wall-clock budget of the build section")
    parser.add_argument("--build-parallel", default=None, help="parallel widths, e.g. 1,4,16")
    parser.add_argument("--build-counts", default=None, help="cold candidates per width, e.g. 1:4,4:8,16:16")
    parser.add_argument("--batch-size", type=int, default=None, help="candidates per prebuild (default 4)")
    parser.add_argument(
        "--build-modes", default=None, help="modes to run, e.g. fast,warm,batched (default: all four)"
    )
    parser.add_argument("--build-driver", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.build_driver is not None:
        from build_speed import driver

        return driver(args.build_driver)
    if args.builds_only or args.smoke_cpu:
        return run_build_section(args)
    results: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine(),
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "gpu": gpu_available(),
    }
    with tempfile.TemporaryDirectory(prefix="dice-bench-") as tmp_name:
        tmp = Path(tmp_name)
        results["cu"] = bench_cu(tmp / "cu_cache")
        print("cu:", json.dumps(results["cu"]), flush=True)
        write_results(results, args.results)
        if results["gpu"] and not args.skip_kernelbench:
            from dice.validator.kbeval import find_problems_file, load_problems

            rows = load_problems(find_problems_file(args.problems_file))
            refs = {p.problem_id: p.code for p in rows if p.level == 1 and p.problem_id in PROBLEMS}

            def checkpoint(partial: dict[str, Any]) -> None:
                write_results({**results, "kernelbench": partial}, args.results)

            results["kernelbench"] = bench_kb(
                refs, args.workers, tmp, args.cache_dir, args.warm_wide, checkpoint
            )
            print(
                "kernelbench:",
                json.dumps(
                    {
                        k: v
                        for k, v in results["kernelbench"].items()
                        if k not in ("warm_log", "per_candidate")
                    }
                ),
                flush=True,
            )
    write_results(results, args.results)
    print((args.results / "validator_bench.md").read_text())
    return run_build_section(args) if args.builds else 0


def run_build_section(args: argparse.Namespace) -> int:
    from build_speed import bench_builds

    with tempfile.TemporaryDirectory(prefix="dice-build-bench-") as tmp_name:
        result = bench_builds(args, args.results, Path(tmp_name), machine())
    stem = "validator_build_bench_smoke" if result["smoke"] else "validator_build_bench"
    print((args.results / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
