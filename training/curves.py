"""Training curves: ``loss_curve.csv``, ``eval_curve.csv`` and one PNG with both; read back, and joined over
SFT runs that continued each other."""

from __future__ import annotations

import csv
import json
from pathlib import Path


def read_curve(path: Path) -> list[dict]:
    """The rows of a curve CSV (``loss_curve.csv``, ``eval_curve.csv``, RL's ``metrics.csv``), each value an
    int or a float where it reads as one, else the text."""
    with open(path, newline="") as fh:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _number(value: str) -> int | float | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def write_curves(out: Path, history: list[dict], eval_history: list[dict]) -> None:
    """loss_curve.csv / eval_curve.csv and one PNG with both."""
    if history:
        with open(out / "loss_curve.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(history[0]))
            w.writeheader()
            w.writerows(history)
    if eval_history:
        with open(out / "eval_curve.csv", "w", newline="") as fh:
            w = csv.DictWriter(fh, fieldnames=list(eval_history[0]))
            w.writeheader()
            w.writerows(eval_history)
    if not history:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.8))
    ax[0].plot([h["step"] for h in history], [h["loss"] for h in history], label="train (batch)", lw=0.8)
    for i, n in enumerate(sorted({int(h.get("rows", 0)) for h in eval_history})):
        pts = [h for h in eval_history if int(h.get("rows", 0)) == n]
        style = dict(marker="o" if i == 0 else "*", ms=6 if i == 0 else 12, color=f"C{i + 1}")
        label = f"held-out, {n} rows"
        ax[0].plot([h["step"] for h in pts], [h["eval_loss"] for h in pts], label=label, **style)
        ax[1].plot([h["step"] for h in pts], [h["eval_masked_acc"] for h in pts], label=label, **style)
    ax[0].set_xlabel("step")
    ax[0].set_ylabel("loss (1/t-weighted CE / answer token)")
    ax[0].set_yscale("log")
    ax[0].legend()
    ax[1].set_xlabel("step")
    ax[1].set_ylabel("held-out masked-token accuracy")
    if eval_history:
        ax[1].legend()
    fig.tight_layout()
    fig.savefig(out / "loss_curve.png", dpi=110)
    plt.close(fig)


def _json(run: Path, name: str) -> dict | None:
    """``name`` in the run folder or in its ``final/`` export (a model folder has it at the top)."""
    for path in (run / name, run / "final" / name):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def join_runs(runs: list[Path]) -> tuple[list[dict], list[dict], list[dict]]:
    """SFT runs that continued each other (``SFT_FROM``), as one run: (loss history, evaluations, stages),
    each run's steps following the last run's, a ``run`` field naming the run; a stage is the run's name,
    first step, resolved ``sft_config.json`` and ``summary.json``."""
    history: list[dict] = []
    evals: list[dict] = []
    stages: list[dict] = []
    offset = 0
    for run in runs:
        loss = read_curve(run / "loss_curve.csv")
        history += [{"run": run.name, **h, "step": h["step"] + offset} for h in loss]
        rows = read_curve(run / "eval_curve.csv") if (run / "eval_curve.csv").is_file() else []
        evals += [{"run": run.name, **e, "step": e["step"] + offset} for e in rows]
        summary = _json(run, "summary.json") or {}
        stages.append(
            {
                "run": run.name,
                "first_step": offset,
                "sft_config": _json(run, "sft_config.json"),
                "summary": summary,
            }
        )
        offset += int(summary.get("steps") or max(h["step"] for h in loss))  # the log keeps every Nth step
    return history, evals, stages
