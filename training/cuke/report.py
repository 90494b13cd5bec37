"""CuKe's report: the funnel (counts at every stage, per source), guards, speedups, levels, contamination
and task counts, as ``report.json``, ``report.png`` (matplotlib), a rich table on the console, and the
dataset card ``card.md`` (sources with licences and commits, thresholds, GPU, date, what was checked)."""

from __future__ import annotations

import json
import math
import platform
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

STAGES = (
    ("read", "records read"),
    ("pairs", "pairs with a candidate"),
    ("held_out", "held out (problem in the evaluation split)"),
    ("exact_duplicates", "exact duplicates dropped before validation"),
    ("validated", "validated"),
    ("pending", "not validated within the time budget (a rerun resumes)"),
    ("compiled", "compiled"),
    ("correct", "correct (full protocol, or its pilot rounds when timing stopped below the cut-off)"),
    ("fast", "correct and >= min speedup"),
    ("aug_validated", "augmentation validated (shape variants of kept pairs, teacher kernels)"),
    ("aug_pending", "augmentation not validated within the time budget"),
    ("aug_compiled", "augmentation compiled"),
    ("aug_correct", "augmentation correct"),
    ("aug_fast", "augmentation correct and >= min speedup"),
    ("near_duplicates", "near duplicates dropped (the faster kept)"),
    ("kept", "kept"),
)


@dataclass
class Report:
    settings: dict[str, Any]
    funnel: Counter[str] = field(default_factory=Counter)
    by_source: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    guards: Counter[str] = field(default_factory=Counter)
    statuses: Counter[str] = field(default_factory=Counter)
    speedups: list[float] = field(default_factory=list)
    levels: Counter[str] = field(default_factory=Counter)
    level_agreement: dict[str, int] = field(default_factory=dict)
    contamination: list[dict[str, Any]] = field(default_factory=list)
    augmentation: dict[str, Any] = field(default_factory=dict)
    tasks: dict[str, int] = field(default_factory=dict)
    cu_tasks: dict[str, Any] = field(default_factory=dict)
    projects: dict[str, dict[str, Any]] = field(default_factory=dict)  # CUDA corpus: repo -> licence, commit
    read_errors: list[str] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    validation: dict[str, Any] = field(default_factory=dict)  # per phase: the batch run's BatchStats
    sources: list[dict[str, Any]] = field(default_factory=list)

    def count(self, stage: str, source: str, n: int = 1) -> None:
        self.funnel[stage] += n
        self.by_source[source][stage] += n

    def to_json(self) -> dict[str, Any]:
        return {
            "settings": self.settings,
            "machine": machine(),
            "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
            "funnel": [{"stage": s, "what": w, "count": self.funnel.get(s, 0)} for s, w in STAGES],
            "by_source": {k: dict(v) for k, v in sorted(self.by_source.items())},
            "statuses": dict(self.statuses),
            "guards": dict(self.guards),
            "speedups": {
                "count": len(self.speedups),
                "histogram": speedup_histogram(self.speedups),
                "median": _median(self.speedups),
            },
            "levels": dict(sorted(self.levels.items())),
            "level_agreement": self.level_agreement,
            "contamination": self.contamination,
            "augmentation": self.augmentation,
            "tasks": self.tasks,
            "cu_tasks": self.cu_tasks,
            "projects": self.projects,
            "read_errors": self.read_errors[:50],
            "timings_s": {k: round(v, 2) for k, v in self.timings.items()},
            "validation": self.validation,
            "sources": self.sources,
        }


def machine() -> dict[str, Any]:
    out: dict[str, Any] = {"python": platform.python_version(), "host_cpu": platform.machine()}
    try:
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["gpus"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    except ImportError:  # pragma: no cover
        pass
    return out


def _median(xs: list[float]) -> float | None:
    if not xs:
        return None
    s = sorted(xs)
    return s[len(s) // 2]


BINS = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 8.0, math.inf)


def speedup_histogram(xs: list[float]) -> list[dict[str, Any]]:
    out = []
    for lo, hi in zip(BINS, BINS[1:], strict=False):
        out.append({"from": lo, "to": None if hi == math.inf else hi, "count": sum(lo <= x < hi for x in xs)})
    return out


def print_table(rep: Report, console: Any = None) -> None:
    from rich.console import Console
    from rich.table import Table

    console = console or Console()
    sources = sorted(rep.by_source)
    table = Table(title=f"CuKe funnel ({rep.settings.get('mode_words', '')})")
    table.add_column("stage")
    table.add_column("all", justify="right")
    for s in sources:
        table.add_column(s, justify="right")
    for stage, what in STAGES:
        table.add_row(
            what, str(rep.funnel.get(stage, 0)), *(str(rep.by_source[s].get(stage, 0)) for s in sources)
        )
    console.print(table)
    if rep.guards:
        console.print("rejected by guard: " + ", ".join(f"{g} {n}" for g, n in rep.guards.most_common()))
    if rep.tasks:
        console.print("task files: " + ", ".join(f"{k} {v}" for k, v in rep.tasks.items()))


def write_png(rep: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(12, 8))
    ax = axes[0][0]
    names = [w for _, w in STAGES][::-1]
    ax.barh(names, [rep.funnel.get(s, 0) for s, _ in STAGES][::-1], color="#4c72b0")
    ax.set_title("funnel (records at each stage)")
    ax.tick_params(axis="y", labelsize=7)
    ax = axes[0][1]
    hist = speedup_histogram(rep.speedups)
    ax.bar(
        [f"{h['from']:g}-{h['to'] if h['to'] is not None else '∞'}" for h in hist], [h["count"] for h in hist]
    )
    ax.set_title(
        f"speedup over eager PyTorch, correct candidates (n={len(rep.speedups)})\n"
        f"kept: >= {rep.settings.get('min_speedup')}x",
        fontsize=10,
    )
    if not rep.speedups:
        why = "compile-only build: nothing timed" if rep.settings.get("mode") == "compile" else "none correct"
        ax.text(0.5, 0.5, why, transform=ax.transAxes, ha="center", va="center")
        ax.set_yticks([])
    ax.tick_params(axis="x", labelsize=7)
    ax = axes[1][0]
    lv = sorted(rep.levels.items())
    ax.bar([k for k, _ in lv], [v for _, v in lv], color="#55a868")
    ax.set_title("kept pairs by level (static analysis of the reference)")
    ax = axes[1][1]
    tk = list(rep.tasks.items())
    ax.bar([k for k, _ in tk], [v for _, v in tk], color="#c44e52")
    ax.set_title("task records per file")
    ax.tick_params(axis="x", labelsize=7, rotation=20)
    fig.suptitle(f"CuKe build — {rep.settings.get('mode_words', '')}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_card(rep: Report, path: Path) -> None:
    """Long on purpose: the card's text in reading order, not logic."""
    d = rep.to_json()
    s = rep.settings
    lines = [
        "# CuKe build: dataset card",
        "",
        f"Built {d['date_utc']} UTC with `{s.get('command', 'dice cuke build')}`.",
        "",
        f"**What was checked: {s.get('mode_words')}.**",
        "",
        *(
            [
                f"**Partial build: {rep.funnel['pending']} candidates were not validated within the time "
                f"budget ({s.get('time_budget_s')} s)**; their kernels are in no task file. Running the same "
                "command again resumes from `cache/verdicts.jsonl` and validates only them.",
                "",
            ]
            if rep.funnel.get("pending")
            else []
        ),
        f"- minimum speedup over eager PyTorch: {s.get('min_speedup')} (timed live on this machine's GPU)"
        if s.get("mode") == "gpu"
        else "- no GPU: nothing was run or timed; kept pairs are *compiled only* (Python syntax, the static "
        "guards, the device code with NVRTC), never known correct or fast",
        f"- held-out fraction {s.get('holdout_fraction')}, seed {s.get('seed')}: "
        f"{s.get('heldout_problems', 0)} KernelBench problems held out (both versions), listed in "
        "`heldout_problems.jsonl`",
        f"- machine: {json.dumps(d['machine'])}",
        f"- limit per source: {s.get('limit')}; teacher: {s.get('teacher') or 'none'}; shape variants per "
        f"kept pair: at most {s.get('shape_variants')}",
        "",
        "## Sources",
        "",
        "| source | format | records | licence | commit(s) |",
        "| --- | --- | --- | --- | --- |",
    ]
    for src in rep.sources:
        lines.append(
            f"| {src['path']} | {src['format']} | {src.get('records', 0)} | {src.get('licence') or '-'} | "
            f"{', '.join(src.get('commits', [])[:3]) or '-'} |"
        )
    if rep.projects:
        lines += [
            "",
            "### CUDA corpus projects",
            "",
            "| project | licence | commit | files |",
            "| --- | --- | --- | --- |",
        ]
        lines += [
            f"| {repo} | {p.get('licence') or '-'} | {(p.get('commit') or '-')[:12]} | {p['files']} |"
            for repo, p in sorted(rep.projects.items())
        ]
    lines += ["", "## Funnel", "", "| stage | count |", "| --- | --- |"]
    lines += [f"| {f['what']} | {f['count']} |" for f in d["funnel"]]
    if rep.guards:
        lines += ["", "Rejected by guard: " + ", ".join(f"`{g}` {n}" for g, n in rep.guards.most_common())]
    for phase, st in rep.validation.items():
        lines.append(
            f"- validation ({phase}): {st.get('finished', 0)} verdicts in {st.get('elapsed_s', 0)} s "
            f"({st.get('per_minute', 0)}/min), {st.get('cached', 0)} from the cache; extensions built "
            f"{st.get('builds_built', 0)}, cached {st.get('builds_cached', 0)}"
            + (f"; GPU lock held {st['gpu_held_s']} s" if st.get("gpu_held_s") else "")
        )
        if st.get("timing_stopped_early"):
            lines.append(
                f"  - {st['timing_stopped_early']} correct candidates were timed on their pilot rounds only: "
                f"below the {rep.settings.get('timing_cutoff')}x cut-off, so never kept (the speedup shown "
                "for them is the pilot's)"
            )
    lines += ["", "## Levels of the kept pairs", ""]
    lines += [f"- level {k}: {v}" for k, v in d["levels"].items()] or ["- none"]
    if rep.contamination:
        lines += [
            "",
            "## Contamination against the evaluation problems",
            "",
            "| " + " | ".join(rep.contamination[0]) + " |",
            "|" + " --- |" * len(rep.contamination[0]),
        ]
        lines += ["| " + " | ".join(str(v) for v in row.values()) + " |" for row in rep.contamination]
    if rep.augmentation:
        lines += ["", "## Augmentation", "", "```json", json.dumps(rep.augmentation, indent=1), "```"]
    if rep.cu_tasks:
        c = rep.cu_tasks
        h = c.get("headers") or {}
        dropped = c.get("dropped_after_prune", 0)
        lines += [
            "",
            "## `.cu` infill tasks",
            "",
            f"{c.get('files')} files read, {c.get('with_holes')} with holes in device code, "
            f"{c.get('compiled')} of those compile under NVRTC (kept): "
            f"{c.get('compiled_standalone', c.get('compiled'))} standalone, "
            f"{c.get('compiled_with_headers', 0)} more with their project's headers from the corpus "
            f"({c.get('headers_tried', 0)} tried with headers"
            f"{f', {dropped} dropped when compiled again in the final tree' if dropped else ''}). "
            f"{c.get('tasks')} tasks ({', '.join(f'{k} {v}' for k, v in (c.get('by_kind') or {}).items())}). "
            f"Held out before cutting: projects {', '.join(c.get('held_out_repos') or []) or 'none'}, and "
            f"{c.get('held_out_files')} files of the others.",
        ]
        rc = c.get("reward_check") or {}
        if rc.get("files"):
            lines += [
                "",
                f"Reward check: each kept file's original was compiled as the RL reward compiles a fill (the "
                f"validator's `.cu` path: NVRTC, and nvcc on the whole file where nvcc is installed and the "
                f"file has host code), compile-only, in {rc.get('seconds')} s: of {rc['files']} files "
                f"{rc['files'] - rc.get('files_failed', 0)} compiled "
                f"({', '.join(f'{k} {v}' for k, v in (rc.get('statuses') or {}).items())}); the tasks of the "
                f"{rc.get('files_failed', 0)} others, {rc.get('holes_not_checked', 0)} tasks whose hole "
                "no compiler type-checked in the original (a branch the preprocessor left out) and "
                f"{rc.get('targets_not_reassembled', 0)} whose target the reward would not reassemble into "
                "the original were dropped: no fill there could earn a reward. The task counts above are "
                "after it.",
            ]
        if h:
            lines += [
                "",
                f"Headers (`cu_projects/`): {h.get('written', 0)} written for {h.get('staged_files', 0)} "
                f"files before compiling, {h.get('kept', 0)} kept ({h.get('kept_bytes', 0) / 1e6:.1f} MB) "
                "for the tasks that need them; such a task names its `folder` and `include_paths`.",
            ]
    lines += ["", "## Files", ""] + [f"- `{k}`: {v} records" for k, v in rep.tasks.items()]
    lines += [
        "",
        "Schemas and layout: `docs/CUKE.md`. Licences: each source's own (above); the corpus files "
        "keep their upstream notices.",
    ]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def write_all(rep: Report, out: Path, console: Any = None) -> None:
    (out / "report.json").write_text(json.dumps(rep.to_json(), indent=1, allow_nan=False) + "\n")
    write_png(rep, out / "report.png")
    write_card(rep, out / "card.md")
    print_table(rep, console)
