"""Parallel decoding that pays? Tokens per denoising step of the ``dynamic`` policy against ``static``.

On a model whose confidences mean something (the embedded model by default, or ``--model``), greedy fills of
statement holes cut from real CUDA files (``../shared/data/cuda-corpus``: one statement line inside a
``__global__`` function, a seeded sample of files) with the assistant's infilling prompt, block 4:
``static`` at 4 steps per block (1 token per step, as DICE's evaluation) and ``dynamic`` at each threshold
(all slots above it, at least one per step). Reported per setting: tokens committed per step (step map),
CPU wall time and tok/s, and how often the fill equals the static fill and the original statement. With
``--step-ms`` (a measured 8B step, engine_bench.py) it adds the 8B-shape tok/s that the tokens per step
imply at batch 1, beside the autoregressive limit (weights / bandwidth).

    python benchmarks/parallel_decoding.py --holes 40 --out benchmarks/results
"""

from __future__ import annotations

import argparse
import gzip
import json
import platform
import random
import re
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.cuda_source import parse_document  # noqa: E402
from engine import load_engine  # noqa: E402
from engine.infill import InfillPlan  # noqa: E402


def holes(corpus: Path, count: int, seed: int) -> list[dict]:
    """Statement lines inside __global__ bodies: prefix up to the line, suffix after it, the line itself."""
    rng = random.Random(seed)
    with gzip.open(corpus, "rt", encoding="utf-8") as f:
        files = [json.loads(line) for line in f]
    files = [r for r in files if "__global__" in r["text"] and len(r["text"]) < 60_000]
    rng.shuffle(files)
    out = []
    for rec in files:
        text = rec["text"]
        doc = parse_document(text)
        data = doc.data
        bodies = [f for f in doc.functions if f.kind == "global" and f.body_end_byte - f.body_start_byte > 80]
        if not bodies:
            continue
        fn = rng.choice(bodies)
        body = data[fn.body_start_byte : fn.body_end_byte].decode("utf-8", "replace")
        lines = body.split("\n")
        cand = [
            i
            for i, ln in enumerate(lines)
            if re.fullmatch(r"\s*[A-Za-z_][^;{}/#]*;\s*", ln) and 8 <= len(ln.strip()) <= 100
        ]
        if not cand:
            continue
        i = rng.choice(cand)
        before = data[: fn.body_start_byte].decode("utf-8", "replace") + "\n".join(lines[:i]) + "\n"
        indent = re.match(r"\s*", lines[i]).group(0)
        after = "\n" + "\n".join(lines[i + 1 :]) + data[fn.body_end_byte :].decode("utf-8", "replace")
        out.append(
            {
                "repo": rec["repo"],
                "path": rec["path"],
                "prefix": before + indent,
                "suffix": after,
                "target": lines[i].strip(),
            }  # fmt: skip
        )
        if len(out) == count:
            break
    return out


def run(eng, tasks: list[dict], policy: str, threshold: float) -> dict:
    tok = eng.tokenizer
    fills, tokens, steps, secs = [], 0, 0, 0.0
    for t in tasks:
        plan = InfillPlan.make(t["prefix"][-3000:], t["suffix"][:1500], shape="statement")
        ids = tok.encode(plan.prompt_text)
        start = time.perf_counter()
        out = eng.generate(
            ids, max_new_tokens=48, policy=policy, threshold=threshold, steps_per_block=4,
            until=lambda r, new, plan=plan: plan.reached_end(tok.decode(new)),
        )  # fmt: skip
        secs += time.perf_counter() - start
        tokens += len(out.ids[0])
        steps += max(out.step_map[0], default=0)
        fills.append(plan.finish(tok.decode(out.ids[0]), out.finished[0])[0].strip())
    return {"policy": policy, "threshold": threshold, "tokens": tokens, "steps": steps,
            "tokens_per_step": tokens / max(steps, 1), "seconds": secs, "tok_s": tokens / secs,
            "fills": fills}  # fmt: skip


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    p.add_argument("--holes", type=int, default=40)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--thresholds", default="0.9,0.7,0.5")
    p.add_argument("--step-ms", type=float, default=None, help="a measured 8B step (ms), for implied tok/s")
    p.add_argument("--ar-limit", type=float, default=None, help="8B weights / bandwidth, tok/s")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    a = p.parse_args()
    tasks = holes(a.data / "cuda-corpus" / "files.jsonl.gz", a.holes, a.seed)
    eng = load_engine(a.model, device="cpu")
    eng.generate(eng.tokenizer.encode("__global__ void f() {"), max_new_tokens=8)  # warm-up
    results = [run(eng, tasks, "static", 0.9)]
    for th in [float(x) for x in a.thresholds.split(",")]:
        results.append(run(eng, tasks, "dynamic", th))
    ref = results[0]["fills"]
    norm = [re.sub(r"\s+", "", t["target"]) for t in tasks]
    for r in results:
        r["same_as_static"] = sum(f == g for f, g in zip(r["fills"], ref, strict=True)) / len(tasks)
        r["exact"] = sum(re.sub(r"\s+", "", f) == n for f, n in zip(r["fills"], norm, strict=True)) / len(
            tasks
        )
        if a.step_ms:
            r["implied_8b_tok_s"] = r["tokens_per_step"] * 1000 / a.step_ms
    a.out.mkdir(parents=True, exist_ok=True)
    name = f"parallel_decoding_{eng.name}"
    meta = {"model": eng.name, "holes": len(tasks), "repos": sorted({t["repo"] for t in tasks}),
            "machine": f"{platform.processor() or platform.machine()}, CPU, torch threads default",
            "command": "python " + " ".join(sys.argv),
            "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
            "step_ms_8b": a.step_ms, "ar_limit_8b": a.ar_limit}  # fmt: skip
    (a.out / f"{name}.json").write_text(json.dumps({"meta": meta, "results": results}, indent=1) + "\n")
    lines = [
        f"# Parallel decoding on {eng.name}: tokens per step, dynamic vs static",
        "",
        f"{meta['date_utc']} UTC, `{meta['command']}`; {len(tasks)} statement holes from "
        f"{len(meta['repos'])} projects of the cuda-corpus (seed {a.seed}), greedy, block 4, at most 48 "
        "tokens, the infilling prompt with the statement shape; on this machine's CPU.",
        "",
        "| policy | threshold | tokens/step | tok/s (CPU) | same fill as static | equals the original |"
        + (" implied 8B tok/s |" if a.step_ms else ""),
        "| --- | --- | --- | --- | --- | --- |" + (" --- |" if a.step_ms else ""),
    ]
    for r in results:
        th = "-" if r["policy"] == "static" else f"{r['threshold']:.2f}"
        lines.append(
            f"| {r['policy']} | {th} | {r['tokens_per_step']:.2f} | {r['tok_s']:.0f} | "
            f"{r['same_as_static']:.0%} | {r['exact']:.0%} |"
            + (f" {r['implied_8b_tok_s']:.0f} |" if a.step_ms else "")
        )
    if a.step_ms:
        lines += ["", f"8B step: {a.step_ms:.2f} ms (engine_bench.py); AR limit {a.ar_limit or 0:.0f} tok/s."]
    (a.out / f"{name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
