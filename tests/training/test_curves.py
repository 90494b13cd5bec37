"""Training curves: written, read back with their numbers, and joined over runs that continued each other."""

from __future__ import annotations

import json
from pathlib import Path

from training.curves import join_runs, read_curve, write_curves

Points = list[tuple[int, float]]


def _run(folder: Path, losses: Points, evals: Points, **files: dict) -> Path:
    folder.mkdir(parents=True)
    history = [{"step": s, "loss": v, "lr": 1e-3} for s, v in losses]
    evaluations = [{"step": s, "rows": 128, "eval_loss": v, "eval_masked_acc": 0.5} for s, v in evals]
    write_curves(folder, history, evaluations)
    for name, data in files.items():
        path = folder / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(data))
    return folder


def test_read_curve_gives_back_the_numbers(tmp_path: Path) -> None:
    run = _run(tmp_path / "r", [(1, 2.5), (20, 2.25)], [(0, 3.0)])
    rows = read_curve(run / "loss_curve.csv")
    assert rows == [{"step": 1, "loss": 2.5, "lr": 0.001}, {"step": 20, "loss": 2.25, "lr": 0.001}]
    assert isinstance(rows[0]["step"], int) and isinstance(rows[0]["loss"], float)
    (tmp_path / "t.csv").write_text("step,name\n3,abc\n")
    assert read_curve(tmp_path / "t.csv") == [{"step": 3, "name": "abc"}]


def test_join_runs_counts_steps_from_the_first_run(tmp_path: Path) -> None:
    first = _run(
        tmp_path / "model",  # a model folder: config and summary at the top
        [(1, 5.0), (20, 4.0)],
        [(0, 9.0), (20, 4.5)],
        **{"summary.json": {"steps": 25}, "sft_config.json": {"model": None, "init_config": "c.json"}},
    )
    second = _run(  # an SFT output folder: the config in final/, the summary at the top
        tmp_path / "sft-a",
        [(1, 3.0), (40, 2.0)],
        [(0, 3.5)],
        **{"summary.json": {"steps": 41}, "final__sft_config.json": {"model": "m", "init_config": None}},
    )
    # no summary (the last logged step counts) and no evaluation (no eval_curve.csv)
    third = _run(tmp_path / "sft-b", [(1, 1.5), (60, 1.0)], [])
    history, evals, stages = join_runs([first, second, third])
    assert [(h["run"], h["step"]) for h in history] == [
        ("model", 1),
        ("model", 20),
        ("sft-a", 26),
        ("sft-a", 65),
        ("sft-b", 67),
        ("sft-b", 126),
    ]
    assert [(e["run"], e["step"], e["eval_loss"]) for e in evals] == [
        ("model", 0, 9.0),
        ("model", 20, 4.5),
        ("sft-a", 25, 3.5),
    ]
    assert [(s["run"], s["first_step"]) for s in stages] == [("model", 0), ("sft-a", 25), ("sft-b", 66)]
    assert stages[0]["sft_config"]["init_config"] == "c.json" and stages[1]["sft_config"]["model"] == "m"
    assert stages[2]["sft_config"] is None and stages[2]["summary"] == {}
