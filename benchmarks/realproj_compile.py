"""Compile checks on real CUDA projects: does "compiled" hold, and what does a check cost?

    python benchmarks/realproj_compile.py [--data ../shared/data] [--lines 2] [--files N] [--results DIR]

``../shared/data/realproj`` (4 public projects, 50 translation units, 68 headers; see its SOURCE.md) is
copied to a temporary folder and its ``compile_commands.json`` written from the template. Every TU and header
is validated through the validator's pool, as the editor does (``folder=`` the file's folder), in two modes:

- ``nvcc``: the shipped validator (NVRTC's fast look, then the whole file with nvcc and the project's own
  command; headers borrow the command of a TU that includes them);
- ``nvrtc``: NVRTC alone (``DICE_NVCC=none``), what the validator did for device code before.

Per file: the unmodified file; then, at ``--lines`` sampled statement lines inside function bodies, the
original statement as a fill (same code, a ``/* fill */`` comment so no verdict is reused) and a garbage
statement (``int dice_garbage = ;``). Reported: compiled rates, garbage caught (``compile_error``) and with
its first error on the garbage line, garbage passed as compiled (a false ✓) and how many of those the
verdict's ``unchecked`` list covers (the editor then says "not checked"); time per check cold (first
compile of the file) and warm (the same text again: the on-disk cache of unchanged checks). Writes
realproj_compile.json and .md to --results (default benchmarks/results).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import queue
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from dice.cuda_source import parse_document  # noqa: E402
from dice.validator import ValidatorPool  # noqa: E402
from dice.validator.paths import nvcc_path, pip_cuda_include_dir  # noqa: E402

GARBAGE = "int dice_garbage = ;"


def copy_realproj(source: Path, dest: Path) -> Path:
    """The copy with ``compile_commands.json`` filled from the template (as tests/validator/conftest.py)."""
    shutil.copytree(source, dest)
    pip = pip_cuda_include_dir() or "/usr/local/cuda/include"
    entries = []
    for entry in json.loads((dest / "compile_commands.template.json").read_text()):
        args = [a.replace("{ROOT}", str(dest)).replace("{PIP_CUDA_INCLUDE}", pip) for a in entry["arguments"]]
        entries.append(
            {
                "directory": str(dest / entry["directory"]),
                "file": str(dest / entry["file"]),
                "arguments": args,
            }
        )
    (dest / "compile_commands.json").write_text(json.dumps(entries, indent=1))
    return dest


def statement_lines(text: str) -> list[int]:
    """0-based lines holding one whole statement in a function body (no preprocessor, no continuation)."""
    lines = text.splitlines()
    doc = parse_document(text)
    out: list[int] = []
    for f in doc.functions:
        first, last = (
            doc.index.line_of_byte(f.body_start_byte) + 1,
            doc.index.line_of_byte(f.body_end_byte) - 1,
        )
        for n in range(first, min(last, len(lines) - 1) + 1):
            s = lines[n].strip()
            if (
                s.endswith(";")
                and not s.startswith(("#", "//", "for", "}", "/*", "*"))
                and not lines[n - 1].rstrip().endswith(("\\", ",", "(", "&&", "||", "+", "?", ":"))
                and n not in out
            ):
                out.append(n)
    return sorted(out)


def replace_line(text: str, line: int, new: str) -> str:
    lines = text.splitlines(keepends=True)
    indent = lines[line][: len(lines[line]) - len(lines[line].lstrip())]
    lines[line] = indent + new + "\n"
    return "".join(lines)


def with_comment(text: str, line: int) -> str:
    lines = text.splitlines(keepends=True)
    lines[line] = lines[line].rstrip("\r\n") + " /* fill */\n"
    return "".join(lines)


def _jobs(root: Path, files: list[tuple[str, str]], n_lines: int) -> list[dict[str, Any]]:
    jobs = []
    for rel, kind in files:
        path = root / rel
        text = path.read_text(encoding="utf-8", errors="replace")
        jobs.append({"file": rel, "kind": kind, "check": "unmodified", "text": text, "line": None})
        jobs.append({"file": rel, "kind": kind, "check": "warm", "text": text, "line": None})
        candidates = statement_lines(text)
        rng = random.Random(rel)
        for line in sorted(rng.sample(candidates, min(n_lines, len(candidates)))):
            jobs.append(
                {
                    "file": rel,
                    "kind": kind,
                    "check": "original",
                    "text": with_comment(text, line),
                    "line": line,
                }
            )
            jobs.append(
                {
                    "file": rel,
                    "kind": kind,
                    "check": "garbage",
                    "text": replace_line(text, line, GARBAGE),
                    "line": line,
                }
            )
    return jobs


def _run_mode(root: Path, jobs: list[dict[str, Any]], mode: str, workers: int) -> list[dict[str, Any]]:
    """Validate every job, ``workers`` at a time (one thread per worker, so a call's time is its task's)."""
    env_before = {k: os.environ.get(k) for k in ("DICE_NVCC", "DICE_CACHE_DIR")}
    cache = tempfile.mkdtemp(prefix=f"realproj-cache-{mode}-")
    os.environ["DICE_CACHE_DIR"] = cache
    if mode == "nvrtc":
        os.environ["DICE_NVCC"] = "none"
    records: list[dict[str, Any]] = []
    # a file's "warm" check waits for its "unmodified" one: both go to the same thread, in order
    by_file: dict[str, list[dict[str, Any]]] = {}
    for job in jobs:
        by_file.setdefault(job["file"], []).append(job)
    work: queue.Queue[list[dict[str, Any]]] = queue.Queue()
    for group in by_file.values():
        work.put(group)
    lock = threading.Lock()
    try:
        with ValidatorPool(
            workers, gpu=False, timeout_s=60, build_timeout_s=600, cache_verdicts=False
        ) as pool:

            def loop() -> None:
                while True:
                    try:
                        group = work.get_nowait()
                    except queue.Empty:
                        return
                    for job in group:
                        path = root / job["file"]
                        start = time.perf_counter()
                        v = pool.validate_cu(job["text"], run=False, filename=path.name, folder=path.parent)
                        record = _record(job, v, time.perf_counter() - start, mode)
                        with lock:
                            records.append(record)
                            print(f"[{mode}] {len(records)}/{len(jobs)} {job['file']} {job['check']} "
                                  f"{record['status']} {record['seconds']:.1f}s", flush=True)  # fmt: skip

            threads = [threading.Thread(target=loop) for _ in range(workers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    finally:
        for key, value in env_before.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        shutil.rmtree(cache, ignore_errors=True)
    return records


def _record(job: dict[str, Any], v: Any, seconds: float, mode: str) -> dict[str, Any]:
    errors = [d for d in v.diagnostics if d.get("severity") == "error"]
    line = job["line"]
    in_unchecked = line is not None and any(u["line"] <= line <= u["end_line"] for u in v.unchecked)
    return {
        "mode": mode,
        "file": job["file"],
        "kind": job["kind"],
        "check": job["check"],
        "line": line,
        "status": v.status,
        "seconds": round(seconds, 3),
        "cached": "cached, " in (v.message.splitlines() or [""])[0],
        "first_error_line": errors[0]["line"] if errors else None,
        "right_line": bool(errors) and errors[0]["line"] == line,
        "in_unchecked": in_unchecked,
        "message": v.message.splitlines()[0][:300] if v.message else "",
        "borrowed": "borrowed from" in v.message,
    }


def rate(records: list[dict[str, Any]], ok: Any) -> dict[str, Any]:
    hits = sum(1 for r in records if ok(r))
    return {"n": len(records), "hits": hits, "rate": round(hits / len(records), 3) if records else None}


def time_summary(values: list[float]) -> dict[str, Any]:
    if not values:
        return {"n": 0}
    values = sorted(values)
    return {
        "n": len(values),
        "median_s": round(statistics.median(values), 2),
        "p90_s": round(values[min(len(values) - 1, int(0.9 * len(values)))], 2),
        "mean_s": round(statistics.fmean(values), 2),
    }


def summarise(records: list[dict[str, Any]], mode: str) -> dict[str, Any]:
    rs = [r for r in records if r["mode"] == mode]
    pick = lambda kind, check: [r for r in rs if r["check"] == check and (kind is None or r["kind"] == kind)]  # noqa: E731
    garbage = pick(None, "garbage")
    false_ok = [r for r in garbage if r["status"] == "compiled"]
    return {
        "unmodified_tus_compiled": rate(pick("tu", "unmodified"), lambda r: r["status"] == "compiled"),
        "unmodified_headers_compiled": rate(
            pick("header", "unmodified"), lambda r: r["status"] == "compiled"
        ),
        "headers_with_borrowed_command": rate(pick("header", "unmodified"), lambda r: r["borrowed"]),
        "original_statement_compiled": rate(pick(None, "original"), lambda r: r["status"] == "compiled"),
        "garbage_caught": rate(garbage, lambda r: r["status"] == "compile_error"),
        "garbage_error_on_its_line": rate(garbage, lambda r: r["right_line"]),
        "garbage_passed_as_compiled": rate(garbage, lambda r: r["status"] == "compiled"),
        "false_ok_marked_unchecked": rate(false_ok, lambda r: r["in_unchecked"]),
        "time_cold": time_summary([r["seconds"] for r in rs if r["check"] == "unmodified"]),
        "time_fill": time_summary([r["seconds"] for r in rs if r["check"] in ("original", "garbage")]),
        "time_warm": time_summary([r["seconds"] for r in rs if r["check"] == "warm"]),
        "warm_cache_hits": rate(pick(None, "warm"), lambda r: r["cached"]),
    }


def compare_flags(root: Path, tus: list[str], repeats: int = 2) -> list[dict[str, Any]]:
    """Seconds of the project's own command (``-c FILE -o /dev/null``) and of the validator's check
    command (:func:`dice.validator.whole_file.nvcc_check_file`, no cache) on the same TUs, best of
    ``repeats``, one at a time."""
    from dice.validator.build_flags import resolve_build_flags
    from dice.validator.whole_file import nvcc_check_file

    entries = {e["file"]: e for e in json.loads((root / "compile_commands.json").read_text())}
    rows = []
    for rel in tus:
        entry = entries[str(root / rel)]
        argv = [nvcc_path() or "nvcc", *entry["arguments"][1:]]
        own, check = [], []
        for _ in range(repeats):
            start = time.perf_counter()
            subprocess.run(argv, cwd=entry["directory"], capture_output=True, check=False)
            own.append(time.perf_counter() - start)
            flags = resolve_build_flags(root / rel)
            with tempfile.TemporaryDirectory() as work:
                result = nvcc_check_file(
                    (root / rel).read_text(encoding="utf-8", errors="replace"),
                    flags=flags,
                    arch=flags.arch_for(None),
                    workdir=Path(work),
                    user_path=str(root / rel),
                    display_name=Path(rel).name,
                )
            check.append(result.seconds if result is not None and result.ok else float("nan"))
        rows.append({"file": rel, "project_command_s": round(min(own), 2), "check_s": round(min(check), 2)})
        print(f"[flags] {rel}: project {min(own):.1f} s, check {min(check):.1f} s", flush=True)
    return rows


def _fmt(cell: dict[str, Any]) -> str:
    if "hits" in cell:
        return f"{cell['hits']}/{cell['n']}" + (f" ({100 * cell['rate']:.0f}%)" if cell["n"] else "")
    if not cell.get("n"):
        return "-"
    return f"median {cell['median_s']} s, p90 {cell['p90_s']} s (n={cell['n']})"


ROWS = [
    ("unmodified TUs `compiled`", "unmodified_tus_compiled"),
    ("unmodified headers `compiled`", "unmodified_headers_compiled"),
    ("headers checked with a borrowed command", "headers_with_borrowed_command"),
    ("original statement at a sampled line `compiled`", "original_statement_compiled"),
    ("garbage statement caught (`compile_error`)", "garbage_caught"),
    ("garbage: first error on the garbage line", "garbage_error_on_its_line"),
    ("garbage passed as `compiled` (false ✓)", "garbage_passed_as_compiled"),
    ("of those, in the verdict's `unchecked` list", "false_ok_marked_unchecked"),
    ("time, first check of a file (cold)", "time_cold"),
    ("time, check of a fill", "time_fill"),
    ("time, unchanged re-check (warm)", "time_warm"),
    ("unchanged re-check answered from the cache", "warm_cache_hits"),
]


def write_results(
    out: Path, meta: dict[str, Any], summary: dict[str, Any], records: list[dict[str, Any]]
) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "realproj_compile.json").write_text(
        json.dumps({**meta, "summary": summary, "records": records}, indent=1)
    )
    lines = [
        "# Compile checks on real CUDA projects (realproj)",
        "",
        f"- machine: {meta['machine']}",
        f"- command: `{meta['command']}`",
        f"- date: {meta['date']}; wall time {meta['wall_s']:.0f} s",
        f"- data: {meta['files']['tus']} TUs and {meta['files']['headers']} headers of "
        f"`../shared/data/realproj`, {meta['lines']} sampled statement line(s) per file; "
        f"{meta['workers']} validator workers",
        f"- toolchain: {meta['nvcc']}",
        "",
        "| | nvcc, project command (shipped) | NVRTC only (before) |",
        "| --- | --- | --- |",
    ]
    for label, key in ROWS:
        lines.append(f"| {label} | {_fmt(summary['nvcc'][key])} | {_fmt(summary['nvrtc'][key])} |")
    failures = [r for r in records if r["mode"] == "nvcc" and _unexpected(r)]
    lines += ["", "## nvcc mode: checks that did not give the expected verdict", ""]
    lines += [
        "A garbage statement that passes lies in code no compiler saw (a false `#if` branch) or only parsed",
        "(a template nothing instantiates); the verdict's `unchecked` list names that code, so the editor",
        "labels such a fill `not checked (...)` instead of `compiled ✓`.",
        "",
    ]
    lines += [
        f"- `{r['file']}` {r['check']} at line {r['line']} (0-based): `{r['status']}`"
        f"{', in the unchecked list' if r['in_unchecked'] else ''}: {r['message'][:160]}"
        for r in failures
    ] or ["none"]
    if meta.get("flag_comparison"):
        lines += [
            "",
            "## The check's nvcc flags against the project's own command",
            "",
            "Best of 2, one compile at a time. The check compiles one real architecture with every",
            "optimiser off (`-O0 -Xcicc -O0 -Xptxas -O0`), no fatbinary compression and `-fsyntax-only` for",
            "the host pass; ptxas still runs (inline PTX is checked).",
            "",
            "| TU | project command | check | saved |",
            "| --- | ---: | ---: | ---: |",
        ]
        for row in meta["flag_comparison"]:
            saved = 1 - row["check_s"] / row["project_command_s"] if row["project_command_s"] else 0
            own, check = row["project_command_s"], row["check_s"]
            lines.append(f"| `{row['file']}` | {own} s | {check} s | {100 * saved:.0f}% |")
    lines += ["", "Per-check records (both modes) are in realproj_compile.json."]
    (out / "realproj_compile.md").write_text("\n".join(lines) + "\n")


def _unexpected(r: dict[str, Any]) -> bool:
    if r["check"] in ("unmodified", "warm", "original"):
        return r["status"] != "compiled"
    return not r["right_line"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data")
    ap.add_argument("--lines", type=int, default=2, help="sampled statement lines per file")
    ap.add_argument("--files", type=int, default=0, help="at most this many files (0: all), spread evenly")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--modes", default="nvcc,nvrtc")
    ap.add_argument("--compare-flags", type=int, default=6, help="TUs timed with the project's own command")
    ap.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results")
    args = ap.parse_args(argv)
    source = args.data / "realproj"
    if not (source / "compile_commands.template.json").is_file():
        print(f"{source} is absent", file=sys.stderr)
        return 2
    started = time.time()
    tmp = Path(tempfile.mkdtemp(prefix="realproj-bench-"))
    try:
        root = copy_realproj(source, tmp / "realproj")
        tus = [(e["file"], "tu") for e in json.loads((root / "compile_commands.template.json").read_text())]
        headers = [(h, "header") for h in sorted(json.loads((root / "headers.json").read_text()))]
        files = tus + headers
        if args.files:
            step = max(1, len(files) // args.files)
            files = files[::step][: args.files]
        jobs = _jobs(root, files, args.lines)
        records: list[dict[str, Any]] = []
        for mode in args.modes.split(","):
            records += _run_mode(root, jobs, mode, args.workers)
        all_tus = [rel for rel, _ in tus]
        step = max(1, len(all_tus) // max(1, args.compare_flags))
        comparison = compare_flags(root, all_tus[::step][: args.compare_flags]) if args.compare_flags else []
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    nvcc = nvcc_path()
    version = (
        subprocess.run([nvcc, "--version"], capture_output=True, text=True).stdout.strip().splitlines()[-2:]
        if nvcc
        else []
    )
    meta = {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores, no GPU",
        "command": "python benchmarks/realproj_compile.py "
        + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        "wall_s": time.time() - started,
        "files": {
            "tus": sum(1 for _, k in files if k == "tu"),
            "headers": sum(1 for _, k in files if k == "header"),
        },
        "lines": args.lines,
        "workers": args.workers,
        "nvcc": " ".join(version) or "none",
        "flag_comparison": comparison,
    }
    summary = {mode: summarise(records, mode) for mode in ("nvcc", "nvrtc")}
    write_results(args.results, meta, summary, records)
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
