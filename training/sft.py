"""Block-diffusion SFT (``dice train sft``): the SDAR objective over packed ChatML examples, with accelerate.

One optimizer step = ``micro_batch_size x grad_accum x processes`` packed rows. Each row (T tokens, several
documents) is noised per document (``training.losses.add_noise``), laid out as ``[noisy | clean]`` (2T
tokens, position ids duplicated) under the block-diffusion mask (``training.masks``), and the 1/t-weighted
cross-entropy of the masked tokens is divided by the number of answer tokens of the whole global step, so
any split of the same rows over processes and accumulation steps gives the same loss and update.

Noise is drawn from a generator seeded by (seed, epoch, row index): the same rows get the same noise on any
number of processes and after a resume. Launch with ``accelerate launch`` and a config from
``training/configs/`` for several GPUs or nodes; the plain command runs on one device.

The objective is :class:`training.objective.BlockDiffusionLM`; the rows come from :mod:`training.rows`. Read
from :class:`SFTRecipe` down: setup, one training step, evaluate, save a checkpoint, export the final model.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from training.config import NCCL_SAFE_ENV, SFTConfig
from training.curves import write_curves
from training.export import export_engine_format, latest_checkpoint
from training.objective import BlockDiffusionLM, attention_mask_for, compile_layers, noise_rows
from training.rows import EpochPermutation, RowDataset, load_rows

# --------------------------------------------------------------------------------------------------------
# Setup helpers


def _lr_lambda(total: int, warmup: int, floor: float, time_fraction=None, warmup_ratio: float = 0.0):
    """Linear warm-up over ``warmup`` steps, then a cosine from 1 to ``floor`` over the rest of ``total``.

    With ``time_fraction`` (``--lr-schedule time``: the share of the ``--max-minutes`` budget used) both
    follow whichever runs out first, the steps or the time: the warm-up ends after ``warmup`` steps or
    ``warmup_ratio`` of the time, and the cosine's progress is the larger of the two shares, so a run the
    time budget stops still ends its decay at the floor."""

    def f(step: int) -> float:
        used = min(1.0, time_fraction()) if time_fraction is not None else None
        if warmup and step < warmup:
            by_time = used / warmup_ratio if used is not None and warmup_ratio > 0 else 0.0
            if by_time < 1.0:
                return max((step + 1) / warmup, by_time)
        progress = min(1.0, (step - warmup) / max(1, total - warmup)) if step >= warmup else 0.0
        if used is not None:
            progress = max(progress, (used - warmup_ratio) / max(1e-9, 1.0 - warmup_ratio))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * min(1.0, max(0.0, progress))))

    return f


def build_model(cfg: SFTConfig, device: torch.device | str = "cpu"):
    """The model to train (float32 master weights) and the tokenizer folder to ship with it.

    A random init is built on the meta device and initialised once on ``device`` (the default
    nn.Linear init of a 2 B model takes about a minute on a CPU and would be overwritten anyway); the
    same seed gives the same weights on every process of one device type.
    """
    from engine.checkpoint import load_model
    from engine.model import DiceModel, ModelConfig

    if cfg.model is not None:
        model = load_model(cfg.model, dtype=torch.float32)
        # load_model's tensors are views of one memory map; give every parameter its own storage so the
        # optimizer and the checkpoint writer (which drops tensors sharing storage) see distinct tensors.
        # parameters() yields a tied weight once, so ties survive.
        for p in model.parameters():
            p.data = p.data.clone()
        return model.train(), Path(cfg.tokenizer or cfg.model)
    config = ModelConfig.from_json(cfg.init_config)
    with torch.device("meta"):
        model = DiceModel(config)
    model.to_empty(device=device)
    if config.tie_word_embeddings:
        model.tie_weights()  # to_empty gives the shared parameter one storage; tie it explicitly anyway
    model.init_weights(std=0.02, seed=cfg.seed)
    return model.train(), Path(cfg.tokenizer)


def align_deepspeed_config(ds_config: dict, cfg: SFTConfig) -> None:
    """DeepSpeed accumulates and clips by its own config: make it say what ``cfg`` says.

    Left out of the accelerate config (or "auto"), the values are filled from ``cfg``; set there to something
    else, training stops here with a clear error instead of accelerate's warning and DeepSpeed's value (the
    loop would then draw ``cfg.grad_accum`` micro-batches per step while DeepSpeed steps at another count).
    """
    for key, ours, flag in (
        ("gradient_accumulation_steps", cfg.grad_accum, "--grad-accum"),
        ("gradient_clipping", cfg.grad_clip, "--grad-clip"),
    ):
        theirs = ds_config.get(key, "auto")
        if theirs in ("auto", None):
            ds_config[key] = ours
        elif float(theirs) != float(ours):
            raise ValueError(
                f"the DeepSpeed config sets {key} = {theirs} but dice train sft has {flag} {ours}: "
                f"leave {key} out of the accelerate config (it then follows {flag}) or pass the same value"
            )


# --------------------------------------------------------------------------------------------------------
# The recipe: setup, one training step, evaluate, save a checkpoint, export the final model


@dataclass
class TrainerState:
    """What ``trainer_state.json`` restores besides accelerate's state: the step (epoch and data position
    follow from it) and the curves so far."""

    step: int = 0
    epoch: int = 0
    history: list[dict] = field(default_factory=list)
    eval_history: list[dict] = field(default_factory=list)
    train_seconds: float = 0.0  # training time of the runs before this one (a resumed run adds its own)

    def to_json(self) -> str:
        state = {
            "step": self.step,
            "epoch": self.epoch,
            "history": self.history,
            "eval_history": self.eval_history,
            "train_seconds": self.train_seconds,
        }
        return json.dumps(state)

    @classmethod
    def read(cls, path: Path) -> TrainerState:
        state = json.loads(path.read_text())
        return cls(
            state["step"],
            state["epoch"],
            state.get("history", []),
            state.get("eval_history", []),
            float(state.get("train_seconds", 0.0)),
        )


class SFTRecipe:
    """``dice train sft`` in the phases :func:`main` calls in order: :meth:`setup`, :meth:`train`,
    :meth:`finish` (the shape of torchtune's recipes)."""

    def __init__(self, cfg: SFTConfig) -> None:
        self.cfg = cfg
        self.out = Path(cfg.out)
        self.state = TrainerState()
        self.tokens_seen = 0
        self.started = time.perf_counter()
        self.time_used = 0.0  # share of --max-minutes used, all processes agreeing (--lr-schedule time)

    # ---------------------------------------------------------------------------------------------- setup

    def setup(self) -> None:
        """Accelerator, model and tokenizer, data, objective, optimizer and schedule, prepare, resume."""
        self._setup_accelerator()
        self._setup_model()
        self._setup_data()
        self._setup_objective()
        self._setup_optimizer()
        # The scheduler stays outside prepare(): accelerate would step it once per process per step.
        self.objective, self.optimizer, self.loader = self.accelerator.prepare(
            self.objective, self.optimizer, self.loader
        )
        self.accelerator.register_for_checkpointing(self.scheduler)
        self._resume()

    def _setup_accelerator(self) -> None:
        from accelerate import Accelerator
        from accelerate.utils import GradientAccumulationPlugin, parse_flag_from_env, set_seed

        cfg = self.cfg
        self.cuda = cuda = torch.cuda.is_available()
        self.mixed = cfg.mixed_precision if cfg.mixed_precision != "auto" else ("bf16" if cuda else "no")
        # cpu=True without CUDA: under torchrun (accelerate launch) the processes then join over gloo.
        # Sync every grad_accum micro-batches only; not at the end of the loader, which accelerate sees one
        # batch early because we draw a whole step's micro-batches before the first backward.
        accum = GradientAccumulationPlugin(num_steps=cfg.grad_accum, sync_with_dataloader=False)
        if not cuda and parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
            # accelerate would quietly train without DeepSpeed (cpu=True) or, without it, count every process
            # as rank 0 of 1 while DeepSpeed sees all of them (checked with accelerate 1.15, DeepSpeed 0.19.8)
            raise RuntimeError(
                "a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED) needs CUDA GPUs; on CPU use "
                "training/configs/cpu_gloo.yaml (several processes over gloo) or no launcher"
            )
        self.accelerator = Accelerator(
            gradient_accumulation_plugin=accum, mixed_precision=self.mixed, cpu=not cuda
        )
        if self.accelerator.state.deepspeed_plugin is not None:
            align_deepspeed_config(self.accelerator.state.deepspeed_plugin.deepspeed_config, cfg)
        set_seed(cfg.seed)
        if self.accelerator.is_main_process:
            self.out.mkdir(parents=True, exist_ok=True)

    def _setup_model(self) -> None:
        from engine.tokenizer import load_tokenizer

        self.model, self.tokenizer_dir = build_model(self.cfg, self.accelerator.device)
        self.block_size = self.model.config.block_size
        mask_id = self.model.config.mask_token_id
        self.tokenizer = load_tokenizer(self.tokenizer_dir, mask_id=mask_id)
        self.mask_id = mask_id if mask_id is not None else self.tokenizer.mask_id
        self.model.gradient_checkpointing = self.cfg.gradient_checkpointing

    def _setup_data(self) -> None:
        cfg = self.cfg
        self.rows, self.data_stats = load_rows(cfg.data, self.tokenizer, cfg.seq_len, self.block_size)
        top, vocab = int(self.rows.input_ids.max()), self.model.config.vocab_size
        if top >= vocab:
            raise ValueError(f"{cfg.data}: token id {top} >= vocab_size {vocab}")
        self.eval_rows = None
        if cfg.eval_data:
            self.eval_rows, _ = load_rows(cfg.eval_data, self.tokenizer, cfg.seq_len, self.block_size)
        self.sampler = EpochPermutation(len(self.rows), cfg.seed)
        self.loader = torch.utils.data.DataLoader(
            RowDataset(self.rows), batch_size=cfg.micro_batch_size, sampler=self.sampler, drop_last=True
        )

    def _setup_objective(self) -> None:
        cfg = self.cfg
        self.attn_impl = cfg.attention if cfg.attention != "auto" else ("flex" if self.cuda else "dense")
        if cfg.compile == "yes" or (cfg.compile == "auto" and self.cuda):
            compile_layers(self.model)
        self.objective = BlockDiffusionLM(self.model)

    def _setup_optimizer(self) -> None:
        cfg = self.cfg
        fused = self.cuda and not self.accelerator.distributed_type.name.startswith("DEEPSPEED")
        self.optimizer = torch.optim.AdamW(
            self.objective.parameters(),
            lr=cfg.lr,
            betas=(0.9, cfg.adam_beta2),
            weight_decay=cfg.weight_decay,
            fused=fused or None,
        )
        self.world = world = self.accelerator.num_processes
        self.steps_per_epoch = len(self.rows) // (cfg.micro_batch_size * world * cfg.grad_accum)
        if self.steps_per_epoch == 0:
            raise ValueError(
                f"{len(self.rows)} rows are fewer than one global batch "
                f"({cfg.micro_batch_size} x {world} processes x {cfg.grad_accum} accumulation)"
            )
        self.total_steps = cfg.max_steps or max(1, int(self.steps_per_epoch * cfg.epochs))
        warmup = int(self.total_steps * cfg.warmup_ratio)
        by_time = (lambda: self.time_used) if cfg.lr_schedule == "time" else None
        self.scheduler = torch.optim.lr_scheduler.LambdaLR(
            self.optimizer, _lr_lambda(self.total_steps, warmup, cfg.min_lr_ratio, by_time, cfg.warmup_ratio)
        )

    def _resume(self) -> None:
        """accelerate restores weights, optimizer, scheduler and RNG; we restore step and data position."""
        cfg = self.cfg
        if not cfg.resume:
            return
        resume_dir = latest_checkpoint(self.out) if cfg.resume == "latest" else Path(cfg.resume)
        if resume_dir is None or not resume_dir.is_dir():
            raise FileNotFoundError(f"--resume {cfg.resume}: no checkpoint found")
        self.accelerator.load_state(str(resume_dir))
        self.state = TrainerState.read(resume_dir / "trainer_state.json")
        if cfg.max_minutes:
            self.time_used = self.state.train_seconds / (cfg.max_minutes * 60)

    # ------------------------------------------------------------------------------------------- training

    def train(self) -> None:
        """Steps until ``total_steps`` (or ``--max-minutes``), with logging, evaluation and checkpoints."""
        from rich.progress import (
            BarColumn,
            MofNCompleteColumn,
            Progress,
            TextColumn,
            TimeElapsedColumn,
            TimeRemainingColumn,
        )

        s = self.state
        progress = Progress(
            TextColumn("[bold]sft"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[info]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not self.accelerator.is_main_process,
        )
        self.accelerator.print(
            f"sft: {len(self.rows)} rows x {self.rows.input_ids.shape[1]} tokens, {self.world} process(es), "
            f"{self.total_steps} steps, attention={self.attn_impl}, precision={self.mixed}, "
            f"data={self.data_stats}"
        )
        if self.eval_rows is not None and s.step == 0:
            s.eval_history.append({"step": 0, **self.evaluate()})  # the starting point of the held-out curve
        self.started = time.perf_counter()
        self.tokens_seen = 0
        self._last_log = (time.perf_counter(), 0)
        stop = False
        self.objective.train()
        with progress:
            task = progress.add_task("sft", total=self.total_steps, completed=s.step, info="")
            while s.step < self.total_steps and not stop:
                stop = self._train_epoch(progress, task)

    def _train_epoch(self, progress: Any, task: Any) -> bool:
        """From the current step to the end of its epoch; True when ``--max-minutes`` stopped training."""
        s, cfg = self.state, self.cfg
        # Epoch and position follow from the step alone, so a resumed run reads exactly the same batches.
        s.epoch, position = divmod(s.step, self.steps_per_epoch)
        self.sampler.set_epoch(s.epoch)
        skip = position * cfg.grad_accum
        batches = iter(self.accelerator.skip_first_batches(self.loader, skip) if skip else self.loader)
        for _ in range(self.steps_per_epoch - position):
            if s.step >= self.total_steps:
                break
            step_loss, grad_norm = self.train_step([next(batches) for _ in range(cfg.grad_accum)])
            s.step += 1
            elapsed = time.perf_counter() - self.started
            self._log_step(step_loss, grad_norm, elapsed)
            progress.update(task, completed=s.step, info=f"loss {float(step_loss):.4f}")
            if self._after_step(elapsed):
                return True
        return False

    def train_step(self, micro: list[dict[str, Tensor]]) -> tuple[Tensor, Tensor | None]:
        """One optimizer step over ``grad_accum`` micro-batches: the step's loss (over all processes) and the
        gradient norm before clipping (None without ``--grad-clip``)."""
        cfg, acc = self.cfg, self.accelerator
        local_answer = sum(int(b["loss_mask"].sum()) for b in micro)
        # clamp: a step whose rows hold no answer token contributes a zero loss, not a NaN.
        global_answer = acc.reduce(
            torch.tensor(float(local_answer), device=acc.device), reduction="sum"
        ).clamp(min=1.0)
        step_loss = torch.zeros((), device=acc.device)
        grad_norm = None
        for b in micro:
            args = self._on_device(b, self.state.epoch)
            with acc.accumulate(self.objective):
                with acc.autocast():
                    loss_sum, _ = self.objective(*args)
                # accelerate divides by grad_accum and DDP/FSDP average over processes: undo both so the
                # update is the gradient of (global weighted CE sum / global answer tokens).
                loss = loss_sum / global_answer * self.world * cfg.grad_accum
                acc.backward(loss)
                grad_norm = None
                if acc.sync_gradients and cfg.grad_clip > 0:
                    grad_norm = acc.clip_grad_norm_(self.objective.parameters(), cfg.grad_clip)
                    if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor of partial norms
                        grad_norm = grad_norm.full_tensor()
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
            step_loss += loss_sum.detach() / global_answer
            self.tokens_seen += b["input_ids"].numel() * self.world
        self.scheduler.step()
        return acc.reduce(step_loss, reduction="sum"), grad_norm

    def _on_device(self, batch: dict[str, Tensor], epoch: int) -> tuple:
        """The objective's arguments for a batch: noise drawn on the CPU per row, then moved to the device."""
        noised = noise_rows(
            batch["input_ids"].cpu(),
            batch["loss_mask"].cpu(),
            batch["doc_ids"].cpu(),
            batch["row_index"].cpu(),
            mask_id=self.mask_id,
            eps=self.cfg.eps,
            seed=self.cfg.seed,
            epoch=epoch,
        )
        dev = self.accelerator.device
        mask = attention_mask_for(batch["doc_ids"].to(dev), self.block_size, self.attn_impl)
        return (
            noised.noisy_ids.to(dev),
            batch["input_ids"].to(dev),
            batch["position_ids"].to(dev),
            mask,
            noised.masked.to(dev),
            noised.p_mask.to(dev),
        )

    def _log_step(self, step_loss: Tensor, grad_norm: Tensor | None, elapsed: float) -> None:
        s = self.state
        if s.step % self.cfg.log_every == 0 or s.step == self.total_steps or s.step == 1:
            now = time.perf_counter()
            rate = (self.tokens_seen - self._last_log[1]) / max(1e-9, now - self._last_log[0])
            self._last_log = (now, self.tokens_seen)
            s.history.append(
                {
                    "step": s.step,
                    "epoch": s.epoch,
                    "loss": round(float(step_loss), 6),
                    "lr": self.scheduler.get_last_lr()[0],
                    "grad_norm": float(grad_norm) if grad_norm is not None else "",
                    "tokens": self.tokens_seen,
                    "tokens_per_s": round(rate, 1),
                    "elapsed_s": round(elapsed, 2),
                }
            )

    def _after_step(self, elapsed: float) -> bool:
        """Periodic evaluation and checkpoint; True when ``--max-minutes`` is reached on any process."""
        s, cfg, acc = self.state, self.cfg, self.accelerator
        if self.eval_rows is not None and cfg.eval_every and s.step % cfg.eval_every == 0:
            s.eval_history.append({"step": s.step, **self.evaluate()})
            acc.print(f"step {s.step}: {s.eval_history[-1]}")
        if cfg.save_every and s.step % cfg.save_every == 0:
            self.save_checkpoint()
            if acc.is_main_process:
                write_curves(self.out, s.history, s.eval_history)
        if cfg.max_minutes:
            # one all-reduce: this run's time (the stop) and the whole training's (the time schedule)
            times = torch.tensor([elapsed, s.train_seconds + elapsed], device=acc.device)
            run_s, total_s = (float(t) for t in acc.reduce(times, reduction="max"))
            self.time_used = total_s / (cfg.max_minutes * 60)
            if run_s > cfg.max_minutes * 60:
                acc.print(f"sft: stopping at step {s.step}: --max-minutes {cfg.max_minutes} reached")
                return True
        return False

    # ---------------------------------------------------------------------------------- evaluate and save

    @torch.no_grad()
    def evaluate(self, rows_wanted: int | None = None) -> dict[str, float]:
        """Loss and masked-token accuracy on the first ``rows_wanted`` (default ``--eval-rows``) held-out
        rows, shared out over the processes."""
        acc, eval_rows = self.accelerator, self.eval_rows
        self.objective.eval()
        n = min(len(eval_rows), self.cfg.eval_rows if rows_wanted is None else rows_wanted)
        dataset = RowDataset(eval_rows)
        totals = torch.zeros(3, device=acc.device)  # loss sum, correct, answer tokens
        for i in range(acc.process_index, n, self.world):
            batch = {k: v[None] for k, v in dataset[i].items()}
            # Fixed noise (epoch -1) so every evaluation sees the same masks.
            args = self._on_device(batch, -1)
            with acc.autocast():
                loss_sum, correct = self.objective(*args)
            totals += torch.stack([loss_sum.float(), correct.float(), args[4].sum().float()])
        totals = acc.reduce(totals, reduction="sum")
        self.objective.train()
        answer = max(1.0, float(eval_rows.loss_mask[:n].sum()))
        return {
            "rows": n,
            "eval_loss": float(totals[0]) / answer,
            "eval_masked_acc": float(totals[1] / totals[2].clamp(min=1)),
        }

    def save_checkpoint(self) -> Path:
        """accelerate's resumable state, the trainer state and the config in ``checkpoints/step_N``."""
        s, acc = self.state, self.accelerator
        path = self.out / "checkpoints" / f"step_{s.step}"
        acc.save_state(str(path))
        if acc.is_main_process:
            ran = time.perf_counter() - self.started
            so_far = dataclasses.replace(s, train_seconds=s.train_seconds + ran)
            (path / "trainer_state.json").write_text(so_far.to_json() + "\n")
            (path / "sft_config.json").write_text(json.dumps(dataclasses.asdict(self.cfg), indent=2) + "\n")
        acc.wait_for_everyone()
        return path

    def export_final(self) -> Path:
        """The trained model in the engine's format (``out/final``), with tokenizer, config and curve."""
        cfg, acc = self.cfg, self.accelerator
        final = self.out / "final"
        if export_engine_format(
            acc, self.objective, self.model.config, final, tokenizer_dir=self.tokenizer_dir,
            dtype=cfg.save_dtype, max_shard_mb=cfg.max_shard_mb,
        ):  # fmt: skip
            (final / "sft_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
            if (self.out / "loss_curve.png").is_file():
                shutil.copyfile(self.out / "loss_curve.png", final / "loss_curve.png")
        acc.wait_for_everyone()
        return final

    def finish(self) -> dict:
        """Final evaluation, curves, last checkpoint and export; the summary (also in ``summary.json``)."""
        s, cfg, acc = self.state, self.cfg, self.accelerator
        if self.eval_rows is not None:
            final_rows = cfg.final_eval_rows or cfg.eval_rows
            # Kept beside a periodic evaluation of the same step: the row counts differ (column "rows").
            s.eval_history.append({"step": s.step, **self.evaluate(final_rows)})
        if acc.is_main_process:
            write_curves(
                self.out, s.history, s.eval_history
            )  # before the (long) saves: a failed save keeps them
        ckpt = self.save_checkpoint() if cfg.save_state else None
        final = self.export_final()
        summary = {
            "steps": s.step,
            "final_loss": s.history[-1]["loss"] if s.history else None,
            "eval": s.eval_history[-1] if s.eval_history else None,
            "checkpoint": str(ckpt) if ckpt is not None else None,
            "final": str(final),
            "elapsed_s": round(time.perf_counter() - self.started, 2),
            "tokens": self.tokens_seen,
            "processes": self.world,
        }
        if acc.is_main_process:
            (self.out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        acc.end_training()
        return summary


def main(cfg: SFTConfig) -> dict:
    """Train; return a summary (steps, final loss, eval metrics, output paths)."""
    for key, value in NCCL_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    cfg.validate()
    recipe = SFTRecipe(cfg)
    recipe.setup()
    recipe.train()
    return recipe.finish()


def parse_args(argv: list[str] | None = None) -> SFTConfig:
    parser = argparse.ArgumentParser(prog="python -m training.sft", description=__doc__.splitlines()[0])
    SFTConfig.add_arguments(parser)
    return SFTConfig.from_args(parser.parse_args(argv))


if __name__ == "__main__":
    print(json.dumps(main(parse_args()), indent=2))
