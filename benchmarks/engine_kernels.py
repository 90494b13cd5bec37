"""The fast step's kernels on one GPU: tile sweep of the skinny products, and a kernel-by-kernel profile.

(1) For every weight of the 1.7B and 8B shapes (q/k/v, o, gate/up, down, lm_head) at 4 and 8 rows (the
    engine's step and first step at batch 1): cuBLAS (F.linear) against ``engine.triton_kernels`` over a
    grid of tiles, splits, warps and stages, timed as the engine runs them: R consecutive calls captured in
    one CUDA graph, each on another weight copy (> 200 MB in all, so the L2 holds none of them), replays
    timed with CUDA events, median / R. Each weight in the variant the fast forward runs (the residual add
    after o and down). Every config is checked against a float32 product first; configs the compiler
    refuses are skipped. The kernel binaries (~170) are compiled first, in parallel processes. Per shape:
    the best config, the heuristic's (``skinny_config`` without a table), cuBLAS (F.linear; and the whole
    torch path, with the residual add), and the one chosen for the table: the best only where it beats the
    heuristic's by more than 3 % (the noise).
    ``--write-configs`` writes those into ``engine/kernel_configs/<gpu>.json`` (``skinny_config`` reads
    it) and a copy into --out.
(2) One denoising step (batch 1, 512-token prompt, 4 tokens) at the 1.7B and 8B shapes under
    torch.profiler: GPU time per kernel, for the eager forward and the fast forward (what the CUDA graph
    replays, less the launch gaps), with the configs of the table where one exists.

    python benchmarks/engine_kernels.py --out /tmp/k --write-configs   # on the GPU (sweep ~1-2 min)
    python benchmarks/engine_kernels.py --smoke-cpu --out /tmp/k       # the script itself, interpreter, tiny
"""

from __future__ import annotations

import argparse
import functools
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


GRID = list(itertools.product((16, 32, 64), (128, 256, 512), (1, 2, 4, 8), (4, 8), (1, 4)))
ROWS = (4, 8)  # the engine's rows: a step of 4 tokens, a block's 8-token first step (batch 1)
ROTATE_BYTES = 200e6  # weight copies per shape: > 4x the H200's 50 MB L2, so no call finds its weight there
MIN_GAIN = 0.03  # a tuned config replaces the heuristic's only when faster by more than the timing noise
# What the fast forward fuses into each product (engine/fast_forward.py): the residual add after o and
# down (SiLU-times-up is part of the gated kernel). The sweep times each weight in its own variant.
VARIANT = {"qkv": "plain", "o": "residual", "gate_up": "plain", "down": "residual", "lm_head": "plain"}


Config = tuple[int, int, int, int, int]


def candidates(grid: list[Config], k: int, gated: bool, heuristic: Config) -> list[Config]:
    """The grid's configs valid for (k, gated), the heuristic's included (timed even if off the grid)."""
    out = [c for c in grid if not (k % (c[1] * c[2]) or (gated and c[2] > 1) or (gated and c[0] > 32))]
    return out if heuristic in out else [*out, heuristic]


def product(
    fn, x: torch.Tensor, w: torch.Tensor, variant: str, extra: torch.Tensor | None, cfg: Config | None
):
    """One skinny product as the fast forward calls it: ``extra`` is the residual."""
    if variant == "residual":
        return fn(x, w, extra, config=cfg)
    return fn(x, w, config=cfg)


def torch_product(x: torch.Tensor, w: torch.Tensor, n: int, gated: bool, variant: str, extra):
    """The same on the torch path (cuBLAS): F.linear, SiLU-times-up, residual add."""
    y = F.linear(x, w)
    if gated:
        y = F.silu(y[:, :n]) * y[:, n:]
    return y + extra if variant == "residual" else y


def _compile_worker(jobs: list[tuple[Config, bool, str]], dtype_name: str, deadline: float) -> int:
    """In a spawned process: launch each (config, gated, variant) once on a small stand-in shape, so that
    Triton's on-disk cache holds its binary. The stand-in specializes as the real shapes do (every int
    argument a multiple of 16 except the rows, 4 or 8; 16-byte aligned pointers), so the sweep loads them."""
    from engine import triton_kernels as tk

    dtype = getattr(torch, dtype_name)
    x = torch.zeros(4, 4096, device="cuda", dtype=dtype)
    w = torch.zeros(512, 4096, device="cuda", dtype=dtype)
    extra = {"residual": torch.zeros_like(x[:, :256])}
    done = 0
    for cfg, gated, variant in jobs:
        if time.time() > deadline:  # the rest compiles in the sweep, under its budget
            break
        fn = tk.skinny_gate_up if gated else tk.skinny_linear
        try:
            product(fn, x, w if gated else w[:256], variant, extra.get(variant), cfg)
            done += 1
        except Exception:  # noqa: BLE001 - refused configs (shared memory) are skipped by the sweep too
            pass
    torch.cuda.synchronize()
    return done


def distinct_binaries(jobs: set[tuple[Config, bool, str]]) -> list[tuple[Config, bool, str]]:
    """One job per binary: the product kernel depends on the split only through PARTIAL (split > 1), the
    reduce kernel on (SPLIT, variant); the rest of the split is a runtime argument."""
    out: dict[tuple, tuple[Config, bool, str]] = {}
    for job in sorted(jobs):
        (bn, bk, split, warps, stages), gated, variant = job
        out.setdefault(("product", bn, bk, split > 1, warps, stages, gated, variant), job)
        if split > 1:
            out.setdefault(("reduce", split, variant), job)
    return sorted(set(out.values()), key=lambda j: (j[0][0] * j[0][1], j))  # mix sizes across workers


def precompile(jobs: list[tuple[Config, bool, str]], dtype: torch.dtype, limit_s: float) -> None:
    """Compile every kernel binary of the sweep in parallel processes (one Triton compile is ~1 s of one
    CPU core, and the sweep needs ~170); the sweep then loads them from Triton's on-disk cache."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    t = time.perf_counter()
    workers = max(1, min(14, (os.cpu_count() or 2) - 2, len(jobs)))
    chunks = [jobs[i::workers] for i in range(workers)]
    try:
        with ProcessPoolExecutor(workers, mp_context=get_context("spawn")) as pool:
            args = [str(dtype).split(".")[-1]] * workers, [time.time() + limit_s] * workers
            done = sum(pool.map(_compile_worker, chunks, *args))
    except Exception as exc:  # noqa: BLE001 - the sweep still compiles what is missing, only slower
        print(f"precompile failed ({type(exc).__name__}: {exc}); compiling in the sweep", flush=True)
        return
    print(
        f"precompiled {done}/{len(jobs)} kernel configs in {time.perf_counter() - t:.0f} s "
        f"({workers} processes)",
        flush=True,
    )


@functools.cache
def _capture_stream() -> torch.cuda.Stream:
    return torch.cuda.Stream()


def time_calls(call, calls: int, dev: str, replays: int = 5) -> float:
    """Median seconds per call of ``call(i)`` for i in range(calls), each call on another weight copy.

    On the GPU as the engine runs them: the ``calls`` consecutive calls captured in one CUDA graph, the
    graph replayed (one warm-up, then ``replays`` timed with CUDA events), the median replay / calls; one
    call runs first on the capture stream, outside the capture (a kernel compiles or loads, cuBLAS sets up
    its workspace). On the CPU smoke run: the host clock."""
    if dev != "cuda":
        times = []
        for _ in range(replays):
            t = time.perf_counter()
            for i in range(calls):
                call(i)
            times.append(time.perf_counter() - t)
        return statistics.median(times) / calls
    # Captured on a side stream by hand: torch.cuda.graph() would empty the allocator's cache every time.
    graph, stream = torch.cuda.CUDAGraph(), _capture_stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call(0)
        graph.capture_begin()  # a private pool: one shared across deleted graphs hit an allocator assert
        try:
            for i in range(calls):
                call(i)
        finally:
            graph.capture_end()
    torch.cuda.current_stream().wait_stream(stream)
    graph.replay()
    times = []
    for _ in range(replays):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        graph.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / 1e3)
    del graph
    return statistics.median(times) / calls


def _call(fn, x: torch.Tensor, wt: list[torch.Tensor], variant: str, extra, cfg: Config, i: int):
    return product(fn, x, wt[i % len(wt)], variant, extra, cfg)


def _torch_call(x: torch.Tensor, wt: list[torch.Tensor], n: int, gated: bool, variant: str, extra, i: int):
    return torch_product(x, wt[i % len(wt)], n, gated, variant, extra)


def sweep_shapes(quick: bool) -> list[tuple[str, str, int, int, bool]]:
    """(model, weight, n, k, gated), each (n, k, gated) once."""
    if quick:
        return [
            ("tiny", "o", 64, 128, False),
            ("tiny", "gate_up", 32, 128, True),
            ("tiny", "qkv", 48, 256, False),
        ]
    out, seen = [], set()
    for model in ("1.7B", "8B"):  # batch 1: the skinny shapes
        for wname, (n, k, gated) in weights(model).items():
            if (n, k, gated) not in seen:
                seen.add((n, k, gated))
                out.append((model, wname, n, k, gated))
    return out


def time_configs(fn, x, wt, variant, extra, want, todo, calls, dev, t0, budget_s):
    """Check then time each config of ``todo`` in order; past ``budget_s`` since ``t0`` stop (after at least
    one). Returns ([{"config", "s"} or {"config", "error"}], whether the budget cut the list)."""
    results, cut = [], False
    for cfg in todo:
        if results and time.perf_counter() - t0 > budget_s:
            cut = True
            break
        try:  # correctness first (this call also compiles or loads the kernel)
            got = product(fn, x, wt[0], variant, extra, cfg)
            err = float((got.float() - want).norm() / want.norm())
            if not err < 2e-2:
                results.append({"config": cfg, "error": f"rel err {err:.2e}"})
                continue
            call = functools.partial(_call, fn, x, wt, variant, extra, cfg)
            results.append({"config": cfg, "s": time_calls(call, calls, dev)})
        except Exception as exc:  # noqa: BLE001 - a config the compiler refuses (shared memory)
            results.append({"config": cfg, "error": f"{type(exc).__name__}: {str(exc)[:120]}"})
    return results, cut


def sweep_row(
    model, wname, n, k, gated, m, variant, calls, cublas, torch_path, heuristic, results, cut
) -> dict:
    """One sweep row: the best config, the heuristic's and the table's choice (the best only when it beats
    the heuristic's by more than MIN_GAIN, the timing noise), with cuBLAS for scale."""
    from engine import triton_kernels as tk

    wbytes = n * k * 2 * (2 if gated else 1)
    ok = [r for r in results if "s" in r]
    best = min(ok, key=lambda r: r["s"]) if ok else None
    heur = next((r for r in ok if tuple(r["config"]) == heuristic), None)
    if best and (heur is None or best["s"] < heur["s"] * (1 - MIN_GAIN)):
        chosen = best
    else:
        chosen = heur or {"config": heuristic, "s": None}

    def us(r):
        return r["s"] * 1e6 if r and r.get("s") else None

    return {
        "model": model, "weight": wname, "n": n, "k": k, "gated": gated, "rows": m, "fused": variant,
        "key": tk.table_key(n, k, gated, m), "bytes": wbytes, "calls_per_graph": calls,
        "cublas_us": cublas * 1e6, "cublas_tb_s": wbytes / cublas / 1e12,
        "torch_path_us": torch_path * 1e6,
        "best_config": best["config"] if best else None, "best_us": us(best),
        "best_tb_s": wbytes / best["s"] / 1e12 if best else None,
        "heuristic_config": heuristic, "heuristic_us": us(heur),
        "chosen_config": chosen["config"], "chosen_us": us(chosen),
        "timed": len(ok), "refused": len(results) - len(ok), "cut": cut,
        "errors": [r for r in results if "error" in r][:3],
        "all": [(r["config"], round(r["s"] * 1e6, 2)) for r in ok],
    }  # fmt: skip


def sweep(out: Path, dev: str, dtype: torch.dtype, quick: bool, budget_s: float = 110.0) -> list[dict]:
    """Every config of GRID for every weight and row count, CUDA-graph timed; one row per (n, k, gated,
    rows) with the best config, the heuristic's, the one chosen for the table (``chosen_config``) and
    cuBLAS. Past ``budget_s`` (compiles included) every row from there on stops after the heuristic's config
    (timed first), keeping the best of what it timed."""
    from engine import triton_kernels as tk

    t0 = time.perf_counter()
    grid = GRID if not quick else [(16, 64, 1, 4, 1), (16, 64, 2, 4, 1)]
    shapes = sweep_shapes(quick)
    plan = {
        (n, k, gated, m): candidates(grid, k, gated, tk.skinny_config(n, k, gated, rows=m, device_name=""))
        for _, _, n, k, gated in shapes
        for m in ROWS
    }
    print(
        f"sweep: {len(shapes)} weights x rows {ROWS}, {sum(len(c) for c in plan.values())} configs to time "
        f"(+ cuBLAS), time budget {budget_s:.0f} s",
        flush=True,
    )
    if dev == "cuda":
        variants = {(n, k, g): VARIANT[w] for _, w, n, k, g in shapes}
        jobs = {(c, g, variants[(n, k, g)]) for (n, k, g, _), cfgs in plan.items() for c in cfgs}
        precompile(distinct_binaries(jobs), dtype, max(20.0, budget_s / 2))
    rows_done = []
    for model, wname, n, k, gated in shapes:
        copies = max(2, int(ROTATE_BYTES // (n * k * 2 * (2 if gated else 1))) + 1) if dev == "cuda" else 1
        calls = copies if dev == "cuda" else 2
        rows_w = n * (2 if gated else 1)
        wt = [torch.randn(rows_w, k, device=dev, dtype=dtype) * 0.02 for _ in range(copies)]
        fn = tk.skinny_gate_up if gated else tk.skinny_linear
        variant = VARIANT[wname]
        for m in ROWS:
            x = torch.randn(m, k, device=dev, dtype=dtype)
            extra = torch.randn(m, n, device=dev, dtype=dtype) if variant == "residual" else None
            want = torch_product(
                x.float(), wt[0].float(), n, gated, variant, None if extra is None else extra.float()
            )
            # cuBLAS alone (F.linear; gate/up: with SiLU-times-up), and the whole torch path of the variant
            cublas = time_calls(functools.partial(_torch_call, x, wt, n, gated, "plain", None), calls, dev)
            torch_path = cublas
            if variant != "plain":
                ref = functools.partial(_torch_call, x, wt, n, gated, variant, extra)
                torch_path = time_calls(ref, calls, dev)
            heuristic = tk.skinny_config(n, k, gated, rows=m, device_name="")
            # The heuristic's config first: past the budget (compiles may run long) a row stops where it is.
            todo = [heuristic] + [c for c in plan[(n, k, gated, m)] if c != heuristic]
            results, cut = time_configs(fn, x, wt, variant, extra, want, todo, calls, dev, t0, budget_s)
            why_cut = f"time budget: {len(results)} of {len(todo)} configs tried" if cut else None
            row = sweep_row(
                model, wname, n, k, gated, m, variant, calls, cublas, torch_path, heuristic, results, why_cut
            )
            rows_done.append(row)
            (out / "engine_kernels_sweep.json").write_text(json.dumps(rows_done, indent=1))
            fmt = lambda v: f"{v:.1f}" if v is not None else "-"  # noqa: E731
            print(
                f"[{time.perf_counter() - t0:4.0f} s] {model} {wname} {n}x{k} m={m}: "
                f"cublas {row['cublas_us']:.1f} us ({row['cublas_tb_s']:.2f} TB/s), "
                f"best {fmt(row['best_us'])} us ({row['best_tb_s'] or 0:.2f} TB/s) {row['best_config']}, "
                f"heuristic {heuristic} {fmt(row['heuristic_us'])} us -> {row['chosen_config']} "
                f"[{row['timed']} timed, {row['refused']} refused{', CUT' if cut else ''}]",
                flush=True,
            )
        del wt
        if dev == "cuda":
            torch.cuda.empty_cache()
    return rows_done


def write_configs(rows: list[dict], out: Path, dev: str, command: str) -> Path:
    """The sweep's chosen config per table key, as ``engine.triton_kernels.config_table`` reads it: into
    ``engine/kernel_configs/<device>.json`` (GPU runs only) and a copy into ``out``."""
    from engine import triton_kernels as tk

    name = torch.cuda.get_device_name() if dev == "cuda" else ""
    stem = tk.device_key(name) if name else "cpu_smoke"  # a CPU run never writes into the engine's tables
    table = {}
    for r in rows:
        cfg = [int(v) for v in r["chosen_config"]]
        assert not (r["gated"] and cfg[2] != 1), r  # gate/up runs without a split
        table[r["key"]] = cfg
    when = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
    head = {"device": name or "cpu (smoke run, Triton interpreter)", "measured": f"{when}, {command}"}
    body = ",\n".join(f"  {json.dumps(key)}: {json.dumps(table[key])}" for key in sorted(table))
    text = json.dumps(head, indent=1)[:-2] + ',\n "skinny": {\n' + body + "\n }\n}\n"
    assert json.loads(text)["skinny"] == table
    paths = [out / f"{stem}.json"] + ([tk.CONFIG_DIR / f"{stem}.json"] if name else [])
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        print(f"wrote {len(table)} configs to {path}", flush=True)
    tk.config_table.cache_clear()  # later lookups in this process (the profile) read the new table
    tk.skinny_config.cache_clear()
    return paths[-1]


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
    p.add_argument(
        "--write-configs",
        action="store_true",
        help="after the sweep, write the chosen config per shape into engine/kernel_configs/<gpu>.json "
        "(and a copy into --out; a CPU run writes only --out/cpu_smoke.json); the profile then runs after it",
    )
    p.add_argument("--sweep-budget-s", type=float, default=110.0, help="past this, time only the heuristic")
    a = p.parse_args()
    a.out.mkdir(parents=True, exist_ok=True)
    if a.smoke_cpu:
        os.environ["TRITON_INTERPRET"] = "1"
    dev = "cpu" if a.smoke_cpu else "cuda"
    dtype = torch.float16 if a.smoke_cpu else torch.bfloat16
    torch.manual_seed(0)
    command = "python benchmarks/engine_kernels.py " + " ".join(sys.argv[1:])
    # The profile first (cheap, says most; the sweep may be cut), unless it is to use the configs written.
    if not a.skip_profile and not a.write_configs:
        profile(a.out, dev, a.smoke_cpu)
    if not a.skip_sweep:
        rows = sweep(a.out, dev, dtype, a.smoke_cpu, a.sweep_budget_s)
        if a.write_configs:
            write_configs(rows, a.out, dev, command)
    if not a.skip_profile and a.write_configs:
        profile(a.out, dev, a.smoke_cpu)


if __name__ == "__main__":
    main()
