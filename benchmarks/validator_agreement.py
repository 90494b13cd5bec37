"""Agreement benchmark: every KernelBench-format kernel in ../shared/data that its source judged correct,
through the validator pool (``validate_many``), against that judgement.

Sources (both KernelBench v0 problems, levels 1-2 and 1-3):

* ``pr67``: KernelBench PR #67's DeepSeek-R1 SFT set. Answers are the parquet rows (``extract_program``),
  references are cut out of each row's prompt. The judgements are the ``best_k_kernels_level{1,2}.json``
  entries (786, all "correct", RTX A6000). The parquet rows of a problem are its JSON entries in order,
  except that rows whose answer is the unchanged reference (no ``ModelNew``) sit in between: the j-th
  ``ModelNew`` row of a problem is its j-th entry (checked on the kernel names of each entry's profiler
  table). No speedups are recorded (the entries hold only the kernel's own time).
* ``cuda-l1``: CUDA-L1's ``h100.json``: every record with code and ``score_default`` (its eager speedup on
  H100); timed here, and a speedup outside [recorded / 3, recorded x 3] is a "speedup far" disagreement.

Resumable: finished records go to ``<out-dir>/validator_agreement.jsonl`` keyed by (source, id) and are
skipped on a rerun; ``--budget-s`` stops taking tasks, ``--grace-s`` more seconds wait for those in flight.
The report (``validator_agreement.{json,md}``) is rebuilt from the JSONL at the end of every run (or with
``--report-only``); each disagreement gets a review file (verdict, log, the candidate's relevant lines).
Without a GPU (and without ``--smoke-cpu``) only the verdicts that do not depend on one are recorded (the
static guards, Python syntax); the rest is left to the GPU run.

    python benchmarks/validator_agreement.py --pack build/agreement_pack.jsonl      # here, with ../shared
    python benchmarks/validator_agreement.py --tasks build/agreement_pack.jsonl --budget-s 400 --workers 14
    python benchmarks/validator_agreement.py --smoke-cpu                           # the flow without a GPU
    python benchmarks/validator_agreement.py --report-only --tasks build/agreement_pack.jsonl
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import shlex
import subprocess
import sys
import time
from collections import Counter, defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.validator.batch import BatchStats, BatchTask, gpu_spread, validate_many  # noqa: E402
from dice.validator.kbeval import read_records  # noqa: E402
from dice.validator.verdict import first_line  # noqa: E402
from engine.answers import extract_program  # noqa: E402

NAME = "validator_agreement"
SPEED_FACTOR = 3.0  # a measured speedup within [recorded / 3, recorded x 3] agrees (other GPU, other torch)
LOG_CHARS = 4000
_MODEL_NEW = re.compile(r"^\s*class\s+ModelNew\b", re.MULTILINE)
_GLOBAL_NAME = re.compile(r"__global__\s+(?:__launch_bounds__\([^)]*\)\s*)?(?:[\w:<>,*&\s]*?\s)?(\w+)\s*\(")
_PROFILER_NAME = re.compile(r"^[ \t]*(?:void[ \t]+)?([A-Za-z_]\w*)(?:<[^(\n]*)?\(", re.MULTILINE)
_GUARD = re.compile(r"rejected by guard (\w+):")
_ARCH = "You are given the following architecture:"


# ------------------------------------------------------------------------------------------------ data
def default_data() -> Path:
    env = os.environ.get("DICE_SHARED_DATA")
    return Path(env) if env else ROOT.parent / "shared" / "data"


def reference_from_prompt(question: str) -> str:
    """The reference program in a KernelBench prompt: the fenced block after "You are given the following
    architecture:" (the prompt indents its first line and the closing fence)."""
    start = question.index(_ARCH)
    opened = question.index("```", start) + 3
    body = question[opened : question.index("```", opened)].partition("\n")[2]
    first, _, rest = body.partition("\n")
    return (first.strip() + "\n" + rest).rstrip() + "\n"


def load_pr67(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The PR-67 kernels that have both an answer and a judgement, and the counts behind that."""
    import pyarrow.parquet as pq

    rows = []
    for split in ("train", "eval"):
        for row in pq.read_table(folder / f"sft_dataset_best_4_{split}.parquet").to_pylist():
            rows.append({**row, "split": split})
    entries = {}
    for level in (1, 2):
        raw = json.loads((folder / f"best_k_kernels_level{level}.json").read_text(encoding="utf-8"))
        entries.update({(level, int(p)): list(v) for p, v in raw.items()})
    by_problem: dict[tuple[int, int], list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        by_problem[(int(row["level"]), int(row["problem"]))].append(row)
    counts = Counter(
        parquet_rows=len(rows),
        judgements=sum(len(v) for v in entries.values()),
        judged_correct=sum(bool(e.get("correctness")) for v in entries.values() for e in v),
    )
    out = []
    for (level, problem), group in sorted(by_problem.items()):
        judged = entries.get((level, problem), [])
        j = 0
        for rank, row in enumerate(group):
            program = extract_program(row["answer"])
            if not _MODEL_NEW.search(program):
                counts["reference_only_rows"] += 1
                continue
            if j >= len(judged):
                counts["answers_without_judgement"] += 1
                continue
            entry, j = judged[j], j + 1
            names = set(_PROFILER_NAME.findall(entry.get("metadata", {}).get("profiler_info", "")))
            check = "profiler table empty" if not names else "match"
            if names and not names & set(_GLOBAL_NAME.findall(program)):
                check = "kernel names differ"
            counts[f"join: {check}"] += 1
            if not entry.get("correctness"):
                continue
            out.append(
                {
                    "source": "pr67",
                    "id": f"L{level}-{problem}-r{rank}",
                    "level": level,
                    "problem": problem,
                    "ref_src": reference_from_prompt(row["question"]),
                    "cand_src": program,
                    "label": "correct",
                    "recorded_speedup": None,
                    "meta": {
                        "split": row["split"],
                        "rank": rank,
                        "sample_id": entry.get("sample_id"),
                        "run_name": entry.get("run_name"),
                        "runtime_ms": entry.get("runtime"),
                        "trials": entry.get("metadata", {}).get("correctness_trials"),
                        "join": check,
                        "has_global": "__global__" in program,
                    },
                }
            )
        counts["judgements_without_answer"] += max(0, len(judged) - j)
    counts["kernels"] = len(out)
    return out, dict(counts)


def load_cuda_l1(folder: Path, gpu: str = "h100") -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """CUDA-L1 records with code and a recorded eager speedup."""
    counts: Counter[str] = Counter()
    out = []
    for line in (folder / f"{gpu}.json").read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        rec = json.loads(line)
        counts["records"] += 1
        code = rec.get("custom_code")
        if code is None or code.strip() == "None":
            counts["no_code"] += 1
            continue
        if rec.get("score_default") is None:
            counts["code_without_speedup"] += 1
            continue
        has_global = "__global__" in code
        counts["with_global"] += has_global
        out.append(
            {
                "source": "cuda-l1",
                "id": f"L{rec['level_id']}-{rec['task_id']}",
                "level": int(rec["level_id"]),
                "problem": int(rec["task_id"]),
                "ref_src": rec["ref_code"],
                "cand_src": code,
                "label": "correct",
                "recorded_speedup": float(rec["score_default"]),
                "meta": {"gpu": gpu.upper(), "has_global": has_global},
            }
        )
    counts["kernels"] = len(out)
    return out, dict(counts)


def load_tasks(args: argparse.Namespace) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The records of ``--tasks`` (a pack) or extracted from ``--data``; the data counts beside them."""
    if args.tasks:
        tasks, counts = [], {}
        for line in Path(args.tasks).read_text(encoding="utf-8").splitlines():
            obj = json.loads(line)
            if "counts" in obj:
                counts = obj["counts"]
            else:
                tasks.append(obj)
        return tasks, counts
    data = Path(args.data)
    if not data.is_dir():
        raise SystemExit(f"{data}: no such folder (pass --data DIR or --tasks PACK.jsonl)")
    pr67, pr67_counts = load_pr67(data / "kernelbench-pr67-dsr1")
    l1, l1_counts = load_cuda_l1(data / "cuda-l1")
    return pr67 + l1, {"pr67": pr67_counts, "cuda-l1": l1_counts}


def choose(tasks: list[dict[str, Any]], args: argparse.Namespace, done: set[tuple[str, str]]) -> list[Any]:
    """The tasks of this run: the chosen sources, shuffled (a partial run is a fair sample), not done."""
    chosen = [t for t in tasks if args.source in ("all", t["source"])]
    if args.shuffle_seed >= 0:
        random.Random(args.shuffle_seed).shuffle(chosen)
    chosen = [t for t in chosen if (t["source"], t["id"]) not in done]
    if args.smoke_cpu:  # a few of each source
        per = max(1, args.limit // 2)
        chosen = [t for s in ("pr67", "cuda-l1") for t in [x for x in chosen if x["source"] == s][:per]]
    return chosen[: args.limit] if args.limit else chosen


# ------------------------------------------------------------------------------------------------ running


def device_name() -> str:
    try:
        names = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=20,
            check=True,
        ).stdout.split("\n")
        names = [n.strip() for n in names if n.strip()]
        return f"{len(names)} x {names[0]}" if names else "no GPU"
    except (OSError, subprocess.SubprocessError):
        return "no GPU"


def record_of(task: BatchTask, verdict: Any, device: str) -> dict[str, Any]:
    """The JSONL record of one verdict (the sources stay in the pack; the log keeps its head and tail)."""
    t = task.key
    rec = {k: t[k] for k in ("source", "id", "level", "problem", "label", "recorded_speedup")}
    v = verdict.to_json()
    for bulky in ("diagnostics", "unchecked"):
        v.pop(bulky, None)
    if len(v["log"]) > LOG_CHARS:
        v["log"] = v["log"][: LOG_CHARS // 2] + "\n...\n" + v["log"][-LOG_CHARS // 2 :]
    rec.update(meta=t.get("meta", {}), timing=task.timing, strict=task.strict, verdict=v, device=device)
    rec["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
    return rec


def decided_without_gpu(verdict: Any) -> bool:
    """Whether a verdict of a pool without GPU is final: the checks before the GPU run (Python syntax,
    ModelNew, the static guards) are the same on every machine; NVRTC's look at the device code is not the
    real build, and nothing was run."""
    return verdict.status == "rejected" or (
        verdict.status == "compile_error"
        and verdict.message.startswith(("candidate has a Python syntax error", "candidate defines no class"))
    )


def stop_busy_workers(pool: Any) -> None:
    """Kill the pool's worker processes (this script started them) so that close() does not wait on the
    tasks the budget left running: ValidatorPool.close() joins each busy slot for up to 30 s in turn."""
    import signal

    for worker in list(getattr(pool, "_live", [])):
        if worker is not None and worker.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(worker.proc.pid, signal.SIGKILL)


def run(args: argparse.Namespace, tasks: list[dict[str, Any]], records_path: Path) -> dict[str, Any]:
    """Validate the chosen tasks, appending each record to the JSONL as it finishes; the run's summary."""
    from dice.validator import ValidatorPool

    done = {(r["source"], r["id"]) for r in read_records(records_path)}
    todo = choose(tasks, args, done)
    print(f"{len(done)} records already in {records_path}; {len(todo)} to validate this run", flush=True)
    start = time.monotonic()
    stats = BatchStats()
    pool = ValidatorPool(
        args.workers or None,
        gpu=not args.smoke_cpu,
        timeout_s=args.timeout,
        build_timeout_s=args.build_timeout,
        cache_verdicts=False,
        prewarm=256,  # every worker starts at once (a GPU worker takes ~10 s)
    )
    meta = {
        "command": " ".join(shlex.quote(a) for a in sys.argv),
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "device": device_name() if pool.gpu else "no GPU (compile-only verdicts)",
        "workers": pool.workers,
        "gpu_spread": gpu_spread(pool),
        "prebuild": bool(getattr(pool, "submit_prebuild", None)) and not args.no_prebuild,
    }
    print(f"pool: {pool.workers} workers {meta['gpu_spread']}; {meta['device']}", flush=True)

    def stream() -> Iterator[BatchTask]:
        for t in todo:
            if args.budget_s and time.monotonic() - start > args.budget_s:
                print(f"budget of {args.budget_s:g} s reached: no more tasks taken", flush=True)
                return
            timing = t["source"] == "cuda-l1" or args.pr67_timing
            yield BatchTask(t["ref_src"], t["cand_src"], args.strict, timing, args.deadline_s, t)

    budget = args.budget_s + args.grace_s if args.budget_s else None
    try:
        with records_path.open("a", encoding="utf-8") as sink:
            batch = validate_many(
                pool, stream(), group_size=args.group_size, prebuild=not args.no_prebuild, stats=stats,
                budget_s=budget,
            )  # fmt: skip
            for n, (task, verdict) in enumerate(batch, 1):
                name = f"{n}/{len(todo)} {task.key['source']} {task.key['id']}"
                if not pool.gpu and not args.smoke_cpu and not decided_without_gpu(verdict):
                    print(f"{name}: not recorded, needs a GPU ({verdict.summary()})", flush=True)
                    continue
                sink.write(json.dumps(record_of(task, verdict, meta["device"])) + "\n")
                sink.flush()
                print(f"{name}: {verdict.summary()}", flush=True)
                if n % 20 == 0:
                    print(f"  rate: {stats.describe()}", flush=True)
    finally:
        if stats.dropped:
            stop_busy_workers(pool)
        pool.close()
    meta["stats"] = stats.to_json()
    meta["seconds"] = round(time.monotonic() - start, 1)
    print(f"rate: {stats.describe()}", flush=True)
    return meta


# ------------------------------------------------------------------------------------------------ report
def classify(rec: dict[str, Any]) -> tuple[str, str]:
    """(class, detail) of a record against its source's "correct": agree, guard, numeric, build failure,
    timeout, runtime error, not run (no GPU), speedup far."""
    v = rec["verdict"]
    status, message, log = v.get("status"), v.get("message") or "", v.get("log") or ""
    if status == "correct":
        recorded, measured = rec.get("recorded_speedup"), v.get("speedup")
        if recorded and measured:
            ratio = measured / recorded
            if not 1 / SPEED_FACTOR <= ratio <= SPEED_FACTOR:
                return "speedup far", f"{measured:.2f}x here vs {recorded:.2f}x recorded ({ratio:.2f}x)"
        return "agree", ""
    if status == "rejected":
        match = _GUARD.search(message)
        reason = first_line(message, 200).split(":", 1)[-1].strip() if match else first_line(message, 160)
        return "guard", (match.group(1) if match else "?") + ": " + reason
    if status == "incorrect":
        err = v.get("max_abs_err")
        return "numeric", (f"max abs err {err:.3g}; " if err is not None else "") + first_line(message, 140)
    if status == "compile_error":
        error = next((ln.strip() for ln in log.splitlines() if re.search(r"\berror\b", ln)), "")
        return "build failure", first_line(error or message, 160)
    if status == "timeout":
        return "timeout", first_line(message, 160)
    if status == "compiled":
        return "not run (no GPU)", ""
    return "runtime error", first_line(message, 160)


def _shown(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(ROOT))
    except ValueError:
        return str(path)


def _pct(a: int, b: int) -> str:
    return f"{100 * a / b:.1f} %" if b else "-"


def agreement_rows(records: list[dict[str, Any]], reviews: dict[str, Any]) -> list[dict[str, Any]]:
    """One row per source and level (and per source, and the CUDA-L1 kernels with and without __global__)."""
    groups: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for r in records:
        groups[f"{r['source']} all"].append(r)
        groups[f"{r['source']} L{r['level']}"].append(r)
        if r["source"] == "cuda-l1":
            kernel = "with" if r["meta"].get("has_global") else "without"
            groups[f"cuda-l1 {kernel} __global__"].append(r)
    groups["all"] = list(records)
    rows = []
    for name in sorted(groups, key=lambda n: (n == "all", n)):
        recs = groups[name]
        classes = Counter(classify(r)[0] for r in recs)
        statuses = Counter(r["verdict"]["status"] for r in recs)
        confirmed = sum(
            classify(r)[0] == "guard" and str(reviews.get(f"{r['source']}/{r['id']}", "")).lower() == "yes"
            for r in recs
        )
        correct = statuses["correct"]
        timed = [r for r in recs if r["verdict"].get("speedup") and r.get("recorded_speedup")]
        rows.append(
            {
                "group": name,
                "n": len(recs),
                **{s: statuses[s] for s in ("correct", "rejected", "incorrect", "compile_error")},
                **{s: statuses[s] for s in ("runtime_error", "timeout", "compiled")},
                "correct %": _pct(correct, len(recs)),
                "correct or rejected %": _pct(correct + statuses["rejected"], len(recs)),
                "correct or confirmed cheat %": _pct(correct + confirmed, len(recs)),
                "speed agrees": f"{len(timed) - classes['speedup far']}/{len(timed)}" if timed else "-",
            }
        )
    return rows


def relevant_lines(cand: str, guard: str, message: str) -> list[str]:
    """The candidate's lines a reviewer of this verdict should look at first (with 1-based numbers)."""
    patterns = {
        "no_custom_kernel": r"load_inline|__global__|cpp_extension|def forward|return ",
        "torch_fallback": r"\btry\b|\bexcept\b|fallback",
        "side_stream": r"[Ss]tream|[Tt]hread|Graph",
        "side_thread": r"[Tt]hread|concurrent|asyncio|multiprocessing",
        "monkey_patch": r"^\s*(torch|time|F|nn)\.[\w.]+\s*=|setattr\(|builtins",
        "fake_tensor": r"Fake|_make_subclass|__torch_\w+__|meta|Lazy",
        "precision_downgrade": r"half|float16|bfloat16|__half|\.to\(|dtype",
        "output_aliases_input": r"return |as_strided|\.view\(|out=",
        "inputs_mutated": r"\w_\(|copy_|out=|\.data\b|inplace",
        "outputs_cached": r"cache|self\.\w+\s*=|is None|data_ptr",
        "kernel_never_called": r"<<<|load_inline|functions=|def forward|\.\w+_cuda\(",
    }
    lines = cand.splitlines()
    wanted = set()
    pattern = re.compile(patterns.get(guard, r"(?!)"))
    wanted.update(i for i, line in enumerate(lines) if pattern.search(line))
    for m in re.finditer(r"\(line (\d+)\)", message):
        n = int(m.group(1)) - 1
        wanted.update(range(max(0, n - 3), min(len(lines), n + 4)))
    return [f"{i + 1:4d}: {lines[i]}" for i in sorted(wanted)][:80]


def write_review(folder: Path, rec: dict[str, Any], kind: str, detail: str, cand: str | None) -> Path:
    path = folder / rec["source"] / f"{rec['id']}.txt"
    path.parent.mkdir(parents=True, exist_ok=True)
    v = rec["verdict"]
    guard = detail.split(":")[0] if kind == "guard" else ""
    parts = [
        f"{rec['source']} {rec['id']} (level {rec['level']}, problem {rec['problem']}); source says "
        f"{rec['label']}" + (f", {rec['recorded_speedup']:.2f}x" if rec.get("recorded_speedup") else ""),
        f"meta: {json.dumps(rec.get('meta', {}))}",
        f"class: {kind}: {detail}",
        f"verdict: {v.get('status')}; {v.get('message')}",
        "--- log ---",
        v.get("log") or "(empty)",
    ]
    if cand is None:
        parts.append("--- candidate: not available (run the report with --tasks PACK or --data) ---")
    else:
        if kind == "guard":
            parts += [
                f"--- lines relevant to {guard} ---",
                *relevant_lines(cand, guard, v.get("message", "")),
            ]
        numbered = [f"{i:4d}: {line}" for i, line in enumerate(cand.splitlines(), 1)]
        parts += ["--- candidate ---", *numbered]
    path.write_text("\n".join(parts) + "\n", encoding="utf-8")
    return path


def _table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    out = ["| " + " | ".join(columns) + " |", "| " + " | ".join("---" for _ in columns) + " |"]
    for row in rows:
        out.append("| " + " | ".join(str(row.get(c, "")).replace("|", "\\|") for c in columns) + " |")
    return out


def report(args: argparse.Namespace, out_dir: Path, counts: dict[str, Any], tasks: list[Any]) -> None:
    """Rebuild validator_agreement.{json,md} and the review folder from the JSONL (latest record per key)."""
    latest = {(r["source"], r["id"]): r for r in read_records(out_dir / f"{NAME}.jsonl")}
    records = sorted(latest.values(), key=lambda r: (r["source"], r["level"], r["problem"], r["id"]))
    reviews_path = Path(args.reviews) if args.reviews else out_dir / f"{NAME}_reviews.json"
    reviews = json.loads(reviews_path.read_text()) if reviews_path.is_file() else {}
    notes_path = reviews_path.with_name(reviews_path.stem.replace("_reviews", "_review_notes") + ".json")
    notes = json.loads(notes_path.read_text()) if notes_path.is_file() else {}
    sources = {(t["source"], t["id"]): t["cand_src"] for t in tasks}
    review_dir = Path(args.review_dir) if args.review_dir else out_dir / "review"
    disagreements = []
    for r in records:
        kind, detail = classify(r)
        if kind == "agree":
            continue
        cand = sources.get((r["source"], r["id"]))
        path = write_review(review_dir, r, kind, detail, cand)
        key = f"{r['source']}/{r['id']}"
        disagreements.append(
            {"key": key, "level": r["level"], "problem": r["problem"], "class": kind, "detail": detail,
             "real cheat?": reviews.get(key, "") if kind == "guard" else "", "review": _shown(path),
             "note": notes.get(key, "")}
        )  # fmt: skip
    rows = agreement_rows(records, reviews)
    fired = [(r["source"], classify(r)[1].split(":")[0]) for r in records if classify(r)[0] == "guard"]
    guards = Counter(fired)
    summary_path = out_dir / f"{NAME}.json"
    old = json.loads(summary_path.read_text()) if summary_path.is_file() else {}
    runs = old.get("runs", []) + ([args.run_meta] if getattr(args, "run_meta", None) else [])
    summary = {
        "data_counts": counts or old.get("data_counts", {}),
        "speed_rule": f"measured speedup within [recorded / {SPEED_FACTOR:g}, recorded x {SPEED_FACTOR:g}]",
        "records": len(records),
        "agreement": rows,
        "guards": [{"source": s, "guard": g, "n": n} for (s, g), n in sorted(guards.items())],
        "disagreements": disagreements,
        "runs": runs,
    }
    summary_path.write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    (out_dir / f"{NAME}.md").write_text(markdown(summary), encoding="utf-8")
    print(f"report: {summary_path} and .md; {len(disagreements)} disagreements, reviews in {review_dir}")


def markdown(summary: dict[str, Any]) -> str:
    cols = ["group", "n", "correct", "rejected", "incorrect", "compile_error", "runtime_error", "timeout"]
    cols += ["compiled", "correct %", "correct or rejected %", "correct or confirmed cheat %", "speed agrees"]
    lines = [
        "# Validator agreement with the sources' judgements",
        "",
        "Every kernel below was judged correct by its source (KernelBench PR #67: 5/5 trials on an RTX",
        "A6000; CUDA-L1: correct with the recorded H100 eager speedup). Target: >= 97 % come out",
        "`correct`, or `rejected` by a guard a reviewer agrees with (column `real cheat?`, filled from the",
        "reviews file).",
        f"Speed rule: {summary['speed_rule']} (CUDA-L1 only; PR-67 records no speedup).",
        "",
        "Data (records each source holds, and the kernels taken from them):",
        "",
        *[
            f"- {src}: " + ", ".join(f"{k} {v}" for k, v in c.items())
            for src, c in summary["data_counts"].items()
        ],
        "",
        "## Agreement",
        "",
        *_table(summary["agreement"], cols),
        "",
        "## Guards fired",
        "",
        *_table(summary["guards"], ["source", "guard", "n"]),
        "",
        "## Disagreements",
        "",
        *_table(
            summary["disagreements"], ["key", "level", "problem", "class", "detail", "real cheat?", "note"]
        ),
        "",
        "## Runs",
        "",
    ]
    for run_meta in summary["runs"]:
        stats = run_meta.get("stats", {})
        lines.append(
            f"- {run_meta.get('started')}: `{run_meta.get('command')}` on {run_meta.get('device')}, "
            f"{run_meta.get('workers')} workers {run_meta.get('gpu_spread')}, {run_meta.get('seconds')} s: "
            f"{stats.get('finished')} verdicts, {stats.get('per_minute')}/min, builds "
            f"{stats.get('builds_built')} built / {stats.get('builds_cached')} cached, "
            f"{stats.get('dropped')} dropped"
        )
    return "\n".join(lines) + "\n"


# ------------------------------------------------------------------------------------------------ main
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", default=str(default_data()), help="shared data (default $DICE_SHARED_DATA)")
    p.add_argument("--pack", metavar="OUT.jsonl", help="write all tasks + data counts to OUT; exit")
    p.add_argument("--tasks", metavar="PACK.jsonl", help="run the tasks of a pack instead of reading --data")
    p.add_argument("--source", default="all", choices=("pr67", "cuda-l1", "all"))
    p.add_argument("--limit", type=int, default=0, help="at most N tasks this run (0: all)")
    p.add_argument("--shuffle-seed", type=int, default=0, help="task order (-1: data order)")
    p.add_argument("--workers", type=int, default=0, help="validator workers (0: the pool's default)")
    p.add_argument("--budget-s", type=float, default=0, help="stop taking tasks after S seconds (0: none)")
    p.add_argument("--grace-s", type=float, default=90, help="then wait S more seconds for those in flight")
    p.add_argument("--deadline-s", type=float, default=None, help="per-task deadline (default: none)")
    p.add_argument("--timeout", type=float, default=120, help="pool run-phase limit per task (s)")
    p.add_argument("--build-timeout", type=float, default=300, help="pool build-phase limit per task (s)")
    p.add_argument("--group-size", type=int, default=None, help="prebuild group size (default: workers)")
    p.add_argument("--no-prebuild", action="store_true", help="never call the pool's submit_prebuild")
    p.add_argument("--pr67-timing", action="store_true", help="also time the PR-67 kernels")
    p.add_argument("--strict", action="store_true", help="allclose at 1e-4 instead of 1e-2")
    p.add_argument("--out-dir", default=None, help="records and report (default benchmarks/results)")
    p.add_argument("--review-dir", default=None, help=f"disagreements (default build/{NAME}_review)")
    p.add_argument("--reviews", default=None, help='JSON {"source/id": "yes"|"no"|note} (real cheat?)')
    p.add_argument("--smoke-cpu", action="store_true", help="a few tasks on a pool without GPU, own out-dir")
    p.add_argument("--report-only", action="store_true", help="rebuild the report from the JSONL")
    args = p.parse_args(argv)
    if args.smoke_cpu:
        args.limit = args.limit or 6
        args.out_dir = args.out_dir or str(ROOT / "build" / f"{NAME}_smoke")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out_dir = Path(args.out_dir) if args.out_dir else ROOT / "benchmarks" / "results"
    if args.review_dir is None and not args.smoke_cpu:
        args.review_dir = str(ROOT / "build" / f"{NAME}_review")  # the candidates are third-party code
    if args.pack:
        tasks, counts = load_tasks(args)
        with Path(args.pack).open("w", encoding="utf-8") as f:
            f.write(json.dumps({"counts": counts}) + "\n")
            f.writelines(json.dumps(t) + "\n" for t in tasks)
        print(f"{len(tasks)} tasks in {args.pack}; counts: {json.dumps(counts)}")
        return 0
    tasks, counts = load_tasks(args) if (args.tasks or Path(args.data).is_dir()) else ([], {})
    out_dir.mkdir(parents=True, exist_ok=True)
    if not args.report_only:
        if not tasks:
            raise SystemExit("no tasks: pass --tasks PACK.jsonl or --data DIR")
        args.run_meta = run(args, tasks, out_dir / f"{NAME}.jsonl")
    report(args, out_dir, counts, tasks)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
