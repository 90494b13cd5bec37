"""NVRTC's automatic precompiled header in the validator's NVRTC child: seconds per file and verdict
agreement, with and without (``DICE_NVRTC_PCH=0``), on real CUDA files.

Each file goes through :func:`training.cuke.cu_tasks.nvrtc_compiles` (the ``.cu`` tasks' compile check and
the RL reward's first step: the extracted device code, the CUDA headers, the validator's NVRTC child), once
per mode in a fresh child, in the same order; the first compile of each mode is timed apart (it builds the
PCH). Two workloads:

* ``--corpus``: the first N corpus ``.cu`` files with a kernel, each once (what ``dice cuke build`` checks;
  most fail at a project header);
* ``--tasks cu_infill.jsonl``: a reward's work: for each of N tasks, ``--fills`` fills in a row (the
  original, a blank one, an undeclared name, ...), as a group of samples is scored.

Writes ``--results`` (JSON and Markdown).

    python benchmarks/nvrtc_pch.py --corpus ../shared/data/cuda-corpus --files 60 --results /tmp/pch
    python benchmarks/nvrtc_pch.py --tasks OUT/cu_infill.jsonl --files 30 --fills 4 --results /tmp/pch
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import platform
import statistics
import time
from pathlib import Path


def corpus_files(folder: Path, n: int) -> list[tuple[str, str]]:
    """The first ``n`` ``.cu`` files of the corpus (in file order) that hold a ``__global__`` function."""
    out = []
    with gzip.open(folder / "files.jsonl.gz", "rt", encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            if rec["path"].endswith(".cu") and "__global__" in rec["text"] and len(rec["text"]) < 60_000:
                out.append((f"{rec['repo']}:{rec['path']}", rec["text"]))
                if len(out) >= n:
                    break
    return out


MASK = "/* <MASK> */"
FILLS = ("{target}", "", "undeclared_name = 0;", "{target}\n{target}", "return;", "int unused_local = 1;")


def task_fills(path: Path, n: int, fills: int) -> list[tuple[str, str]]:
    """``fills`` programs for each of the first ``n`` tasks: the hole filled as a sampled group might be."""
    out = []
    with path.open(encoding="utf-8") as fh:
        for line in fh:
            rec = json.loads(line)
            for j, fill in enumerate(FILLS[:fills]):
                out.append(
                    (f"{rec['id']}#{j}", rec["text"].replace(MASK, fill.format(target=rec["target"]), 1))
                )
            if len(out) >= n * fills:
                break
    return out


def run_mode(files: list[tuple[str, str]], pch: bool) -> dict:
    from dice.validator.limits import NVRTC
    from training.cuke.cu_tasks import nvrtc_compiles

    os.environ["DICE_NVRTC_PCH"] = "1" if pch else "0"
    NVRTC.close()  # a fresh child, started with this mode
    seconds, verdicts = [], []
    for _name, text in files:
        t = time.perf_counter()
        verdicts.append(nvrtc_compiles(text))
        seconds.append(time.perf_counter() - t)
    NVRTC.close()
    rest = seconds[1:] or seconds
    return {
        "pch": pch,
        "first_s": round(seconds[0], 3),
        "mean_s": round(statistics.fmean(rest), 3),
        "median_s": round(statistics.median(rest), 3),
        "total_s": round(sum(seconds), 2),
        "compiled": sum(verdicts),
        "verdicts": verdicts,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--corpus", type=Path, help="cuda-corpus folder (files.jsonl.gz)")
    src.add_argument("--tasks", type=Path, help="a cu_infill.jsonl (dice cuke build)")
    ap.add_argument("--files", type=int, default=60, help="corpus files, or tasks")
    ap.add_argument("--fills", type=int, default=4, help="--tasks: programs per task (at most 6)")
    ap.add_argument("--results", type=Path, required=True)
    args = ap.parse_args(argv)
    if args.corpus is not None:
        files, what = corpus_files(args.corpus, args.files), "corpus `.cu` files, each once"
    else:
        files = task_fills(args.tasks, args.files, args.fills)
        what = f"programs: {args.files} `.cu` tasks x {args.fills} fills in a row (a reward's group)"
    off = run_mode(files, pch=False)
    on = run_mode(files, pch=True)
    agree = sum(a == b for a, b in zip(off["verdicts"], on["verdicts"], strict=True))
    report = {
        "machine": f"{platform.machine()}, {os.cpu_count()} cores",
        "date_utc": time.strftime("%Y-%m-%d %H:%M", time.gmtime()),
        "workload": what,
        "files": len(files),
        "agree": agree,
        "without_pch": {k: v for k, v in off.items() if k != "verdicts"},
        "with_pch": {k: v for k, v in on.items() if k != "verdicts"},
        "speedup_mean": round(off["mean_s"] / on["mean_s"], 2) if on["mean_s"] else None,
    }
    args.results.mkdir(parents=True, exist_ok=True)
    (args.results / "nvrtc_pch.json").write_text(json.dumps(report, indent=1) + "\n")
    rows = [
        "| mode | first file s | mean s / file (rest) | median s | total s | compiled |",
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, m in (("without PCH", off), ("with automatic PCH", on)):
        rows.append(
            f"| {name} | {m['first_s']} | {m['mean_s']} | {m['median_s']} | {m['total_s']} | "
            f"{m['compiled']}/{len(files)} |"
        )
    text = "\n".join(
        [
            f"# NVRTC automatic PCH ({report['machine']}, {report['date_utc']} UTC)",
            "",
            f"{len(files)} {what}; `nvrtc_compiles` each; verdicts agree on "
            f"{agree}/{len(files)}; mean speedup {report['speedup_mean']}x.",
            "",
            *rows,
        ]
    )
    (args.results / "nvrtc_pch.md").write_text(text + "\n")
    print(text)
    return 0 if agree == len(files) else 1


if __name__ == "__main__":
    raise SystemExit(main())
