"""benchmarks/rl_step_shape.py (one BiC-RL step at a real shape, issue 20 item 6): the tie-break reward, the
trainer flags of the device run, the 1.7B config with the SDAR tokenizer, and ``--smoke-cpu`` end to end (a
random tiny model saved, one ``dice train rl`` step, the time split written)."""

from __future__ import annotations

import concurrent.futures
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
SCRIPT = ROOT / "benchmarks" / "rl_step_shape.py"


@pytest.fixture(scope="module")
def bench() -> Any:
    spec = importlib.util.spec_from_file_location("rl_step_shape", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["rl_step_shape"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


class _Inner:
    """A reward with fixed scores (``submit`` through a future, as the validator's)."""

    def __init__(self, scores: list) -> None:
        self.scores = scores
        self.closed = False

    def __call__(self, tasks: Any, rollouts: Any) -> list:
        return self.scores

    def submit(self, tasks: Any, rollouts: Any) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        future.set_result(self.scores)
        return future

    def close(self) -> None:
        self.closed = True


def test_the_tie_break_splits_only_groups_whose_rewards_are_all_equal(bench: Any) -> None:
    from training.rl.advantages import group_advantages
    from training.rl.rewards import Scored
    from training.rl.rollout import Rollout

    def group(task: str, rewards: list[float]) -> tuple[list, list]:
        rolls = [Rollout(task, j, (1,), (2,), (1,), "", False) for j in range(len(rewards))]
        return rolls, [Scored(r, "compiled") for r in rewards]

    (r0, s0), (r1, s1) = group("a", [0.0] * 4), group("b", [0.0, 1.0, 0.0, 0.0])
    inner = _Inner([s0, s1])
    tie = bench.TieBreak(inner)
    got = tie.submit(None, [r0, r1]).result()
    assert [s.reward for s in got[0]] == [0.0, bench.TIE, 0.0, bench.TIE]
    assert got[1] == s1 and tie.broken == 1
    assert tie(None, [r0, r1])[0] == got[0]
    groups = group_advantages([[s.reward for s in g] for g in got])
    assert groups.dropped == 0
    assert groups.advantages[0] == pytest.approx([-1.0, 1.0, -1.0, 1.0], abs=1e-2)
    tie.close()  # the trainer closes its reward: passed on to the wrapped one
    assert inner.closed


def test_the_device_run_asks_the_trainer_for_flags_it_has(bench: Any, tmp_path: Path) -> None:
    from dice.cli import build_parser
    from training.rl.config import RLConfig

    args = bench.parse_args(
        ["--tokenizer", "tok", "--tasks", "t.jsonl", "--out", str(tmp_path), "--device", "cuda"]
    )
    argv = bench.trainer_argv(args, "model", tmp_path / "tasks.jsonl", tmp_path / "run")
    cfg = RLConfig.from_args(build_parser().parse_args(argv))
    cfg.validate()
    assert (args.shape, cfg.phase, cfg.steps) == ("1.7B", "infill", 1)
    assert (cfg.tasks_per_step, cfg.group_size, cfg.max_new_tokens, cfg.rollout_rows) == (64, 16, 256, 256)
    assert (cfg.mixed_precision, cfg.rollout_dtype, cfg.compile, cfg.device) == (
        "bf16",
        "bfloat16",
        "yes",
        "cuda",
    )
    assert cfg.packed and not cfg.rollout_cuda_graphs and not cfg.save_state
    assert (cfg.kl_mode, cfg.reward, cfg.cu_window_bytes) == ("old", "validator", 5000)
    more = bench.parse_args(["--out", str(tmp_path), "--layout", "rows", "--", "--lr", "2e-6"])
    more_argv = bench.trainer_argv(more, "model", tmp_path / "t", tmp_path / "run")
    assert "--no-packed" in more_argv and more_argv[-2:] == ["--lr", "2e-6"]


def test_the_1_7b_config_takes_the_sdar_tokenizer(bench: Any, shared_data: Path, tmp_path: Path) -> None:
    from engine.tokenizer import load_tokenizer

    args = bench.parse_args(["--tokenizer", str(shared_data / "sdar-tokenizer"), "--out", str(tmp_path)])
    cfg, folder = bench.shape_config(args, tmp_path)
    tok = load_tokenizer(folder, mask_id=cfg.mask_token_id)
    assert (cfg.hidden_size, cfg.num_hidden_layers, cfg.vocab_size) == (2048, 28, 151936)
    assert tok.vocab_size == 151670 <= cfg.vocab_size and tok.mask_id == 151669 and tok.eos_id == 151643
    assert 1.6e9 < cfg.num_parameters < 1.8e9


@pytest.mark.slow  # ~10 s: imports, a validator pool, NVRTC on 4 fills, one step of a tiny model
def test_smoke_cpu_runs_one_step_and_writes_the_time_split(tmp_path: Path) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--smoke-cpu", "--out", str(out), "--work", str(work)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=170,
    )
    assert proc.returncode == 0, (proc.stdout[-3000:], proc.stderr[-3000:])
    result = json.loads((out / "rl_step_shape.json").read_text())
    assert result["status"] == "ok"
    split = result["time_split"]
    for key in ("model_create_s", "trainer_setup_s", "rollout_s", "reward_s", "update_s", "total_s"):
        assert isinstance(split[key], (int, float)) and split[key] >= 0, (key, split)
    assert split["total_s"] >= split["rollout_s"] + split["reward_s"] + split["update_s"] - 0.01
    sizes, tokens, rewards = result["sizes"], result["tokens"], result["rewards"]
    assert (sizes["samples"], sizes["max_new_tokens"], sizes["task_kinds"]) == (4, 8, ["cu_infill"])
    assert sizes["parameters"] > 0 and sizes["prompt_tokens_max"] > 0
    assert 0 < tokens["generated"] <= 4 * 8 and tokens["update_model_tokens"] > 0
    assert (rewards["kept_groups"], rewards["dropped_groups"], rewards["skipped"]) == (2, 0, 0)
    assert len(result["metrics"]) == 1 and result["metrics"][0]["step"] == 1
    assert {p.name for p in out.iterdir()} == {
        "rl_step_shape.json",
        "rl_step_shape.md",
        "metrics.csv",
        "summary.json",
    }
    assert "| rollout_s |" in (out / "rl_step_shape.md").read_text()
    assert not (work / "model").exists() and not (work / "run" / "final").exists()
