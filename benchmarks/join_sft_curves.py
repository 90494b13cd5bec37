"""One set of SFT curves from runs that continued each other (``SFT_FROM``): each run's steps follow the last
run's, a ``run`` column names the run. ``--out PREFIX`` writes ``PREFIX_loss_curve.csv``,
``PREFIX_eval_curve.csv`` and ``PREFIX_curves.png``; ``--out DIR/`` writes ``loss_curve.csv``,
``eval_curve.csv`` and ``loss_curve.png`` into DIR (a model folder's names). ``--stages-out FILE``: the chain
as JSON, each run's resolved ``sft_config.json`` and ``summary.json`` (what a model card's lineage needs).

    python benchmarks/join_sft_curves.py --runs runs/x/sft-a runs/x/sft-b --out benchmarks/results/x_sft
"""

from __future__ import annotations

import argparse
import json
import shutil
import tempfile
from pathlib import Path

from training.curves import join_runs, write_curves


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=Path, nargs="+", required=True, help="SFT output folders, in order")
    ap.add_argument("--out", required=True, help="path prefix of the three files, or a folder ending in /")
    ap.add_argument("--stages-out", type=Path, help="JSON file for the chain's configurations and summaries")
    args = ap.parse_args()
    history, evals, stages = join_runs(args.runs)
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
