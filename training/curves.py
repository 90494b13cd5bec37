"""Training curves: ``loss_curve.csv``, ``eval_curve.csv`` and one PNG with both."""

from __future__ import annotations

import csv
from pathlib import Path


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
