"""dice train sft on CPU with the tiny checkpoint: exact loss, learning, export, resume, several processes."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from training.config import SFTConfig
from training.corpus import Example
from training.masks import build_block_mask, dense_mask
from training.objective import BlockDiffusionLM, noise_rows
from training.sft import main

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from engine.testing import make_tiny_checkpoint

    return make_tiny_checkpoint(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def examples(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Sixteen short chat examples with a learnable pattern (the answer repeats the prompt's statement)."""
    path = tmp_path_factory.mktemp("data") / "train.jsonl"
    stmts = [
        "out[idx] = a[idx] + b[idx];",
        "y[i] = v > 0.0f ? v : 0.0f;",
        "sum += e;",
        "int row = blockIdx.x;",
    ]
    with open(path, "w") as fh:
        for i in range(16):
            s = stmts[i % 4]
            prompt = f"<|im_start|>user\nrepeat: {s}<|im_end|>\n<|im_start|>assistant\n"
            fh.write(
                Example(f"e{i}", f"L1P{i % 4}", "cu_infill", "test", prompt, s * (1 + i % 2)).to_json() + "\n"
            )
    return path


def run(tiny: Path, examples: Path, out: Path, **kw) -> dict:
    cfg = dict(
        data=str(examples),
        out=str(out),
        model=str(tiny),
        seq_len=64,
        micro_batch_size=2,
        lr=3e-3,
        max_steps=4,
        log_every=1,
        save_dtype="float32",
    )
    cfg.update(kw)
    return main(SFTConfig(**cfg))


def curve(out: Path, name: str = "loss_curve.csv") -> list[dict]:
    lines = (out / name).read_text().splitlines()
    keys = lines[0].split(",")
    return [dict(zip(keys, line.split(","), strict=True)) for line in lines[1:]]


def test_loss_matches_a_hand_computation_through_the_engine_forward(tiny: Path) -> None:
    from engine.checkpoint import load_model

    model = load_model(tiny, dtype=torch.float32)
    t = 16
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(0, 500, (2, t), generator=gen)
    pos = torch.cat([torch.arange(8), torch.arange(8)]).expand(2, t)
    doc = torch.tensor([[0] * 8 + [1] * 8, [0] * 16])
    loss_mask = torch.zeros(2, t, dtype=torch.bool)
    loss_mask[:, 4:8] = True
    loss_mask[:, 12:] = True
    noised = noise_rows(
        ids, loss_mask, doc, torch.arange(2), mask_id=model.config.mask_token_id, eps=1e-3, seed=0, epoch=0
    )
    objective = BlockDiffusionLM(model)
    with torch.no_grad():
        loss_sum, _ = objective(noised.noisy_ids, ids, pos, dense_mask(doc, 4), noised.masked, noised.p_mask)
        # By hand: the engine's own forward over [noisy | clean], then CE/t at the masked positions.
        logits = model(torch.cat([noised.noisy_ids, ids], 1), torch.cat([pos, pos], 1), dense_mask(doc, 4))
    expected = 0.0
    for b in range(2):
        for i in range(t):
            if noised.masked[b, i]:
                row = logits[b, i].double()
                ce = math.log(float(row.exp().sum())) - float(row[ids[b, i]])
                expected += ce / float(noised.p_mask[b, i])
    answer = int(loss_mask.sum())
    assert int(noised.masked.sum()) >= 2
    assert math.isclose(float(loss_sum) / answer, expected / answer, rel_tol=1e-5)


def test_flex_block_mask_and_dense_mask_give_the_same_loss(tiny: Path) -> None:
    from engine.checkpoint import load_model

    model = load_model(tiny, dtype=torch.float32)
    t = 32
    ids = torch.randint(0, 500, (1, t), generator=torch.Generator().manual_seed(1))
    doc = torch.tensor([[0] * 12 + [1] * 20])
    pos = torch.cat([torch.arange(12), torch.arange(20)])[None]
    lm = torch.ones(1, t, dtype=torch.bool)
    nz = noise_rows(
        ids, lm, doc, torch.arange(1), mask_id=model.config.mask_token_id, eps=1e-3, seed=0, epoch=0
    )
    objective = BlockDiffusionLM(model)
    with torch.no_grad():  # flex_attention has no CPU backward
        dense, _ = objective(nz.noisy_ids, ids, pos, dense_mask(doc, 4), nz.masked, nz.p_mask)
        flex, _ = objective(nz.noisy_ids, ids, pos, build_block_mask(doc, 4, tile=16), nz.masked, nz.p_mask)
    assert torch.allclose(dense, flex, rtol=1e-5)


def test_a_few_steps_lower_the_held_out_loss(tiny: Path, examples: Path, tmp_path: Path) -> None:
    summary = run(
        tiny,
        examples,
        tmp_path / "o",
        max_steps=24,
        eval_data=str(examples),
        eval_rows=4,
        eval_every=12,
        lr=5e-3,
    )
    evals = json.loads((tmp_path / "o" / "summary.json").read_text())["eval"]
    rows = curve(tmp_path / "o", "eval_curve.csv")
    first, last = float(rows[0]["eval_loss"]), float(rows[-1]["eval_loss"])
    assert rows[0]["step"] == "0" and summary["steps"] == 24
    assert last < 0.7 * first, (first, last)
    assert evals["eval_masked_acc"] > 0.1
    assert (tmp_path / "o" / "loss_curve.png").stat().st_size > 0


def test_export_loads_in_the_engine_bit_exactly(tiny: Path, examples: Path, tmp_path: Path) -> None:
    from engine.checkpoint import load_model

    summary = run(tiny, examples, tmp_path / "o")
    trained = load_file(str(Path(summary["checkpoint"]) / "model.safetensors"))  # accelerate's own save
    loaded = load_model(summary["final"], dtype=None)
    state = loaded.state_dict()
    for key, value in trained.items():
        assert torch.equal(state[key.removeprefix("model.")], value), key
    assert (Path(summary["final"]) / "tokenizer.json").is_file()
    assert json.loads((Path(summary["final"]) / "sft_config.json").read_text())["max_steps"] == 4


def test_random_init_without_resumable_state_exports_only(tiny: Path, examples: Path, tmp_path: Path) -> None:
    """--init-config builds the same weights for the same seed; --no-save-state writes no checkpoints/."""
    from engine.checkpoint import load_model

    summaries = []
    for name in ("a", "b"):
        summaries.append(
            run(
                tiny,
                examples,
                tmp_path / name,
                model=None,
                init_config=str(tiny / "config.json"),
                tokenizer=str(tiny),
                max_steps=2,
                save_state=False,
            )
        )
    assert summaries[0]["checkpoint"] is None
    assert not (tmp_path / "a" / "checkpoints").exists()
    a, b = (load_model(s["final"], dtype=None).state_dict() for s in summaries)
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert len(curve(tmp_path / "a")) == 2


def test_resume_continues_identically(tiny: Path, examples: Path, tmp_path: Path) -> None:
    straight = run(tiny, examples, tmp_path / "a", max_steps=6)
    run(tiny, examples, tmp_path / "b", max_steps=6, save_every=3)
    # Drop everything after step 3 and continue from there.
    for stale in (tmp_path / "b" / "checkpoints" / "step_6", tmp_path / "b" / "final"):
        subprocess.run(["rm", "-rf", str(stale)], check=True)
    resumed = run(tiny, examples, tmp_path / "b", max_steps=6, resume="latest")
    assert [r["loss"] for r in curve(tmp_path / "a")] == [r["loss"] for r in curve(tmp_path / "b")]
    a = load_file(str(Path(straight["final"]) / "model.safetensors"))
    b = load_file(str(Path(resumed["final"]) / "model.safetensors"))
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_time_schedule_ends_the_decay_when_the_time_budget_ends(
    tiny: Path, examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--lr-schedule time: a run stopped by --max-minutes long before --max-steps still ends at the floor
    LR; the step schedule would have stopped near the top of its cosine."""
    from training.sft import _lr_lambda

    used = [0.0]
    f = _lr_lambda(1000, 10, 0.1, lambda: used[0], warmup_ratio=0.01)
    assert f(5) == 0.6 and f(20) > 0.99  # warm-up by steps; early on the steps lead
    used[0] = 0.505
    assert abs(f(20) - 0.55) < 1e-9  # half of the time after warm-up used: half-way down (0.1 + 0.9 / 2)
    used[0] = 1.5
    assert f(20) == 0.1  # the budget is spent: the floor
    long_warmup = _lr_lambda(100_000, 5_000, 0.1, lambda: used[0], warmup_ratio=0.05)
    used[0] = 0.025
    assert long_warmup(3) == 0.5  # half the warm-up's time: half the LR, whatever the steps say
    used[0] = 1.0
    assert long_warmup(3) == 0.1  # the time is up: the floor, even inside the step warm-up
    # The recipe's clock, made deterministic: every reading advances 10 ms, so the run's length in steps does
    # not depend on how loaded the machine is (a step reads it twice: ~50 steps in a 1.2 s budget).
    import itertools
    import types

    import training.sft as sft

    ticks = itertools.count()
    monkeypatch.setattr(sft, "time", types.SimpleNamespace(perf_counter=lambda: next(ticks) * 0.01))
    summary = run(tiny, examples, tmp_path / "t", max_steps=100_000, max_minutes=1.2 / 60, lr_schedule="time")
    lrs = [float(r["lr"]) for r in curve(tmp_path / "t")]
    assert 20 <= summary["steps"] < 100_000 and len(lrs) == summary["steps"]
    # at the floor (0.1 x 3e-3; the LR logged lags the clock by a step), from near the top
    assert lrs[-1] <= 3e-3 * 0.1 * 1.05 and max(lrs) > 3e-3 * 0.9
    with pytest.raises(ValueError, match="needs --max-minutes"):
        SFTConfig(data="x", init_config="c", tokenizer="t", lr_schedule="time").validate()


def test_gradient_accumulation_equals_the_bigger_batch(tiny: Path, examples: Path, tmp_path: Path) -> None:
    run(tiny, examples, tmp_path / "big", micro_batch_size=2)
    run(tiny, examples, tmp_path / "acc", micro_batch_size=1, grad_accum=2)
    big, acc = curve(tmp_path / "big"), curve(tmp_path / "acc")
    assert [float(r["loss"]) for r in big] == pytest.approx([float(r["loss"]) for r in acc], rel=1e-5)


@pytest.mark.slow
def test_two_gloo_processes_give_the_loss_of_one(tiny: Path, examples: Path, tmp_path: Path) -> None:
    """accelerate launch of the `dice train sft` entry point on 2 CPU processes vs 1 process, same rows."""
    common = [
        "--data",
        str(examples),
        "--model",
        str(tiny),
        "--seq-len",
        "64",
        "--lr",
        "3e-3",
        "--max-steps",
        "2",
        "--log-every",
        "1",
    ]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    one = subprocess.run(
        [
            sys.executable,
            "-m",
            "dice",
            "train",
            "sft",
            *common,
            "--micro-batch-size",
            "2",
            "--out",
            str(tmp_path / "1"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert one.returncode == 0, one.stderr[-2000:]
    two = subprocess.run(
        [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(REPO / "training" / "configs" / "cpu_gloo.yaml"),
            "-m",
            "dice",
            "train",
            "sft",
            *common,
            "--micro-batch-size",
            "1",
            "--out",
            str(tmp_path / "2"),
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert two.returncode == 0, two.stderr[-2000:]
    summary = json.loads((tmp_path / "2" / "summary.json").read_text())
    assert summary["processes"] == 2
    l1 = [float(r["loss"]) for r in curve(tmp_path / "1")]
    l2 = [float(r["loss"]) for r in curve(tmp_path / "2")]
    assert len(l1) == 2 and l1 == pytest.approx(l2, rel=1e-5)


def test_cli_rejects_bad_arguments_clearly(examples: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dice.cli import main as dice_main

    assert dice_main(["train", "sft", "--data", str(examples)]) == 2
    assert "exactly one of --model" in capsys.readouterr().err
    assert dice_main(["train", "sft", "--data", str(examples), "--model", "m", "--seq-len", "0"]) == 2


def test_gradient_checkpointing_gives_the_same_gradients(tiny: Path) -> None:
    from engine.checkpoint import load_model

    grads = []
    for ckpt in (False, True):
        model = load_model(tiny, dtype=torch.float32)
        for p in model.parameters():
            p.data = p.data.clone()
        model.gradient_checkpointing = ckpt
        objective = BlockDiffusionLM(model).train()
        t = 16
        ids = torch.randint(0, 500, (1, t), generator=torch.Generator().manual_seed(2))
        doc = torch.zeros(1, t, dtype=torch.long)
        lm = torch.ones(1, t, dtype=torch.bool)
        nz = noise_rows(
            ids, lm, doc, torch.arange(1), mask_id=model.config.mask_token_id, eps=1e-3, seed=0, epoch=0
        )
        loss, _ = objective(
            nz.noisy_ids, ids, torch.arange(t)[None], dense_mask(doc, 4), nz.masked, nz.p_mask
        )
        loss.backward()
        grads.append(model.model.layers[0].mlp.up_proj.weight.grad.clone())
    assert torch.allclose(grads[0], grads[1], atol=1e-6)


def test_a_deepspeed_launch_without_cuda_is_refused_not_silently_dropped(
    tiny: Path, examples: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if torch.cuda.is_available():
        pytest.skip("the refusal is for machines without CUDA")
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")  # set by `accelerate launch` of a DeepSpeed config
    with pytest.raises(RuntimeError, match="DeepSpeed launch .* needs CUDA GPUs; on CPU use .*cpu_gloo.yaml"):
        run(tiny, examples, tmp_path / "o")
    assert not (tmp_path / "o" / "checkpoints").exists()
