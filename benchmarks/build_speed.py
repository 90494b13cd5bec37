"""The build-speed section of ``validator_bench.py``: KernelBench ``load_inline`` builds, cold / warm /
batched, per candidate and per minute, at several parallel widths, with torch's plain ``load_inline`` in the
same run.

Modes (each at every ``--build-parallel`` width P, on distinct candidates so that every build is cold):

* ``fast``: the validator's build (:mod:`dice.validator.fastbuild`) through the interception KernelBench
  uses, P driver processes side by side, a fresh cache (the PCH is built once before, in ``prepare``);
* ``warm``: the same candidates again, same cache (what a second task of the same candidate pays);
* ``plain``: torch's own ``load_inline`` (ninja), a fresh build folder per candidate;
* ``batched``: P candidates in flight: P / ``--batch-size`` prebuild processes side by side, each building
  ``--batch-size`` candidates at once (:func:`dice.validator.batchbuild.prebuild`), chunk after chunk, each
  candidate's own import served from its batch.

Every measurement is one JSON line in ``validator_build_bench.jsonl`` as soon as it is made (a run cut short
keeps its numbers); the summaries go to ``validator_build_bench.json`` and ``.md``. Candidates are the
hand-written level-1 ones in tests/validator/candidates with ``constexpr int dice_bench_variant = K;`` put
in their CUDA source; ``--smoke-cpu`` uses a C++-only candidate instead (runs on a machine without a GPU).
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
import validator_bench as _validator_bench  # noqa: E402

CANDIDATES = ROOT / "tests" / "validator" / "candidates"
# the hand-written level-1 candidates, as validator_bench.py names them (problem id -> file stem)
NAMES = _validator_bench.PROBLEMS
PROBLEMS = list(NAMES)
SMOKE = '''import torch
from torch.utils.cpp_extension import load_inline

src = r"""
#include <torch/extension.h>
constexpr double dice_bench_variant = VARIANT;
torch::Tensor forward(torch::Tensor x) { return x * dice_bench_variant + 1.0; }
"""
ext = load_inline(name="smoke_ext", cpp_sources=src, functions=["forward"])


class ModelNew(torch.nn.Module):
    def forward(self, x):
        return ext.forward(x)
'''


def candidates(count: int, first: int, smoke: bool) -> list[tuple[str, str]]:
    """(name, source) of ``count`` distinct candidates, variants ``first`` ... ``first + count - 1``."""
    out = []
    for k in range(first, first + count):
        if smoke:
            out.append((f"smoke_v{k}", SMOKE.replace("VARIANT", str(k))))
            continue
        pid = PROBLEMS[k % len(PROBLEMS)]
        path = CANDIDATES / f"level1_{pid}_{NAMES[pid]}.py"
        marker = '_cuda_source = r"""\n'
        src = path.read_text().replace(marker, f"{marker}constexpr int dice_bench_variant = {k};\n", 1)
        out.append((f"{path.stem}_v{k}", src))
    return out


# ------------------------------------------------------------------------------------------------ driver
def driver(spec_file: Path) -> int:
    """One driver process: build (or prebuild, then serve) its candidates, one JSON line each."""
    spec = json.loads(spec_file.read_text())
    import torch  # noqa: F401 - imported before any timing

    cache, work = Path(spec["cache"]), Path(spec["work"])
    work.mkdir(parents=True, exist_ok=True)
    chunks = [[tuple(x) for x in c] for c in spec["chunks"]]
    items = [x for c in chunks for x in c]
    base = {"mode": spec["mode"], "parallel": spec["parallel"], "run": spec["run"], "pid": os.getpid()}
    if spec["mode"] == "batched":  # one prebuild per chunk, in turn, each chunk's candidates served after it
        for chunk in chunks:
            serve_batch(spec, base, cache, work, chunk)
        return 0
    build_each(spec, base, cache, work, items)
    return 0


def serve_batch(
    spec: dict[str, Any], base: dict[str, Any], cache: Path, work: Path, items: list[tuple[str, str]]
) -> None:
    """Prebuild ``items`` at once, then import each (served from the combined build), a line per step."""
    from dice.validator.batchbuild import prebuild

    start = time.time()
    report = prebuild(cache, work, [src for _, src in items])
    emit(spec, {**base, "phase": "prebuild", "start": start, "end": time.time(), "builds": report["builds"]})
    for (name, _), c in zip(items, report["candidates"], strict=True):
        line = {"phase": "ready", "candidate": name, "status": c["status"], "reason": c["reason"]}
        emit(spec, {**base, **line, "ready_s": c["seconds"], "start": start})
    build_each(spec, base, cache, work, items)


def build_each(
    spec: dict[str, Any], base: dict[str, Any], cache: Path, work: Path, items: list[tuple[str, str]]
) -> None:
    """Import each candidate (building its extension unless the cache holds it), a line each."""
    from dice.validator.builds import cached_extension_builds, import_source

    for i, (name, src) in enumerate(items):
        records: list[dict[str, Any]] = []
        error = None
        start = time.time()
        try:
            builds = plain_builds(work / name, records) if spec["mode"] == "plain" else None
            with builds or cached_extension_builds(cache, records):
                import_source(src, work / f"{name}.py", f"bench_{spec['run']}_{os.getpid()}_{i}")
        except Exception as exc:  # noqa: BLE001 - a failed build is a measurement too
            error = f"{type(exc).__name__}: {exc}"[:400]
        line = {
            **base,
            "phase": "build",
            "candidate": name,
            "start": start,
            "end": time.time(),
            "error": error,
        }
        line["load_inline_s"] = round(sum(r.get("seconds", 0.0) for r in records), 3)
        line["cached"] = bool(records) and all(r.get("cached") for r in records)
        line["batched"] = bool(records) and all(r.get("batched") for r in records)
        line["steps"] = [r.get("build") for r in records]
        emit(spec, line)


@contextlib.contextmanager
def plain_builds(folder: Path, records: list[dict[str, Any]]) -> Any:
    """torch's own load_inline, timed, in a fresh build folder."""
    import torch.utils.cpp_extension as cpp_extension

    original = cpp_extension.load_inline

    def load_inline(name: str, *args: Any, **kwargs: Any) -> Any:
        kwargs["build_directory"] = str(folder / f"{name}_{len(records)}")
        os.makedirs(kwargs["build_directory"], exist_ok=True)
        start = time.perf_counter()
        try:
            return original(name, *args, **kwargs)
        finally:
            records.append({"name": name, "cached": False, "seconds": time.perf_counter() - start})

    cpp_extension.load_inline = load_inline
    try:
        yield
    finally:
        cpp_extension.load_inline = original


def emit(spec: dict[str, Any], line: dict[str, Any]) -> None:
    with open(spec["out"], "a", encoding="utf-8") as f:  # one write per line: lines of drivers never mix
        f.write(json.dumps(line, default=str) + "\n")


# ------------------------------------------------------------------------------------------------ runs
def run_mode(
    mode: str, parallel: int, items: list[tuple[str, str]], cache: Path, ctx: dict[str, Any]
) -> dict:
    """P driver processes on ``items`` (batched: P // batch lanes, each prebuilding its chunks in turn; else
    round-robin); the summary of their lines."""
    run = f"{mode}{parallel}_{int(time.time() * 1000) % 10**8}"
    if mode == "batched":  # P candidates in flight: P // batch prebuild processes, each taking chunks in turn
        size = min(ctx["batch_size"], parallel)
        chunks = [items[i : i + size] for i in range(0, len(items), size)]
        lanes = max(1, parallel // size)
        work_of = [chunks[i::lanes] for i in range(lanes)]
    else:
        work_of = [[items[i::parallel]] for i in range(parallel)]
    procs = []
    for n, lane in enumerate(w for w in work_of if any(w)):
        spec = {
            "mode": "fast" if mode == "warm" else mode,
            "parallel": parallel,
            "run": run,
            "chunks": lane,
            "cache": str(cache),
            "work": str(ctx["tmp"] / run / str(n)),
            "out": str(ctx["jsonl"]),
        }
        spec_file = ctx["tmp"] / f"{run}_{n}.json"
        spec_file.write_text(json.dumps(spec))
        cmd = [
            sys.executable,
            str(ROOT / "benchmarks" / "validator_bench.py"),
            "--build-driver",
            str(spec_file),
        ]
        procs.append(subprocess.Popen(cmd, env=ctx["env"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    cut = False
    for proc in procs:
        left = ctx["deadline"] - time.monotonic()
        try:
            proc.wait(timeout=max(1.0, left))
        except subprocess.TimeoutExpired:
            cut = True
            proc.kill()
    for proc in procs:
        tail = proc.communicate()[0].decode(errors="replace")
        if proc.returncode not in (0, None, -9) and tail:
            print(f"[{mode}] driver failed: {tail[-1500:]}", flush=True)
    lines = [json.loads(x) for x in ctx["jsonl"].read_text().splitlines() if f'"run": "{run}"' in x]
    summary = summarize(mode, parallel, len(items), lines, cut)
    with open(ctx["jsonl"], "a", encoding="utf-8") as f:
        f.write(json.dumps({"summary": summary}) + "\n")
    print(f"[builds] {json.dumps(summary)}", flush=True)
    return summary


def summarize(mode: str, parallel: int, count: int, lines: list[dict], cut: bool) -> dict[str, Any]:
    builds = [x for x in lines if x.get("phase") == "build"]
    ok = [x for x in builds if not x.get("error")]
    out: dict[str, Any] = {"mode": mode, "parallel": parallel, "candidates": count, "done": len(builds)}
    out.update(
        ok=len(ok), cut_short=cut, errors=sorted({x["error"][:160] for x in builds if x.get("error")})[:3]
    )
    if mode == "batched":
        ready = [x for x in lines if x.get("phase") == "ready"]
        pre = [x for x in lines if x.get("phase") == "prebuild"]
        statuses = [x["status"] for x in ready]
        out["statuses"] = {s: statuses.count(s) for s in sorted(set(statuses))}
        out["per_candidate_s"] = _stats([x["ready_s"] for x in ready])
        out["served_s"] = _stats([x["load_inline_s"] for x in ok if x.get("batched")])
        out["served_from_batch"] = sum(1 for x in ok if x.get("batched"))
        spans = [(x["start"], x["end"]) for x in pre] + [(x["start"], x["end"]) for x in builds]
    else:
        out["per_candidate_s"] = _stats([x["load_inline_s"] for x in ok])
        spans = [(x["start"], x["end"]) for x in builds]
        steps = [s for x in ok for s in x.get("steps") or [] if s]
        out["modes"] = sorted({f"{s.get('compile_mode')}/{s.get('cuda_compile_mode')}" for s in steps})
    if spans:
        wall = max(e for _, e in spans) - min(s for s, _ in spans)
        out["wall_s"] = round(wall, 2)
        out["per_min"] = round(60.0 * len(ok) / wall, 1) if wall > 0 else None
    return out


def _stats(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    values = sorted(values)
    return {
        "median": round(statistics.median(values), 3),
        "p90": round(values[int(0.9 * (len(values) - 1))], 3),
        "max": round(values[-1], 3),
        "n": len(values),
    }


def bench_builds(args: Any, out_dir: Path, tmp: Path, machine: dict[str, Any]) -> dict[str, Any]:
    """The whole build section, in the order it runs (prepare, then per width: fast, warm,
    batched, plain); the budget stops it between steps; its files are written to ``out_dir`` as it goes."""
    smoke = bool(args.smoke_cpu)
    widths = (
        [int(x) for x in args.build_parallel.split(",")]
        if args.build_parallel
        else ([1, 2] if smoke else [1, 4, 16])
    )
    counts = dict(_pairs(args.build_counts or ("1:3,2:3" if smoke else "1:4,4:8,16:16")))
    batch_size = args.batch_size or (3 if smoke else 4)
    modes = set((getattr(args, "build_modes", None) or "fast,warm,batched,plain").split(","))
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = "validator_build_bench_smoke" if smoke else "validator_build_bench"
    jsonl = out_dir / f"{stem}.jsonl"
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, DICE_PCH_DIR=str(tmp / "pch"), PYTHONPATH=path)
    if not smoke:
        env.setdefault("TORCH_CUDA_ARCH_LIST", _arch() or "9.0")
    env.pop("MAX_JOBS", None)
    budget = args.budget_s or 1e9
    ctx = {
        "tmp": tmp,
        "jsonl": jsonl,
        "env": env,
        "batch_size": batch_size,
        "deadline": time.monotonic() + budget,
    }
    result: dict[str, Any] = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "machine": machine,
        "date": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "smoke": smoke,
        "widths": widths,
        "counts": counts,
        "batch_size": batch_size,
        "summaries": [],
    }
    with open(jsonl, "a", encoding="utf-8") as f:
        f.write(json.dumps({"header": {k: v for k, v in result.items() if k != "summaries"}}) + "\n")

    def step(mode: str, width: int, items: list[tuple[str, str]], cache: Path) -> None:
        if mode not in modes | {"prepare"}:
            return
        if mode == "batched" and width < 2:
            result["summaries"].append({"mode": mode, "parallel": width, "skipped": "one at a time"})
            return
        if time.monotonic() > ctx["deadline"]:
            result["summaries"].append({"mode": mode, "parallel": width, "skipped": "budget spent"})
        else:
            result["summaries"].append(run_mode(mode, width, items, cache, ctx))
        write_build_results(result, out_dir / f"{stem}.json", out_dir / f"{stem}.md")

    variant = 1000
    step("prepare", 1, candidates(1, 0, smoke), tmp / "cache_prepare")  # the PCH, nvcc's first start
    for width in widths:
        n = counts.get(width, max(width, 4))
        cold = candidates(n, variant, smoke)
        step("fast", width, cold, tmp / f"cache_fast{width}")
        step("warm", width, cold, tmp / f"cache_fast{width}")
        step(
            "batched",
            width,
            candidates(n, variant + 200, smoke),
            tmp / f"cache_batch{width}",
        )
        # the baseline last: it is the slowest, and a budget that runs out should cut it, not ours
        step("plain", width, candidates(n, variant + 100, smoke), tmp / f"cache_plain{width}")
        variant += 1000
    return result


def write_build_results(result: dict[str, Any], json_path: Path, md_path: Path) -> None:
    json_path.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Validator build speed" + (" (CPU smoke run, C++-only candidates)" if result["smoke"] else ""),
        "",
        f"- command: `{result['command']}`",
        f"- machine: {json.dumps(result['machine'])}",
        f"- date (UTC): {result['date']}; batch size {result['batch_size']}",
        "",
        "| mode | parallel | candidates | ok | median s / cand. | p90 s | wall s | candidates/min | notes |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for s in result["summaries"]:
        if "skipped" in s:
            lines.append(f"| {s['mode']} | {s['parallel']} | - | - | - | - | - | - | {s['skipped']} |")
            continue
        stats = s.get("per_candidate_s") or {}
        notes = (
            [f"statuses {s['statuses']}, served in {(s.get('served_s') or {}).get('median')} s"]
            if "statuses" in s
            else []
        )
        notes += (
            [f"{m}" for m in s.get("modes", [])] + (["cut short"] if s.get("cut_short") else []) + s["errors"]
        )
        lines.append(
            f"| {s['mode']} | {s['parallel']} | {s['candidates']} | {s['ok']} | {stats.get('median', '-')} | "
            f"{stats.get('p90', '-')} | {s.get('wall_s', '-')} | {s.get('per_min', '-')} | "
            f"{'; '.join(notes)} |"
        )
    lines += [
        "",
        "Per candidate: load_inline seconds inside the process (fast, warm, plain) or seconds from the",
        "prebuild's start until the candidate's extension was ready (batched). candidates/min: finished",
        "candidates over the wall time from the first start to the last end.",
    ]
    md_path.write_text("\n".join(lines) + "\n")


def _pairs(text: str) -> list[tuple[int, int]]:
    return [(int(a), int(b)) for a, b in (p.split(":") for p in text.split(",") if p)]


def _arch() -> str | None:
    try:
        import torch

        if torch.cuda.is_available():
            major, minor = torch.cuda.get_device_capability()
            return f"{major}.{minor}"
    except Exception:  # noqa: BLE001
        return None
    return None
