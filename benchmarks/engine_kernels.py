"""The fast step's kernels on one GPU: tile sweep of the skinny products, and a kernel-by-kernel profile.

(1) For every weight of the 1.7B / 4B / 8B shapes (q/k/v, o, gate/up, down, lm_head) at 4 and 8 rows: cuBLAS
    (F.linear) against ``engine.triton_kernels`` over a grid of tiles, splits, warps and stages; the best
    config, its time and bandwidth (weight bytes / time), and the heuristic's choice (``skinny_config``).
    Rotates among several weight copies so that the 60 MB L2 does not hold the weight between calls.
(2) One denoising step (batch 1, 512-token prompt, 4 tokens) at the 1.7B and 8B shapes under
    torch.profiler: GPU time per kernel, for the eager forward and the fast forward (what the CUDA graph
    replays, less the launch gaps).

    python benchmarks/engine_kernels.py --out /tmp/k            # on the GPU (~3 min)
    python benchmarks/engine_kernels.py --smoke-cpu --out /tmp/k   # the script itself, interpreter, tiny
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

SHAPES = {  # (hidden, intermediate, heads, kv heads) of the SDAR/DICE configs (see engine_bench.py)
    "1.7B": (2048, 6144, 16, 8),
    "4B": (2560, 9728, 32, 8),
    "8B": (4096, 12288, 32, 8),
}
VOCAB, HEAD_DIM = 151936, 128


def weights(name: str) -> dict[str, tuple[int, int, bool]]:
    d, i, h, g = SHAPES[name]
    return {
        "qkv": ((h + 2 * g) * HEAD_DIM, d, False),
        "o": (d, h * HEAD_DIM, False),
        "gate_up": (i, d, True),
        "down": (d, i, False),
        "lm_head": (VOCAB, d, False),
    }


def bench(fn, dev: str, reps: int = 50) -> float:
    """Median seconds per call: CUDA events over graph-free calls (host clock on the CPU smoke run)."""
    for _ in range(3):
        fn()
    times = []
    for _ in range(reps):
        if dev == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b) / 1e3)
        else:
            t = time.perf_counter()
            fn()
            times.append(time.perf_counter() - t)
    return statistics.median(times)


def sweep(out: Path, dev: str, dtype: torch.dtype, quick: bool) -> list[dict]:
    from engine import triton_kernels as tk

    grid = list(itertools.product((16, 32, 64), (128, 256, 512), (1, 2, 4, 8), (4, 8), (1, 4)))
    if quick:
        grid = [(16, 64, 1, 4, 1), (16, 64, 2, 4, 1)]
    rows_done = []
    names = ("1.7B", "8B") if not quick else ("tiny",)  # batch 1: the skinny shapes
    for model in names:
        ws = weights(model) if not quick else {"o": (64, 128, False), "gate_up": (32, 128, True)}
        for wname, (n, k, gated) in ws.items():
            copies = max(2, int(200e6 // (n * k * 2 * (2 if gated else 1)))) if dev == "cuda" else 1
            rows_w = n * (2 if gated else 1)
            wt = [torch.randn(rows_w, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
            for m in (4, 8):
                x = torch.randn(m, k, device=dev, dtype=dtype)
                it = itertools.cycle(wt)
                if gated:
                    ref = bench(lambda: (lambda y: F.silu(y[:, :n]) * y[:, n:])(F.linear(x, next(it))), dev)  # noqa: B023
                    want = F.silu((x.float() @ wt[0].float().T)[:, :n]) * (x.float() @ wt[0].float().T)[:, n:]
                else:
                    ref = bench(lambda: F.linear(x, next(it)), dev)  # noqa: B023
                    want = x.float() @ wt[0].float().T
                results = []
                for cfg in grid:
                    bn, bk, split, warps, stages = cfg
                    if k % (bk * split) or (gated and split > 1) or (gated and bn > 32):
                        continue
                    fn = tk.skinny_gate_up if gated else tk.skinny_linear
                    try:
                        got = fn(x, wt[0], config=cfg)
                        err = float((got.float() - want).norm() / want.norm())
                        if not err < 2e-2:
                            results.append({"config": cfg, "error": f"rel err {err:.2e}"})
                            continue
                        t = bench(lambda fn=fn, cfg=cfg: fn(x, next(it), config=cfg), dev, reps=30)  # noqa: B023
                        results.append({"config": cfg, "s": t})
                    except Exception as exc:  # a config the compiler refuses (shared memory): skip it
                        results.append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
                ok = [r for r in results if "s" in r]
                best = min(ok, key=lambda r: r["s"]) if ok else None
                chosen_cfg = tk.skinny_config(n, k, gated)
                chosen = next((r for r in ok if tuple(r["config"]) == chosen_cfg), None)
                wbytes = n * k * 2 * (2 if gated else 1)
                row = {
                    "model": model, "weight": wname, "n": n, "k": k, "rows": m, "bytes": wbytes,
                    "cublas_us": ref * 1e6, "cublas_tb_s": wbytes / ref / 1e12,
                    "best_config": best["config"] if best else None,
                    "best_us": best["s"] * 1e6 if best else None,
                    "best_tb_s": wbytes / best["s"] / 1e12 if best else None,
                    "heuristic_config": chosen_cfg,
                    "heuristic_us": chosen["s"] * 1e6 if chosen else None,
                    "errors": [r for r in results if "error" in r][:3],
                    "all": [(r["config"], round(r["s"] * 1e6, 2)) for r in ok],
                }  # fmt: skip
                rows_done.append(row)
                (out / "engine_kernels_sweep.json").write_text(json.dumps(rows_done, indent=1))
                print(
                    f"{model} {wname} {n}x{k} m={m}: cublas {row['cublas_us']:.1f} us "
                    f"({row['cublas_tb_s']:.2f} TB/s), best {row['best_us'] or 0:.1f} us "
                    f"({row['best_tb_s'] or 0:.2f} TB/s) {row['best_config']}, "
                    f"heuristic {row['heuristic_config']} {row['heuristic_us'] or 0:.1f} us",
                    flush=True,
                )
            del wt
    return rows_done


def profile(out: Path, dev: str, quick: bool) -> dict:
    """GPU time per kernel of one step, eager forward vs fast forward."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as tprofile

    import benchmarks.engine_bench as eb
    from benchmarks.engine_bench import CONFIGS, random_model
    from engine.fast_forward import FastForward
    from engine.model import ModelConfig

    eb.DEV = dev
    res = {}
    for name in ("1.7B", "8B") if not quick else ("1.7B",):
        over = {"num_hidden_layers": 2, "hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024,
                "mask_token_id": 1000, "eos_token_id": 1001} if quick else {}  # fmt: skip
        model = random_model(ModelConfig.from_dict(CONFIGS[name] | over))
        model.fuse_projections()
        from engine.runner import EagerRunner

        runner = EagerRunner(model)
        plen = 512 if not quick else 32
        cache = runner.new_cache(1, plen + 64, 4)
        cache.reset([0])
        ids = torch.randint(0, 1000, (1, plen), device=dev)
        with torch.no_grad():
            runner.prefill(cache, ids, torch.arange(plen, device=dev)[None])
        x = torch.randint(0, 1000, (1, 4), device=dev)
        pos = torch.arange(plen, plen + 4, device=dev)[None]
        start = torch.full((1,), plen, dtype=torch.long, device=dev)
        fast = FastForward(model)
        for label, fwd in (("eager", model.forward_cached), ("fast", fast)):
            with torch.no_grad():
                for _ in range(3):
                    fwd(x, pos, cache, start, logits_last=4)
                if dev == "cuda":
                    torch.cuda.synchronize()
                acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if dev == "cuda" else [])
                with tprofile(activities=acts) as prof:
                    for _ in range(5):
                        fwd(x, pos, cache, start, logits_last=4)
                    if dev == "cuda":
                        torch.cuda.synchronize()
            table = []
            for e in prof.key_averages():
                t = getattr(e, "device_time_total", 0) if dev == "cuda" else e.cpu_time_total
                if dev == "cuda" and (not t or e.key.startswith("cuda") or e.key.startswith("aten::")):
                    continue
                table.append({"kernel": e.key[:90], "calls_per_step": e.count / 5, "us_per_step": t / 5})
            table.sort(key=lambda r: -r["us_per_step"])
            total = sum(r["us_per_step"] for r in table)
            launches = sum(r["calls_per_step"] for r in table)
            res[f"{name}_{label}"] = {
                "gpu_us_per_step": total,
                "kernels": table[:30],
                "launches_per_step": launches,
            }
            print(f"{name} {label}: {total:.0f} us of kernels per step, {launches:.0f} launches", flush=True)
            (out / "engine_kernels_profile.json").write_text(json.dumps(res, indent=1))
        del model, fast, cache
        if dev == "cuda":
            torch.cuda.empty_cache()
    return res


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--smoke-cpu", action="store_true")
    p.add_argument("--skip-sweep", action="store_true")
    p.add_argument("--skip-profile", action="store_true")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.smoke_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    dev = "cpu" if a.smoke_cpu else "cuda"
    dtype = torch.float16 if a.smoke_cpu else torch.bfloat16
    torch.manual_seed(0)
    # The profile first: it is cheap and says most; the sweep compiles one kernel per config and may be cut.
    if not a.skip_profile:
        profile(a.out, dev, a.smoke_cpu)
    if not a.skip_sweep:
        sweep(a.out, dev, dtype, a.smoke_cpu)


if __name__ == "__main__":
    main()
