"""One set of SFT curves from runs that continued each other (``SFT_FROM``): each run's steps follow the last
run's, a ``run`` column names the run. ``--out PREFIX`` writes ``PREFIX_loss_curve.csv``,
``PREFIX_eval_curve.csv`` and ``PREFIX_curves.png``; ``--out DIR/`` writes ``loss_curve.csv``,
``eval_curve.csv`` and ``loss_curve.png`` into DIR (a model folder's names). ``--stages-out FILE``: the chain
as JSON, each run's resolved ``sft_config.json`` and ``summary.json`` (what a model card's lineage needs).

    python benchmarks/join_sft_curves.py --runs runs/x/sft-a runs/x/sft-b --out benchmarks/results/x_sft
"""

from __future__ import annotations

import argparse
import csv
import json
import shutil
import tempfile
from pathlib import Path

from training.curves import write_curves


def read_csv(path: Path) -> list[dict]:
    with open(path, newline="") as fh:
        return [{k: _number(v) for k, v in row.items()} for row in csv.DictReader(fh)]


def _number(value: str) -> float | int | str:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _json(run: Path, name: str) -> dict | None:
    """``name`` in the run folder or in its ``final/`` export (a model folder has it at the top)."""
    for path in (run / name, run / "final" / name):
        if path.is_file():
            return json.loads(path.read_text())
    return None


def join(runs: list[Path]) -> tuple[list[dict], list[dict], list[dict]]:
    """(loss history, evaluations, stages) of the chain, steps counted from the first run's start."""
    history: list[dict] = []
    evals: list[dict] = []
    stages: list[dict] = []
    offset = 0
    for run in runs:
        loss = read_csv(run / "loss_curve.csv")
        history += [{"run": run.name, **h, "step": h["step"] + offset} for h in loss]
        rows = read_csv(run / "eval_curve.csv")
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, nargs="+", required=True, help="SFT output folders, in order")
    ap.add_argument("--out", required=True, help="path prefix of the three files, or a folder ending in /")
    ap.add_argument("--stages-out", type=Path, help="JSON file for the chain's configurations and summaries")
    args = ap.parse_args()
    history, evals, stages = join(args.runs)
    if args.out.endswith("/"):
        names = {n: Path(args.out) / n for n in ("loss_curve.csv", "eval_curve.csv", "loss_curve.png")}
    else:
        names = {
            "loss_curve.csv": Path(f"{args.out}_loss_curve.csv"),
            "eval_curve.csv": Path(f"{args.out}_eval_curve.csv"),
            "loss_curve.png": Path(f"{args.out}_curves.png"),
        }
    with tempfile.TemporaryDirectory() as tmp:
        write_curves(Path(tmp), history, evals)
        for name, dest in names.items():
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(Path(tmp) / name, dest)
    if args.stages_out:
        args.stages_out.write_text(json.dumps(stages, indent=2) + "\n")
    print(f"{len(history)} loss points, {len(evals)} evaluations, {len(stages)} runs -> {args.out}")


if __name__ == "__main__":
    main()
