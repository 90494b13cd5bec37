"""The TraceRL update of one RL step across processes (``dice train rl``'s optimizer side).

One epoch over the step's kept samples: ``--mini-batches`` optimizer steps, each accumulating micro-batches
of ``--micro-batch-size`` samples (their trace batches, :func:`training.rl.trace.build_trace_batch`). The old
log-probs of every micro-batch (and the frozen reference's, with ``--kl-mode ref``) are computed first, under
no grad, before any weight moves. The loss of a micro-batch is :func:`training.rl.trace.trace_loss` with the
*global* sample count of its mini-batch, times the number of processes (DDP / FSDP / DeepSpeed average the
gradients), so any split of the same samples over processes and micro-batches gives the same update.

Collectives: every process makes the same calls in the same order whatever its own share held. The counts
of the step (kept groups; samples and micro-batches per mini-batch) are all-reduced first; when no process
kept a group the step is skipped on all of them, before any forward. A process with fewer micro-batches
than another runs zero-weight dummy micro-batches (one tiny sample: the same forward, the same gradient
reduction, no effect), so FSDP's all-gathers and DDP's all-reduces pair up and nothing deadlocks.
"""

from __future__ import annotations

import contextlib
import math
from typing import Any

import torch
from torch import Tensor, nn


class PolicyLogps(nn.Module):
    """The one module the launchers wrap: ``forward`` gives the token log-probs of a trace batch
    (``training.rl.trace.token_logps``), so DDP / FSDP / DeepSpeed see every forward go through it. Its
    state dict is the model's with a ``model.`` prefix (as ``training.objective.BlockDiffusionLM``)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, input_ids: Tensor, position_ids: Tensor, mask: Any, rows: Tensor, cols: Tensor, targets: Tensor
    ) -> Tensor:
        from types import SimpleNamespace

        from training.rl.trace import token_logps

        batch = SimpleNamespace(
            input_ids=input_ids,
            position_ids=position_ids,
            mask=mask,
            loss_rows=rows,
            loss_cols=cols,
            targets=targets,
        )
        return token_logps(self.model, batch)


def batch_args(batch: Any) -> tuple:
    """:class:`PolicyLogps`'s arguments for a ``TraceBatch``."""
    return (batch.input_ids, batch.position_ids, batch.mask, batch.loss_rows, batch.loss_cols, batch.targets)


class TraceUpdater:
    """The update of one step: :meth:`update` (module docstring). ``policy`` and ``optimizer`` are the
    prepared ones; ``ref_model`` the frozen reference (``--kl-mode ref``) or None."""

    def __init__(
        self,
        cfg: Any,
        accelerator: Any,
        policy: nn.Module,
        optimizer: Any,
        *,
        block_size: int,
        mask_id: int,
        pad_id: int,
        attn_impl: str,
        ref_model: nn.Module | None = None,
        deepspeed: bool = False,
    ) -> None:
        self.cfg = cfg
        self.acc = accelerator
        self.policy = policy
        self.optimizer = optimizer
        self.block_size = block_size
        self.mask_id = mask_id
        self.pad_id = pad_id
        self.attn_impl = attn_impl
        self.ref_model = ref_model
        self.deepspeed = deepspeed
        self.world = accelerator.num_processes
        self._dummy = None

    def update(self, groups: list, advantages: list) -> dict:
        """One epoch over the samples of the kept groups (``advantages[i]`` None: dropped). Returns
        ``skipped`` (no process kept a group: nothing ran), the loss summed over mini-batches, the KL and
        clipped-token sums (token-weighted) and trained tokens of this process, and the last grad norm."""
        from training.rl.trace import TraceSample

        cfg, acc = self.cfg, self.acc
        samples = [
            TraceSample(list(r.prompt_ids), list(r.response_ids), list(r.step_map), float(a))
            for group, adv in zip(groups, advantages, strict=True)
            if adv is not None
            for r, a in zip(group, adv, strict=True)
        ]
        m = cfg.mini_batches
        minis = [samples[i * len(samples) // m : (i + 1) * len(samples) // m] for i in range(m)]
        kept_groups = sum(a is not None for a in advantages)
        counts = torch.tensor([float(kept_groups)] + [float(len(x)) for x in minis], device=acc.device)
        micro = [math.ceil(sum(bool(s.response_ids) for s in x) / cfg.micro_batch_size) for x in minis]
        counts = acc.reduce(counts, reduction="sum").tolist()
        micro = acc.reduce(torch.tensor(micro, device=acc.device), reduction="max").tolist()
        result = {"skipped": counts[0] == 0, "loss": 0.0, "kl_sum": 0.0, "clip_sum": 0.0, "tokens": 0.0}
        result["grad_norm"] = None
        if result["skipped"]:
            return result
        batches = [self._micro_batches(x, int(k)) for x, k in zip(minis, micro, strict=True)]
        with torch.no_grad(), acc.autocast():
            old = [[self._logps(self.policy, b) for b in mb] for mb in batches]
            ref = None
            if cfg.kl_mode == "ref":
                ref = [[self._logps(self.ref_model, b, frozen=True) for b in mb] for mb in batches]
        for i, mb in enumerate(batches):
            if counts[1 + i] == 0:
                continue  # no process has a sample in this mini-batch: no step (on every process alike)
            refs = None if ref is None else ref[i]
            result["grad_norm"] = self._mini_batch_step(mb, old[i], refs, int(counts[1 + i]), result)
        return result

    def _mini_batch_step(
        self, mb: list, old: list, ref: list | None, global_samples: int, result: dict
    ) -> float | None:
        """Accumulate the micro-batches of one mini-batch, then one optimizer step; the gradient norm."""
        from training.rl.trace import trace_loss

        cfg, acc = self.cfg, self.acc
        for k, batch in enumerate(mb):
            with self._sync_context(k == len(mb) - 1), acc.autocast():
                new = self._logps(self.policy, batch)
                if batch is None:  # a dummy: the same forward and gradient reduction, zero weight
                    loss = new.sum() * 0.0
                else:
                    loss, stats = trace_loss(
                        new,
                        old[k],
                        batch.advantages,
                        ref_logp=None if ref is None else ref[k],
                        clip_eps=cfg.clip_eps,
                        kl_beta=cfg.kl_beta,
                        kl_mode=cfg.kl_mode,
                        norm=cfg.loss_norm,
                        fixed_len=cfg.max_new_tokens,
                        sample_index=batch.sample_index,
                        response_lens=batch.response_lens,
                        num_samples=global_samples,
                    )
                    result["loss"] += stats["loss"]
                    result["kl_sum"] += stats["kl"] * stats["tokens"]
                    result["clip_sum"] += stats["clip_frac"] * stats["tokens"]
                    result["tokens"] += stats["tokens"]
                # DDP / FSDP / DeepSpeed average the gradients over processes: undo it, so the update is the
                # gradient of the loss summed over every process's samples / the global sample count.
                acc.backward(loss * self.world)
        norm = None
        if cfg.grad_clip > 0 and not self.deepspeed:  # DeepSpeed clips by its config (gradient_clipping)
            norm = acc.clip_grad_norm_(self.policy.parameters(), cfg.grad_clip)
            norm = float(norm.full_tensor() if hasattr(norm, "full_tensor") else norm)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return norm

    def _sync_context(self, last: bool):
        """Gradients are reduced over processes on the last micro-batch of a mini-batch only."""
        if self.deepspeed:  # DeepSpeed steps inside backward at the boundary accelerate tells it
            self.acc.gradient_state._set_sync_gradients(last)
            return contextlib.nullcontext()
        return contextlib.nullcontext() if last else self.acc.no_sync(self.policy)

    def _micro_batches(self, samples: list, count: int) -> list:
        """``count`` trace batches of ``--micro-batch-size`` samples with a response (None: a dummy)."""
        from training.rl.trace import build_trace_batch

        size = self.cfg.micro_batch_size
        usable = [s for s in samples if s.response_ids]
        parts = [usable[k * size : (k + 1) * size] for k in range(count)]
        return [
            self._build(part, shrink=self.cfg.shrink, packed=self.cfg.packed, fn=build_trace_batch)
            if part
            else None
            for part in parts
        ]

    def _build(self, samples: list, *, shrink: int, packed: bool, fn: Any) -> Any:
        return fn(
            samples,
            block_size=self.block_size,
            mask_id=self.mask_id,
            pad_id=self.pad_id,
            shrink=shrink,
            packed=packed,
            mask_impl=self.attn_impl,
            device=self.acc.device,
        )

    def _dummy_batch(self) -> Any:
        """One sample of one response token after one block of padding, advantage 0."""
        from training.rl.trace import TraceSample, build_trace_batch

        if self._dummy is None:
            sample = TraceSample([self.pad_id] * self.block_size, [self.pad_id], [1], 0.0)
            self._dummy = self._build([sample], shrink=1, packed=False, fn=build_trace_batch)
        return self._dummy

    def _logps(self, module: nn.Module, batch: Any, *, frozen: bool = False) -> Tensor:
        from training.rl.trace import token_logps

        batch = self._dummy_batch() if batch is None else batch
        if frozen:  # the reference model: a plain module, not wrapped by the launcher
            return token_logps(module, batch)
        return module(*batch_args(batch))


def full_parameters(model: nn.Module, deepspeed: bool):
    """(name, full tensor) of every parameter of ``model``, gathered where sharded (FSDP2 DTensors,
    DeepSpeed ZeRO-3), one parameter at a time, in the same order on every process."""
    for name, p in model.named_parameters():
        name = name.replace("_fsdp_wrapped_module.", "").replace("_checkpoint_wrapped_module.", "")
        if hasattr(p, "full_tensor"):  # FSDP2
            yield name, p.full_tensor()
        elif deepspeed and hasattr(p, "ds_id"):  # ZeRO-3
            import deepspeed as ds

            with ds.zero.GatheredParameters([p], modifier_rank=None):
                yield name, p.data
        else:
            yield name, p.data


def align_deepspeed(ds_config: dict, cfg: Any, world: int) -> None:
    """DeepSpeed accumulates and clips by its own config. The RL loop decides itself where a mini-batch
    ends (its micro-batch count varies by step) and tells DeepSpeed at each backward, so DeepSpeed's
    accumulation is 1; clipping follows ``--grad-clip``, the micro-batch size ``--micro-batch-size``. A value
    set otherwise in the accelerate config is an error, not a silent override."""
    for key, ours in (
        ("gradient_accumulation_steps", 1),
        ("gradient_clipping", cfg.grad_clip),
        ("train_micro_batch_size_per_gpu", cfg.micro_batch_size),
        ("train_batch_size", cfg.micro_batch_size * world),
    ):
        theirs = ds_config.get(key, "auto")
        if theirs in ("auto", None):
            ds_config[key] = ours
        elif key in ("gradient_accumulation_steps", "gradient_clipping") and float(theirs) != float(ours):
            raise ValueError(
                f"the DeepSpeed config sets {key} = {theirs} but dice train rl needs {ours}: leave {key} "
                "out of the accelerate config"
            )
