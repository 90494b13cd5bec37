"""Block-diffusion SFT (``dice train sft``): the SDAR objective over packed ChatML examples, with accelerate.

One optimizer step = ``micro_batch_size x grad_accum x processes`` packed rows. Each row (T tokens, several
documents) is noised per document (``training.losses.add_noise``), laid out as ``[noisy | clean]`` (2T
tokens, position ids duplicated) under the block-diffusion mask (``training.masks``), and the 1/t-weighted
cross-entropy of the masked tokens is divided by the number of answer tokens of the whole global step, so
any split of the same rows over processes and accumulation steps gives the same loss and update.

Noise is drawn from a generator seeded by (seed, epoch, row index): the same rows get the same noise on any
number of processes and after a resume. Launch with ``accelerate launch`` and a config from
``training/configs/`` for several GPUs or nodes; the plain command runs on one device.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from training.config import NCCL_SAFE_ENV, SFTConfig
from training.losses import add_noise, weighted_masked_ce_sum
from training.masks import build_block_mask, dense_mask

# --------------------------------------------------------------------------------------------------------
# The objective as one module, so DDP / FSDP / DeepSpeed wrap a single forward


class BlockDiffusionLM(nn.Module):
    """Wraps a ``DiceModel``; ``forward`` returns the summed 1/t-weighted CE of the masked tokens.

    The lm_head runs on the masked positions of the noisy half only (SDAR's ``logits_to_keep``), so the
    clean copy costs no vocabulary projection and the logits of unmasked tokens are never formed.
    """

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def hidden_states(self, input_ids: Tensor, position_ids: Tensor, mask: Any) -> Tensor:
        from engine.model import rope_cos_sin

        inner = self.model
        x = inner.model.embed_tokens(input_ids)
        cos, sin = rope_cos_sin(position_ids, inner.config.head_dim, inner.config.rope_theta, x.dtype)
        for layer in inner.model.layers:
            if inner.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = torch.utils.checkpoint.checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        return x

    def forward(
        self,
        noisy_ids: Tensor,
        clean_ids: Tensor,
        position_ids: Tensor,
        mask: Any,
        masked: Tensor,
        p_mask: Tensor,
    ) -> tuple[Tensor, Tensor]:
        """(B, T) inputs -> (weighted CE sum, number of correct argmax predictions) over masked tokens."""
        seq_len = clean_ids.shape[1]
        ids = torch.cat([noisy_ids, clean_ids], dim=1)  # (B, 2T)
        pos = torch.cat([position_ids, position_ids], dim=1)
        h = self.hidden_states(ids, pos, mask)[:, :seq_len]  # (B, T, D): the noisy copy
        h = self.model.model.norm(h[masked])  # (N, D)
        logits = self.model.lm_head(h)  # (N, V)
        targets = clean_ids[masked]
        loss_sum = weighted_masked_ce_sum(logits, targets, p_mask[masked])
        correct = (logits.detach().argmax(-1) == targets).sum()
        return loss_sum, correct


def noise_rows(
    input_ids: Tensor,
    loss_mask: Tensor,
    doc_ids: Tensor,
    row_index: Tensor,
    *,
    mask_id: int,
    eps: float,
    seed: int,
    epoch: int,
):
    """Noise each row with its own generator seeded by (seed, epoch, row): independent of batching."""
    from training.losses import Noised

    parts = []
    for i in range(input_ids.shape[0]):
        gen = torch.Generator().manual_seed(_row_seed(seed, epoch, int(row_index[i])))
        parts.append(
            add_noise(
                input_ids[i : i + 1],
                loss_mask[i : i + 1],
                doc_ids[i : i + 1],
                mask_id,
                eps=eps,
                generator=gen,
            )
        )
    return Noised(
        noisy_ids=torch.cat([p.noisy_ids for p in parts]),
        masked=torch.cat([p.masked for p in parts]),
        p_mask=torch.cat([p.p_mask for p in parts]),
    )


def _row_seed(seed: int, epoch: int, row: int) -> int:
    return (seed * 1_000_003 + epoch * 7_919 + row) % (2**62)


def attention_mask_for(doc_ids: Tensor, block_size: int, impl: str) -> Any:
    """The [noisy | clean] mask for a batch: a flex BlockMask, or a dense (B, 1, 2T, 2T) bool mask."""
    if impl == "flex":
        return build_block_mask(doc_ids, block_size)
    return dense_mask(doc_ids, block_size)


def compile_layers(model: nn.Module) -> None:
    """Compile each decoder layer in place (state-dict keys unchanged); flex_attention is fused inside."""
    for layer in model.model.layers:
        layer.compile()


# --------------------------------------------------------------------------------------------------------
# Data


class EpochPermutation(torch.utils.data.Sampler):
    """A fresh permutation per epoch from (seed, epoch) alone: the same order on any process count and
    after a resume (accelerate shards the batches of this one order over processes)."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.n

    def __iter__(self):
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        return iter(torch.randperm(self.n, generator=gen).tolist())


class RowDataset(torch.utils.data.Dataset):
    def __init__(self, rows) -> None:
        self.rows = rows

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        r = self.rows
        return {
            "input_ids": r.input_ids[i],
            "position_ids": r.position_ids[i],
            "doc_ids": r.doc_ids[i],
            "loss_mask": r.loss_mask[i],
            "row_index": torch.tensor(i),
        }


def load_rows(path: str, tokenizer, seq_len: int, block_size: int):
    """Packed rows from a .safetensors file, or tokenised and packed from a .jsonl of examples."""
    from training.data import PackedRows, read_examples, tokenize_and_pack

    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"{p}: data file not found")
    if p.suffix in (".safetensors", ".npz"):
        rows = PackedRows.load(p)
        stats = {"rows": len(rows), "answer_tokens": int(rows.loss_mask.sum())}
    else:
        rows, stats = tokenize_and_pack(read_examples(p), tokenizer, seq_len=seq_len, block_size=block_size)
    if len(rows) == 0:
        raise ValueError(f"{p}: no rows (every example longer than --seq-len {seq_len}?)")
    if rows.input_ids.shape[1] % block_size:
        raise ValueError(
            f"{p}: row length {rows.input_ids.shape[1]} is not a multiple of block size {block_size}"
        )
    return rows, stats


# --------------------------------------------------------------------------------------------------------
# Curves


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


# --------------------------------------------------------------------------------------------------------
# Main


def _lr_lambda(total: int, warmup: int, floor: float):
    def f(step: int) -> float:
        if warmup and step < warmup:
            return (step + 1) / warmup
        progress = min(1.0, (step - warmup) / max(1, total - warmup))
        return floor + (1.0 - floor) * 0.5 * (1.0 + math.cos(math.pi * progress))

    return f


def _latest_checkpoint(out: Path) -> Path | None:
    ckpts = sorted((out / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return ckpts[-1] if ckpts else None


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


def main(cfg: SFTConfig) -> dict:
    """Train; return a summary (steps, final loss, eval metrics, output paths)."""
    for key, value in NCCL_SAFE_ENV.items():
        os.environ.setdefault(key, value)
    cfg.validate()
    from accelerate import Accelerator
    from accelerate.utils import GradientAccumulationPlugin, parse_flag_from_env, set_seed

    from engine.checkpoint import save_model
    from engine.tokenizer import load_tokenizer

    cuda = torch.cuda.is_available()
    mixed = cfg.mixed_precision if cfg.mixed_precision != "auto" else ("bf16" if cuda else "no")
    # cpu=True without CUDA: under torchrun (accelerate launch) the processes then join over gloo.
    # Sync every grad_accum micro-batches only; not at the end of the loader, which accelerate sees one batch
    # early because we draw a whole step's micro-batches before the first backward.
    accum = GradientAccumulationPlugin(num_steps=cfg.grad_accum, sync_with_dataloader=False)
    if not cuda and parse_flag_from_env("ACCELERATE_USE_DEEPSPEED"):
        # accelerate would quietly train without DeepSpeed (cpu=True) or, without it, count every process
        # as rank 0 of 1 while DeepSpeed sees all of them (checked with accelerate 1.15, DeepSpeed 0.19.8)
        raise RuntimeError(
            "a DeepSpeed launch (ACCELERATE_USE_DEEPSPEED) needs CUDA GPUs; on CPU use "
            "training/configs/cpu_gloo.yaml (several processes over gloo) or no launcher"
        )
    accelerator = Accelerator(gradient_accumulation_plugin=accum, mixed_precision=mixed, cpu=not cuda)
    if accelerator.state.deepspeed_plugin is not None:
        align_deepspeed_config(accelerator.state.deepspeed_plugin.deepspeed_config, cfg)
    set_seed(cfg.seed)
    out = Path(cfg.out)
    if accelerator.is_main_process:
        out.mkdir(parents=True, exist_ok=True)

    model, tokenizer_dir = build_model(cfg, accelerator.device)
    block_size = model.config.block_size
    mask_id = model.config.mask_token_id
    tokenizer = load_tokenizer(tokenizer_dir, mask_id=mask_id)
    if mask_id is None:
        mask_id = tokenizer.mask_id
    model.gradient_checkpointing = cfg.gradient_checkpointing

    rows, data_stats = load_rows(cfg.data, tokenizer, cfg.seq_len, block_size)
    if int(rows.input_ids.max()) >= model.config.vocab_size:
        raise ValueError(
            f"{cfg.data}: token id {int(rows.input_ids.max())} >= vocab_size {model.config.vocab_size}"
        )
    eval_rows = None
    if cfg.eval_data:
        eval_rows, _ = load_rows(cfg.eval_data, tokenizer, cfg.seq_len, block_size)
    attn_impl = cfg.attention if cfg.attention != "auto" else ("flex" if cuda else "dense")
    if cfg.compile == "yes" or (cfg.compile == "auto" and cuda):
        compile_layers(model)

    objective = BlockDiffusionLM(model)
    sampler = EpochPermutation(len(rows), cfg.seed)
    loader = torch.utils.data.DataLoader(
        RowDataset(rows), batch_size=cfg.micro_batch_size, sampler=sampler, drop_last=True
    )
    fused = cuda and not accelerator.distributed_type.name.startswith("DEEPSPEED")
    optimizer = torch.optim.AdamW(
        objective.parameters(),
        lr=cfg.lr,
        betas=(0.9, cfg.adam_beta2),
        weight_decay=cfg.weight_decay,
        fused=fused or None,
    )
    world = accelerator.num_processes
    steps_per_epoch = len(rows) // (cfg.micro_batch_size * world * cfg.grad_accum)
    if steps_per_epoch == 0:
        raise ValueError(
            f"{len(rows)} rows are fewer than one global batch "
            f"({cfg.micro_batch_size} x {world} processes x {cfg.grad_accum} accumulation)"
        )
    total_steps = cfg.max_steps or max(1, int(steps_per_epoch * cfg.epochs))
    warmup = int(total_steps * cfg.warmup_ratio)
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _lr_lambda(total_steps, warmup, cfg.min_lr_ratio)
    )
    # The scheduler stays outside prepare(): accelerate would step it once per process per step.
    objective, optimizer, loader = accelerator.prepare(objective, optimizer, loader)
    accelerator.register_for_checkpointing(scheduler)

    # Resume: accelerate restores weights, optimizer, scheduler and RNG; we restore step and data position.
    step, epoch, history, eval_history = 0, 0, [], []
    resume_dir = None
    if cfg.resume:
        resume_dir = _latest_checkpoint(out) if cfg.resume == "latest" else Path(cfg.resume)
        if resume_dir is None or not resume_dir.is_dir():
            raise FileNotFoundError(f"--resume {cfg.resume}: no checkpoint found")
        accelerator.load_state(str(resume_dir))
        state = json.loads((resume_dir / "trainer_state.json").read_text())
        step, epoch = state["step"], state["epoch"]
        history, eval_history = state.get("history", []), state.get("eval_history", [])

    def save_checkpoint() -> Path:
        path = out / "checkpoints" / f"step_{step}"
        accelerator.save_state(str(path))
        if accelerator.is_main_process:
            state = {"step": step, "epoch": epoch, "history": history, "eval_history": eval_history}
            (path / "trainer_state.json").write_text(json.dumps(state) + "\n")
            (path / "sft_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        accelerator.wait_for_everyone()
        return path

    def batch_on_device(batch: dict[str, Tensor], ep: int):
        noised = noise_rows(
            batch["input_ids"].cpu(),
            batch["loss_mask"].cpu(),
            batch["doc_ids"].cpu(),
            batch["row_index"].cpu(),
            mask_id=mask_id,
            eps=cfg.eps,
            seed=cfg.seed,
            epoch=ep,
        )
        dev = accelerator.device
        mask = attention_mask_for(batch["doc_ids"].to(dev), block_size, attn_impl)
        return (
            noised.noisy_ids.to(dev),
            batch["input_ids"].to(dev),
            batch["position_ids"].to(dev),
            mask,
            noised.masked.to(dev),
            noised.p_mask.to(dev),
        )

    @torch.no_grad()
    def evaluate(rows_wanted: int = cfg.eval_rows) -> dict[str, float]:
        objective.eval()
        n = min(len(eval_rows), rows_wanted)
        mine = list(range(accelerator.process_index, n, world))
        totals = torch.zeros(3, device=accelerator.device)  # loss sum, correct, answer tokens
        for i in mine:
            item = RowDataset(eval_rows)[i]
            batch = {k: v[None] for k, v in item.items()}
            # Fixed noise (epoch -1) so every evaluation sees the same masks.
            args = batch_on_device(batch, -1)
            with accelerator.autocast():
                loss_sum, correct = objective(*args)
            totals += torch.stack([loss_sum.float(), correct.float(), args[4].sum().float()])
        totals = accelerator.reduce(totals, reduction="sum")
        objective.train()
        answer = max(1.0, float(eval_rows.loss_mask[:n].sum()))
        return {
            "rows": n,
            "eval_loss": float(totals[0]) / answer,
            "eval_masked_acc": float(totals[1] / totals[2].clamp(min=1)),
        }

    from rich.progress import (
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
        TimeRemainingColumn,
    )

    progress = Progress(
        TextColumn("[bold]sft"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[info]}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        disable=not accelerator.is_main_process,
    )
    accelerator.print(
        f"sft: {len(rows)} rows x {rows.input_ids.shape[1]} tokens, {world} process(es), "
        f"{total_steps} steps, attention={attn_impl}, precision={mixed}, data={data_stats}"
    )
    if eval_rows is not None and step == 0:
        eval_history.append({"step": 0, **evaluate()})  # the starting point of the held-out curve
    started = time.perf_counter()
    tokens_seen = 0
    last_log = (time.perf_counter(), 0)
    stop = False
    objective.train()
    with progress:
        task = progress.add_task("sft", total=total_steps, completed=step, info="")
        while step < total_steps and not stop:
            # Epoch and position follow from the step alone, so a resumed run reads exactly the same batches.
            epoch, position = divmod(step, steps_per_epoch)
            sampler.set_epoch(epoch)
            skip = position * cfg.grad_accum
            batches = iter(accelerator.skip_first_batches(loader, skip) if skip else loader)
            for _ in range(steps_per_epoch - position):
                if step >= total_steps:
                    break
                micro = [next(batches) for _ in range(cfg.grad_accum)]
                local_answer = sum(int(b["loss_mask"].sum()) for b in micro)
                # clamp: a step whose rows hold no answer token contributes a zero loss, not a NaN.
                global_answer = accelerator.reduce(
                    torch.tensor(float(local_answer), device=accelerator.device), reduction="sum"
                ).clamp(min=1.0)
                step_loss = torch.zeros((), device=accelerator.device)
                for b in micro:
                    args = batch_on_device(b, epoch)
                    with accelerator.accumulate(objective):
                        with accelerator.autocast():
                            loss_sum, _ = objective(*args)
                        # accelerate divides by grad_accum and DDP/FSDP average over processes: undo both so
                        # the update is the gradient of (global weighted CE sum / global answer tokens).
                        loss = loss_sum / global_answer * world * cfg.grad_accum
                        accelerator.backward(loss)
                        grad_norm = None
                        if accelerator.sync_gradients and cfg.grad_clip > 0:
                            grad_norm = accelerator.clip_grad_norm_(objective.parameters(), cfg.grad_clip)
                            if hasattr(grad_norm, "full_tensor"):  # FSDP2: a DTensor of partial norms
                                grad_norm = grad_norm.full_tensor()
                        optimizer.step()
                        optimizer.zero_grad(set_to_none=True)
                    step_loss += loss_sum.detach() / global_answer
                    tokens_seen += b["input_ids"].numel() * world
                scheduler.step()
                step_loss = accelerator.reduce(step_loss, reduction="sum")
                step += 1
                elapsed = time.perf_counter() - started
                if step % cfg.log_every == 0 or step == total_steps or step == 1:
                    now = time.perf_counter()
                    rate = (tokens_seen - last_log[1]) / max(1e-9, now - last_log[0])
                    last_log = (now, tokens_seen)
                    history.append(
                        {
                            "step": step,
                            "epoch": epoch,
                            "loss": round(float(step_loss), 6),
                            "lr": scheduler.get_last_lr()[0],
                            "grad_norm": float(grad_norm) if grad_norm is not None else "",
                            "tokens": tokens_seen,
                            "tokens_per_s": round(rate, 1),
                            "elapsed_s": round(elapsed, 2),
                        }
                    )
                progress.update(task, completed=step, info=f"loss {float(step_loss):.4f}")
                if eval_rows is not None and cfg.eval_every and step % cfg.eval_every == 0:
                    eval_history.append({"step": step, **evaluate()})
                    accelerator.print(f"step {step}: {eval_history[-1]}")
                if cfg.save_every and step % cfg.save_every == 0:
                    save_checkpoint()
                    if accelerator.is_main_process:
                        write_curves(out, history, eval_history)
                if cfg.max_minutes:
                    over = torch.tensor(float(elapsed > cfg.max_minutes * 60), device=accelerator.device)
                    if float(accelerator.reduce(over, reduction="max")) > 0:
                        accelerator.print(
                            f"sft: stopping at step {step}: --max-minutes {cfg.max_minutes} reached"
                        )
                        stop = True
                        break

    if eval_rows is not None:
        final_rows = cfg.final_eval_rows or cfg.eval_rows
        # Kept beside a periodic evaluation of the same step: the row counts differ (column "rows").
        eval_history.append({"step": step, **evaluate(final_rows)})
    if accelerator.is_main_process:
        write_curves(out, history, eval_history)  # before the (long) saves: a failed save keeps the curves
    ckpt = save_checkpoint() if cfg.save_state else None
    final = out / "final"
    state_dict = accelerator.get_state_dict(objective)
    if accelerator.is_main_process:
        from engine.model import DiceModel

        with torch.device("meta"):  # no default init: every tensor comes from the state dict
            export = DiceModel(model.config)
        export.load_state_dict(
            {k.removeprefix("model."): v for k, v in state_dict.items()}, strict=True, assign=True
        )
        if model.config.tie_word_embeddings:
            export.tie_weights()
        save_model(
            export,
            final,
            tokenizer_dir=tokenizer_dir,
            dtype=cfg.save_dtype,
            max_shard_bytes=cfg.max_shard_mb * 2**20 if cfg.max_shard_mb else None,
        )
        (final / "sft_config.json").write_text(json.dumps(dataclasses.asdict(cfg), indent=2) + "\n")
        if (out / "loss_curve.png").is_file():
            shutil.copyfile(out / "loss_curve.png", final / "loss_curve.png")
    accelerator.wait_for_everyone()
    summary = {
        "steps": step,
        "final_loss": history[-1]["loss"] if history else None,
        "eval": eval_history[-1] if eval_history else None,
        "checkpoint": str(ckpt) if ckpt is not None else None,
        "final": str(final),
        "elapsed_s": round(time.perf_counter() - started, 2),
        "tokens": tokens_seen,
        "processes": world,
    }
    if accelerator.is_main_process:
        (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    accelerator.end_training()
    return summary


def parse_args(argv: list[str] | None = None) -> SFTConfig:
    parser = argparse.ArgumentParser(prog="python -m training.sft", description=__doc__.splitlines()[0])
    SFTConfig.add_arguments(parser)
    return SFTConfig.from_args(parser.parse_args(argv))


if __name__ == "__main__":
    print(json.dumps(main(parse_args()), indent=2))
