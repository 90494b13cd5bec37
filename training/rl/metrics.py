"""What ``dice train rl`` records: ``metrics.csv`` (one row per step), ``eval.csv``, ``curves.png`` and the
rich live view (progress bar + the last step's numbers).

Columns of ``metrics.csv`` (see docs/RL.md for what each means): :data:`COLUMNS`, then any extra column a
step produced (the eval columns appear on the steps that ran an evaluation).
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

COLUMNS = (
    "step",
    "phase",
    "levels",
    "tasks",
    "samples",
    "reward_mean",
    "reward_std",
    "pass_rate",
    "compile_rate",
    "exact_rate",
    "kept_groups",
    "dropped_groups",
    "skipped",
    "loss",
    "kl",
    "clip_frac",
    "grad_norm",
    "response_len",
    "finished_frac",
    "tokens_per_step",
    "trained_tokens",
    "lr",
    "rollout_s",
    "reward_s",
    "update_s",
    "step_s",
    "eval_compile_rate",
    "eval_correct_rate",
    "eval_exact_rate",
    "eval_reward_mean",
)
# Columns that measure time: everything else is a function of the config and the seed (the resume test).
TIMING_COLUMNS = frozenset({"rollout_s", "reward_s", "update_s", "step_s", "eval_s"})
EVAL_COLUMNS = (
    "step",
    "tasks",
    "eval_compile_rate",
    "eval_correct_rate",
    "eval_exact_rate",
    "eval_reward_mean",
    "eval_s",
)


# A verdict of these statuses compiled (the compile rates); the samples that pass make the pass rate.
COMPILED_STATUSES = frozenset({"compiled", "correct", "incorrect"})


def compiled(scored: Any) -> bool:
    """Whether a sample's program compiled (a toy reward's hit counts as one)."""
    return scored.status in COMPILED_STATUSES or (scored.status == "toy" and scored.passed)


def step_sums(scores: list, stats: Any, groups: Any, update: dict) -> list[float]:
    """One process's sums for a step's row (all-reduced, then :func:`step_row`): ``scores`` its
    ``Scored`` groups, ``stats`` its ``RolloutStats``, ``groups`` its ``GroupStats``, ``update`` the
    update's result."""
    flat = [sc for g in scores for sc in g]
    return [
        len(flat),
        sum(sc.reward for sc in flat),
        sum(sc.reward**2 for sc in flat),
        sum(sc.passed for sc in flat),
        sum(compiled(sc) for sc in flat),
        sum(sc.exact for sc in flat),
        groups.kept,
        groups.dropped,
        stats.tokens,
        stats.steps,
        stats.finished_rate * stats.samples,
        update["loss"],
        update["kl_sum"],
        update["clip_sum"],
        update["tokens"],
    ]


def step_row(head: dict, totals: list[float], update: dict, mini_batches: int, tail: dict) -> dict:
    """A ``metrics.csv`` row from the all-reduced :func:`step_sums` (``head`` first, ``tail`` last)."""
    n, rsum, rsq, npass, ncomp, nexact, kept, dropped, tok, steps, fin, loss, kl, clip, trained = totals
    mean, skipped, per = rsum / max(n, 1), bool(update["skipped"]), max(n, 1)
    return {
        **head,
        "samples": int(n),
        "reward_mean": round(mean, 6),
        "reward_std": round(math.sqrt(max(0.0, rsq / per - mean**2)), 6),
        "pass_rate": round(npass / per, 6),
        "compile_rate": round(ncomp / per, 6),
        "exact_rate": round(nexact / per, 6),
        "kept_groups": int(kept),
        "dropped_groups": int(dropped),
        "skipped": int(skipped),
        "loss": "" if skipped else round(loss / mini_batches, 8),
        "kl": "" if skipped else round(kl / max(trained, 1), 8),
        "clip_frac": "" if skipped else round(clip / max(trained, 1), 6),
        "grad_norm": "" if update["grad_norm"] is None else round(update["grad_norm"], 6),
        "response_len": round(tok / per, 3),
        "finished_frac": round(fin / per, 4),
        "tokens_per_step": round(tok / max(steps, 1), 4),
        "trained_tokens": int(trained),
        **tail,
    }


def _fieldnames(rows: list[dict], preferred: tuple[str, ...]) -> list[str]:
    seen = {k for r in rows for k in r}
    names = [c for c in preferred if c in seen]
    for r in rows:
        names += [k for k in r if k not in names]
    return names


def write_csv(path: Path, rows: list[dict], preferred: tuple[str, ...] = COLUMNS) -> None:
    """``rows`` as CSV (columns: ``preferred`` first, missing values empty)."""
    with open(path, "w", newline="") as fh:
        w = csv.DictWriter(fh, fieldnames=_fieldnames(rows, preferred), restval="")
        w.writeheader()
        w.writerows(rows)


def read_csv(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


def _series(rows: list[dict], key: str) -> tuple[list[float], list[float]]:
    pts = [(float(r["step"]), float(r[key])) for r in rows if r.get(key) not in (None, "")]
    return [p[0] for p in pts], [p[1] for p in pts]


def write_curves(out: Path, history: list[dict], eval_history: list[dict], *, png: bool = True) -> None:
    """``metrics.csv``, ``eval.csv`` (when evaluations ran) and, with ``png``, ``curves.png`` (six
    panels: matplotlib takes a few tenths of a second, so the loop draws it every few steps)."""
    if history:
        write_csv(out / "metrics.csv", history)
    if eval_history:
        write_csv(out / "eval.csv", eval_history, EVAL_COLUMNS)
    if not history or not png:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 3, figsize=(14, 7))
    panels = [
        (axes[0, 0], ("reward_mean", "pass_rate"), "reward / pass rate"),
        (axes[0, 1], ("dropped_groups", "kept_groups"), "groups (dropped: all rewards equal)"),
        (axes[0, 2], ("kl", "clip_frac"), "KL (k3) / clipped fraction"),
        (axes[1, 0], ("response_len",), "response length (tokens)"),
        (axes[1, 1], ("tokens_per_step",), "rollout tokens per denoising step"),
    ]
    for ax, keys, title in panels:
        for key in keys:
            xs, ys = _series(history, key)
            if xs:
                ax.plot(xs, ys, label=key, lw=1.0, marker="." if len(xs) < 40 else None)
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("step")
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
    ax = axes[1, 2]
    steps = [float(r["step"]) for r in history]
    bottom = [0.0] * len(history)
    for key in ("rollout_s", "reward_s", "update_s"):
        vals = [float(r.get(key) or 0.0) for r in history]
        ax.bar(steps, vals, bottom=bottom, label=key, width=0.8)
        bottom = [b + v for b, v in zip(bottom, vals, strict=True)]
    evals = (("eval_compile_rate", "o--"), ("eval_correct_rate", "*--"), ("eval_exact_rate", "x--"))
    for key, style in evals:
        xs, ys = _series(eval_history, key)
        if xs:
            axes[0, 0].plot(xs, ys, style, label=f"held-out {key[5:]}", ms=6)
    if eval_history and axes[0, 0].get_legend_handles_labels()[0]:
        axes[0, 0].legend(fontsize=8)
    ax.set_title("step time split (s)", fontsize=10)
    ax.set_xlabel("step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "curves.png", dpi=100)
    plt.close(fig)


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


LIVE_KEYS = (
    "reward_mean",
    "pass_rate",
    "dropped_groups",
    "kl",
    "clip_frac",
    "response_len",
    "tokens_per_step",
    "rollout_s",
    "reward_s",
    "update_s",
)


class LiveView:
    """The rich live view: a progress bar over the steps and a table of the last step's metrics."""

    def __init__(self, total: int, completed: int, *, phase: str, enabled: bool) -> None:
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        self.enabled = enabled
        self.progress = Progress(
            TextColumn(f"[bold]rl {phase}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
        )
        self.task = self.progress.add_task("rl", total=total, completed=completed, info="")
        self.last: dict = {}
        self.live = None

    def _render(self):
        from rich.console import Group
        from rich.table import Table

        table = Table(show_header=True, header_style="bold", box=None, pad_edge=False)
        keys = [k for k in LIVE_KEYS if k in self.last]
        for k in ["step", *keys]:
            table.add_column(k, justify="right")
        if self.last:
            table.add_row(*(_fmt(self.last.get(k, "")) for k in ["step", *keys]))
        return Group(self.progress, table)

    def __enter__(self) -> LiveView:
        if self.enabled:
            from rich.live import Live

            self.live = Live(self._render(), refresh_per_second=4, transient=False)
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.update(self._render())
            self.live.__exit__(*exc)

    def update(self, row: dict) -> None:
        self.last = row
        info = f"reward {_fmt(row.get('reward_mean', ''))} pass {_fmt(row.get('pass_rate', ''))}"
        if row.get("skipped"):
            info += " [yellow]skipped[/]"
        self.progress.update(self.task, completed=int(row["step"]), info=info)
        if self.live is not None:
            self.live.update(self._render())
