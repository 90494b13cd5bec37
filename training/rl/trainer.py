"""BiC-RL (``dice train rl``): TraceRL post-training of a block-diffusion model, through accelerate.

One step: the next ``--tasks-per-step`` tasks in schedule order (:mod:`training.rl.schedule`), shared out
over the processes; ``--group-size`` rollouts each with the engine over the model being trained (no grad,
eval mode, not fused; a synced copy when the parameters are sharded or the rollout dtype differs), scored
by the reward (the validator's batch API, or a toy reward), chunk by chunk while the next chunk decodes;
group z-scores (groups whose rewards are all equal dropped and counted); the trace batch; the old
log-probs (no grad); then one epoch of updates (``--mini-batches`` optimizer steps, each accumulating
micro-batches of ``--micro-batch-size`` samples), AdamW. A step with no group left is skipped with a
warning (never an update on nothing), on every process at once.

Collectives: every process makes the same calls in the same order whatever its own share held: the counts
of a step are all-reduced first (the skip decision, and each mini-batch's micro-batch count: a process with
fewer samples runs zero-weight dummy micro-batches), then the metrics. Read from :class:`RLTrainer` down:
setup, one step (rollouts, rewards, update), evaluate, save a checkpoint, export the final model.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training.config import NCCL_SAFE_ENV
from training.export import export_engine_format, latest_checkpoint
from training.rl.config import RLConfig
from training.rl.metrics import LiveView, compiled, step_row, step_sums, write_curves
from training.rl.run_state import TrainerState, is_kernelbench_problems_file, step_seed
from training.rl.schedule import Schedule
from training.rl.update import PolicyLogps, TraceUpdater, align_deepspeed, full_parameters

# The config fields a resumed run must share with the run it continues (the schedule and the seeds).
# (--steps may grow on a resume of a sequential schedule, whose plan of a step does not depend on it.)
RESUME_KEYS = ("phase", "tasks", "schedule", "tasks_per_step", "group_size", "seed")
PNG_EVERY = 10  # steps between redraws of curves.png (metrics.csv is rewritten every step)


class RLSetupError(ValueError):
    """A run that cannot start as asked (a task set, an evaluation file, a resume that does not fit)."""


def reward_workers(cfg: RLConfig, world: int, cpus: int | None = None) -> int | None:
    """``--validator-workers``, else for phase ``infill`` one per CPU core of this process's share of the
    machine (a ``.cu`` reward is an NVRTC compile, CPU-bound; a dice-spec run, and every ``e2e`` run, is
    serialised per GPU whatever the width), else the pool's default (None)."""
    if cfg.validator_workers:
        return cfg.validator_workers
    if cfg.phase != "infill":
        return None
    return max(1, (cpus or os.cpu_count() or 1) // max(1, world))


class SkippedStepWarning(RuntimeWarning):
    """A step whose groups were all dropped (every group's rewards equal): no update was made."""


@dataclass
class StepData:
    """One process's share of a step after rollouts and rewards."""

    tasks: list
    groups: list  # list[list[Rollout]]
    scores: list  # list[list[Scored]]
    rollout_s: float = 0.0
    reward_s: float = 0.0


class RLTrainer:
    """``dice train rl`` in the phases :func:`main` calls in order: :meth:`setup`, :meth:`train`,
    :meth:`finish`."""

    def __init__(self, cfg: RLConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.state = TrainerState()
        self.started = time.perf_counter()
        self.stopped_by_time = False  # --max-minutes ended the run before --steps

    # ---------------------------------------------------------------------------------------------- setup

    def setup(self) -> None:
        """Accelerator, model, tasks and schedule, reward, optimizer, prepare, resume, rollout engine."""
        self._setup_accelerator()
        self._setup_model()
        self._setup_tasks()
        self._setup_reward()
        cfg = self.cfg
        fused = self.cuda and not self.deepspeed
        self.optimizer = torch.optim.AdamW(
            self.policy.parameters(),
            lr=cfg.lr,
            betas=(0.9, cfg.adam_beta2),
            weight_decay=cfg.weight_decay,
            fused=fused or None,
        )
        if self._compile_layers():
            from training.objective import compile_layers

            compile_layers(self.policy.model)
            if self.ref_model is not None:
                # uncompiled, its flex_attention runs unfused (the whole score matrix materialised: seen
                # on the H200 with --kl-mode ref)
                compile_layers(self.ref_model)
        self.policy, self.optimizer = self.accelerator.prepare(self.policy, self.optimizer)
        if self.ref_model is not None:
            self.ref_model.to(self.accelerator.device)
        self.updater = TraceUpdater(
            cfg,
            self.accelerator,
            self.policy,
            self.optimizer,
            block_size=self.block_size,
            mask_id=self.mask_id,
            pad_id=self.pad_id,
            attn_impl=self.attn_impl,
            ref_model=self.ref_model,
            deepspeed=self.deepspeed,
        )
        self._resume()
        self._setup_rollout_engine()

    def _rollout_dtype(self) -> torch.dtype:
        name = self.cfg.rollout_dtype
        return getattr(torch, name if name != "auto" else ("bfloat16" if self.cuda else "float32"))

    def _shares_model(self) -> bool:
        """Whether the rollout engine decodes with the trained model itself (not a synced copy)."""
        return not self.sharded and self._rollout_dtype() == torch.float32

    def _compile_layers(self) -> bool:
        """Compile the trained layers (flex attention fused, as SFT) unless the engine decodes with them:
        its cached steps call the same layers with a KV cache, which the compiled training graph is not."""
        cfg = self.cfg
        if cfg.compile == "yes" and self._shares_model():
            raise RLSetupError(
                "--compile yes needs a rollout copy: --rollout-dtype bfloat16 (or a sharded run)"
            )
        return cfg.compile == "yes" or (cfg.compile == "auto" and self.cuda and not self._shares_model())

    def _setup_accelerator(self) -> None:
        from accelerate import Accelerator
        from accelerate.utils import parse_flag_from_env, set_seed

        cfg = self.cfg
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("--device cuda: CUDA is not available here (use --device cpu)")
        self.cuda = cuda = torch.cuda.is_available() and cfg.device != "cpu"
        self.mixed = cfg.mixed_precision if cfg.mixed_precision != "auto" else ("bf16" if cuda else "no")
        if not cuda and parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
            raise RuntimeError(
                "a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED) needs CUDA GPUs; on CPU use "
                "training/configs/cpu_gloo.yaml (several processes over gloo) or no launcher"
            )
        self.accelerator = acc = Accelerator(mixed_precision=self.mixed, cpu=not cuda)
        self.world, self.rank = acc.num_processes, acc.process_index
        kind = acc.distributed_type.name
        self.deepspeed = kind.startswith("DEEPSPEED")
        self.sharded = self.deepspeed or kind.startswith("FSDP")
        if self.deepspeed:
            align_deepspeed(acc.state.deepspeed_plugin.deepspeed_config, cfg, self.world)
        set_seed(cfg.seed)
        if acc.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)

    def _setup_model(self) -> None:
        from engine.checkpoint import load_model
        from engine.tokenizer import load_tokenizer

        cfg = self.cfg
        model = load_model(cfg.model, dtype=torch.float32)
        for p in model.parameters():  # own storage per parameter (load_model's tensors share one mmap)
            p.data = p.data.clone()
        model.gradient_checkpointing = cfg.gradient_checkpointing
        self.model_config = config = model.config
        self.block_size = cfg.block_size or config.block_size
        self.tokenizer_dir = Path(cfg.tokenizer or cfg.model)
        self.tokenizer = load_tokenizer(self.tokenizer_dir, mask_id=config.mask_token_id)
        self.mask_id = config.mask_token_id if config.mask_token_id is not None else self.tokenizer.mask_id
        self.pad_id = self.tokenizer.pad_id
        self.attn_impl = cfg.attention if cfg.attention != "auto" else ("flex" if self.cuda else "dense")
        self.ref_model = None
        if cfg.kl_mode == "ref":  # a frozen copy of the start model, full on every process
            import copy

            self.ref_model = copy.deepcopy(model).eval().requires_grad_(False)
        self.policy = PolicyLogps(model).train()

    def _setup_tasks(self) -> None:
        from engine.model_settings import read_hole_cut, read_identifier_scope
        from training.rl.tasks import CuPrompting, load_tasks

        cfg = self.cfg
        # .cu prompts as the assistant cuts them for this model (its dice.json), so rollouts see what users do
        hole_cut = read_hole_cut(cfg.model) if cfg.hole_cut == "auto" else cfg.hole_cut
        scope = read_identifier_scope(cfg.model) if cfg.identifier_scope == "auto" else cfg.identifier_scope
        self.identifier_scope = scope == "prompt"
        cu = CuPrompting(hole_cut, cfg.cu_window_bytes or None)
        self.tasks = self._fitting(load_tasks(cfg.tasks, cfg.phase, cu=cu), "--tasks")
        if cfg.reward == "validator" and any(t.kind == "toy" for t in self.tasks):
            raise RLSetupError("toy tasks have no program to validate: use --reward toy:<text> with them")
        self.schedule = Schedule(
            [t.level for t in self.tasks],
            kind=cfg.schedule,
            tasks_per_step=cfg.tasks_per_step,
            steps=cfg.total_steps,
            seed=cfg.seed,
            sharpness=cfg.curriculum_sharpness,
        )
        self.eval_tasks = None
        if cfg.eval_tasks:
            if is_kernelbench_problems_file(cfg.eval_tasks):
                raise RLSetupError(
                    f"--eval-tasks {cfg.eval_tasks}: a KernelBench problems file; model selection never "
                    "runs on KernelBench itself (give held-out tasks, e.g. CuKe's cu_infill_heldout.jsonl)"
                )
            eval_tasks = self._fitting(load_tasks([cfg.eval_tasks], cfg.phase, cu=cu), "--eval-tasks")
            train_ids, train_prompts = {t.id for t in self.tasks}, {t.prompt for t in self.tasks}
            seen = [t.id for t in eval_tasks if t.id in train_ids or t.prompt in train_prompts]
            if seen:
                raise RLSetupError(
                    f"--eval-tasks {cfg.eval_tasks}: {len(seen)} task(s) also in --tasks "
                    f"(e.g. {seen[0]!r}); held-out tasks must be ones no update sees"
                )
            self.eval_tasks = eval_tasks[: cfg.eval_max] if cfg.eval_max else eval_tasks
        if self.accelerator.is_main_process:
            self.schedule.write(self.out / "schedule.jsonl", [t.id for t in self.tasks])
            if self.schedule.reordered:
                self.accelerator.print("rl: the task files were not sorted by level; scheduled easy first")

    def _fitting(self, tasks: list, what: str) -> list:
        """The tasks whose prompt leaves room for a response in the model's context (a 40k-token ``.cu`` file
        does not fit a small model's 8k window): the others are dropped once, here, with a warning and a
        count in ``summary.json`` (``tasks_too_long``), instead of failing a step mid-run."""
        limit = self.model_config.max_position_embeddings
        room = min(self.cfg.max_new_tokens, 64)
        kept = [t for t in tasks if len(self.tokenizer.encode(t.prompt)) + room <= limit]
        dropped = len(tasks) - len(kept)
        self.too_long = getattr(self, "too_long", {}) | {what: dropped}
        if dropped:
            warnings.warn(
                f"rl: {dropped} of {len(tasks)} {what} task(s) leave fewer than {room} tokens of the model's "
                f"{limit}-token context for a response; dropped",
                stacklevel=2,
            )
        if not kept:
            raise RLSetupError(f"{what}: no task fits the model's {limit}-token context")
        return kept

    def _setup_reward(self) -> None:
        from training.rl.rewards import ToyReward, ValidatorReward

        cfg = self.cfg
        self.pool = None
        if cfg.toy_target is not None:
            self.reward = ToyReward(cfg.toy_target)
            return
        from dice.validator import ValidatorPool

        self.pool = ValidatorPool(reward_workers(cfg, self.world), timeout_s=cfg.validator_timeout_s)
        self.reward = ValidatorReward(
            self.pool,
            speedup_term=cfg.speedup_term,
            accept_compiled=cfg.accept_compiled,
            cu_reward=cfg.cu_reward,
        )

    def _resume(self) -> None:
        """accelerate restores weights, optimizer and RNG; the trainer state restores step and metrics."""
        cfg = self.cfg
        if not cfg.resume:
            return
        resume_dir = latest_checkpoint(self.out) if cfg.resume == "latest" else Path(cfg.resume)
        if resume_dir is None or not resume_dir.is_dir():
            raise RLSetupError(f"--resume {cfg.resume}: no checkpoint found in {self.out / 'checkpoints'}")
        saved = json.loads((resume_dir / "rl_config.json").read_text())
        mine = dataclasses.asdict(cfg)
        keys = RESUME_KEYS if cfg.schedule == "sequential" else (*RESUME_KEYS, "steps")
        differ = [k for k in keys if saved.get(k) != mine.get(k)]
        if differ:
            raise RLSetupError(
                f"--resume {resume_dir}: the run differs in {differ}; resume with the same values"
            )
        self.accelerator.load_state(str(resume_dir))
        self.state = TrainerState.read(resume_dir / "trainer_state.json")
        self.accelerator.print(f"rl: resumed at step {self.state.step} from {resume_dir}")

    def _setup_rollout_engine(self) -> None:
        """The engine the rollouts decode with: the trained model itself (one process or DDP, rollout dtype
        float32), else a copy in the rollout dtype whose weights follow every update."""
        from engine.engine import Engine
        from engine.model import DiceModel

        cfg = self.cfg
        if self._shares_model():
            self.rollout_model = self.accelerator.unwrap_model(self.policy).model
        else:
            with torch.device("meta"):
                copy = DiceModel(self.model_config)
            copy.to_empty(device=self.accelerator.device)
            if self.model_config.tie_word_embeddings:
                copy.tie_weights()
            self.rollout_model = copy.to(self._rollout_dtype()).eval().requires_grad_(False)
        self.engine = Engine(
            self.rollout_model,
            self.tokenizer,
            name="policy",
            cuda_graphs=cfg.rollout_cuda_graphs if self.cuda else False,
            fuse_projections=False,
        )
        self._sync_rollout_weights()

    @torch.no_grad()
    def _sync_rollout_weights(self) -> None:
        """Copy the trained weights into the rollout copy (gathering sharded parameters on every process,
        in the same order) and clear the engine's prefix cache: its K/V came from the old weights."""
        if self.rollout_model is not self.accelerator.unwrap_model(self.policy).model:
            targets = dict(self.rollout_model.named_parameters())
            for name, full in full_parameters(
                self.accelerator.unwrap_model(self.policy).model, self.deepspeed
            ):
                targets[name].copy_(full)
        self.engine.clear_prefix_cache()

    # ------------------------------------------------------------------------------------------- training

    def train(self) -> None:
        """Steps until ``--steps``, with the live view, held-out evaluations and checkpoints."""
        s, cfg, acc = self.state, self.cfg, self.accelerator
        total = cfg.total_steps
        acc.print(
            f"rl {cfg.phase}: {len(self.tasks)} tasks, {total} steps x {cfg.tasks_per_step} tasks x "
            f"{cfg.group_size} samples, schedule {cfg.schedule}, {self.world} process(es), "
            f"reward {cfg.reward}, rollouts in {self.rollout_model.lm_head.weight.dtype}"
        )
        if self.eval_tasks is not None and s.step == 0:
            s.eval_history.append({"step": 0, **self.evaluate()})
            acc.print(f"rl: held-out before training: {s.eval_history[-1]}")
        started, first = time.perf_counter(), s.step
        with LiveView(total, s.step, phase=cfg.phase, enabled=acc.is_main_process) as view:
            while s.step < total:
                if s.step > first and self._out_of_time(started):
                    acc.print(f"rl: --max-minutes {cfg.max_minutes:g} reached after step {s.step} of {total}")
                    self.stopped_by_time = True
                    break
                s.step += 1
                row = self.train_step(s.step)
                if self.eval_tasks is not None and cfg.eval_every and s.step % cfg.eval_every == 0:
                    ev = {"step": s.step, **self.evaluate()}
                    s.eval_history.append(ev)
                    row.update({k: v for k, v in ev.items() if k.startswith("eval_") and k != "eval_s"})
                s.history.append(row)
                view.update(row)
                if cfg.save_every and s.step % cfg.save_every == 0 and s.step < total:
                    self.save_checkpoint()
                if acc.is_main_process:  # the CSVs every step, the PNG every few
                    png = s.step % PNG_EVERY == 0 or s.step == total
                    write_curves(self.out, s.history, s.eval_history, png=png)

    def _out_of_time(self, started: float) -> bool:
        """``--max-minutes`` spent since ``train`` began, as every process agrees (the slowest clock's
        answer: each process must leave the loop at the same step)."""
        if not self.cfg.max_minutes:
            return False
        late = float(time.perf_counter() - started > self.cfg.max_minutes * 60)
        flag = torch.tensor([late], device=self.accelerator.device)
        return bool(self.accelerator.reduce(flag, reduction="max").item() > 0)

    def train_step(self, step: int) -> dict:
        """One RL step on every process; the step's metrics row (reduced over the processes)."""
        started = time.perf_counter()
        plan = self.schedule.plan(step)
        tasks = [self.tasks[i] for i in plan.share(self.rank, self.world)]
        data = self.rollouts(tasks, step)
        from training.rl.advantages import group_advantages

        rewards = [[sc.reward for sc in g] for g in data.scores]
        passed = [[sc.passed for sc in g] for g in data.scores]
        groups = group_advantages(rewards, passed=passed)
        t0 = time.perf_counter()
        update = self.update(data, groups.advantages)
        update_s = time.perf_counter() - t0
        row = self._metrics_row(step, plan, data, groups, update)
        timing = torch.tensor([data.rollout_s, data.reward_s, update_s, time.perf_counter() - started])
        timing = self.accelerator.reduce(timing.to(self.accelerator.device), reduction="max").tolist()
        names = ("rollout_s", "reward_s", "update_s", "step_s")
        row.update({name: round(x, 3) for name, x in zip(names, timing, strict=True)})
        if row["skipped"]:
            self.state.skipped += 1
            if self.accelerator.is_main_process:
                warnings.warn(
                    f"rl step {step}: all {row['dropped_groups']} groups had equal rewards (nothing to learn "
                    "from); the step was skipped, no update made",
                    SkippedStepWarning,
                    stacklevel=2,
                )
        return row

    def rollouts(self, tasks: list, step: int, *, greedy: bool = False) -> StepData:
        """G samples per task (1 greedy sample for evaluation) and their scores; each engine chunk is
        submitted for scoring as soon as it is decoded (``--overlap-rewards``), so rewards of one chunk
        are computed while the next decodes. ``reward_s`` is the wait for rewards after the last chunk."""
        from training.rl.rollout import RolloutSettings, rollout_chunks

        cfg = self.cfg
        settings = RolloutSettings(
            group_size=1 if greedy else cfg.group_size,
            temperature=0.0 if greedy else cfg.temperature,
            top_p=cfg.top_p if cfg.top_p < 1 else None,
            top_k=cfg.top_k or None,
            policy=cfg.policy,
            threshold=cfg.threshold,
            block_size=self.block_size,
            max_new_tokens=cfg.max_new_tokens,
            seed=step_seed(cfg.seed, step, self.rank),
            batch_rows=cfg.rollout_rows,
            kv_budget_bytes=self._kv_budget_bytes(),
            identifier_scope=self.identifier_scope,
        )
        n = settings.group_size
        groups: list[list] = [[None] * n for _ in tasks]
        scores: list[list] = [[None] * n for _ in tasks]
        pending: list[tuple[list[tuple[int, int, list]], Any]] = []
        self.policy.eval()
        t0 = time.perf_counter()
        with torch.no_grad():
            for pieces in rollout_chunks(self.engine, tasks, settings):
                for t, first, rows in pieces:
                    groups[t][first : first + len(rows)] = rows
                if cfg.overlap_rewards:
                    pending.append(
                        (
                            pieces,
                            self.reward.submit([tasks[t] for t, _, _ in pieces], [r for _, _, r in pieces]),
                        )
                    )
        # the K/V caches and graphs the chunks used would sit through the update (98 GB at 1.7B, 256 rows)
        self.engine.release_buffers()
        rollout_s = time.perf_counter() - t0
        if not cfg.overlap_rewards and tasks:
            whole = [(t, 0, groups[t]) for t in range(len(tasks))]
            pending.append((whole, self.reward.submit(tasks, groups)))
        for pieces, future in pending:
            for (t, first, rows), got in zip(pieces, future.result(), strict=True):
                scores[t][first : first + len(rows)] = got
        self.policy.train()
        return StepData(tasks, groups, scores, rollout_s, time.perf_counter() - t0 - rollout_s)

    def _kv_budget_bytes(self) -> int | None:
        """``--rollout-kv-gb`` in bytes; auto (-1): 40 % of the GPU memory free now, on CUDA (no cap on
        the CPU). Measured each step: the optimizer's state appears after the first update."""
        gb = self.cfg.rollout_kv_gb
        if gb > 0:
            return int(gb * 1e9)
        if gb == 0 or not self.cuda:
            return None
        free, _total = torch.cuda.mem_get_info(self.accelerator.device)
        return int(0.4 * free)

    # --------------------------------------------------------------------------------------------- update

    def update(self, data: StepData, advantages: list) -> dict:
        """One epoch of TraceRL updates over the kept groups (:class:`training.rl.update.TraceUpdater`);
        the rollout engine then follows the new weights."""
        result = self.updater.update(data.groups, advantages)
        if not result["skipped"]:
            self._sync_rollout_weights()
        return result

    # ------------------------------------------------------------------------------------ metrics, evaluate

    def _metrics_row(self, step: int, plan: Any, data: StepData, groups: Any, update: dict) -> dict:
        """The step's row: sums over this process's share, all-reduced in one call."""
        from training.rl.rollout import rollout_stats

        sums = step_sums(data.scores, rollout_stats(data.groups), groups, update)
        dev = self.accelerator.device
        totals = self.accelerator.reduce(torch.tensor(sums, dtype=torch.float64, device=dev), "sum")
        head = {
            "step": step,
            "phase": self.cfg.phase,
            "levels": self.schedule.level_mix(plan),
            "tasks": len(plan.indices),
        }
        tail = {"lr": self.optimizer.param_groups[0]["lr"]}
        return step_row(head, totals.tolist(), update, self.cfg.mini_batches, tail)

    def evaluate(self) -> dict:
        """Held-out compile and compile-and-correct rates: one greedy sample per task, scored by the
        training reward, the tasks shared out over the processes."""
        t0 = time.perf_counter()
        tasks = self.eval_tasks[self.rank :: self.world]
        data = self.rollouts(tasks, 0, greedy=True)
        flat = [sc for g in data.scores for sc in g]
        sums = [len(flat), sum(compiled(sc) for sc in flat), sum(sc.passed for sc in flat)]
        sums += [sum(sc.reward for sc in flat), sum(sc.exact for sc in flat)]
        v = self.accelerator.reduce(
            torch.tensor(sums, dtype=torch.float64, device=self.accelerator.device), "sum"
        )
        n, comp, ok, reward, exact = v.tolist()
        return {
            "tasks": int(n),
            "eval_compile_rate": round(comp / max(n, 1), 6),
            "eval_correct_rate": round(ok / max(n, 1), 6),
            "eval_exact_rate": round(exact / max(n, 1), 6),
            "eval_reward_mean": round(reward / max(n, 1), 6),
            "eval_s": round(time.perf_counter() - t0, 3),
        }

    # ------------------------------------------------------------------------------------ save and export

    def save_checkpoint(self) -> Path:
        """accelerate's resumable state, the trainer state and the config in ``checkpoints/step_N``."""
        s, acc = self.state, self.accelerator
        path = self.out / "checkpoints" / f"step_{s.step}"
        acc.save_state(str(path))
        if acc.is_main_process:
            (path / "trainer_state.json").write_text(s.to_json() + "\n")
            (path / "rl_config.json").write_text(self.cfg.to_json())
        acc.wait_for_everyone()
        return path

    def export_final(self) -> Path:
        """The trained model in the engine's format (``out/final``), with tokenizer, config and curves."""
        cfg, acc = self.cfg, self.accelerator
        final = self.out / "final"
        if export_engine_format(
            acc, self.policy, self.model_config, final, tokenizer_dir=self.tokenizer_dir,
            dtype=cfg.save_dtype, max_shard_mb=cfg.max_shard_mb,
        ):  # fmt: skip
            (final / "rl_config.json").write_text(cfg.to_json())
            if (self.out / "curves.png").is_file():
                shutil.copyfile(self.out / "curves.png", final / "curves.png")
        acc.wait_for_everyone()
        return final

    def finish(self) -> dict:
        """Final evaluation, curves, last checkpoint and export; the summary (also in ``summary.json``)."""
        s, cfg, acc = self.state, self.cfg, self.accelerator
        if self.eval_tasks is not None and (not s.eval_history or s.eval_history[-1]["step"] != s.step):
            s.eval_history.append({"step": s.step, **self.evaluate()})
        if acc.is_main_process:
            write_curves(self.out, s.history, s.eval_history)
        ckpt = self.save_checkpoint() if cfg.save_state else None
        final = self.export_final()
        summary = {
            "phase": cfg.phase,
            "steps": s.step,
            "skipped_steps": s.skipped,
            "stopped_by_max_minutes": self.stopped_by_time,
            "tasks_too_long": getattr(self, "too_long", {}),
            "last": s.history[-1] if s.history else None,
            "eval_before": s.eval_history[0] if s.eval_history else None,
            "eval_after": s.eval_history[-1] if s.eval_history else None,
            "checkpoint": str(ckpt) if ckpt is not None else None,
            "final": str(final),
            "elapsed_s": round(time.perf_counter() - self.started, 2),
            "processes": self.world,
        }
        if acc.is_main_process:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        self.close()
        acc.end_training()
        return summary

    def close(self) -> None:
        """Stop the reward's scoring thread and the validator pool (idempotent)."""
        for name in ("reward", "pool"):
            thing = getattr(self, name, None)
            setattr(self, name, None)
            if thing is not None and hasattr(thing, "close"):
                thing.close()


def main(cfg: RLConfig) -> dict:
    """Train; return a summary (steps, last metrics, held-out before/after, output paths)."""
    for key, value in NCCL_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    cfg.validate()
    cfg = dataclasses.replace(cfg, steps=cfg.total_steps)  # the resolved config is the one saved
    trainer = RLTrainer(cfg)
    try:
        trainer.setup()
        if trainer.accelerator.is_main_process:
            (trainer.out / "rl_config.json").write_text(cfg.to_json())
        trainer.train()
        return trainer.finish()
    finally:
        trainer.close()
