"""The configuration of ``dice train sft``: a dataclass whose fields are the ``--kebab-case`` flags.

Kept free of torch imports so that building the ``dice`` parser stays fast.
"""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from typing import TypeVar

# NVLink multicast must stay off on the shared multi-GPU hosts (device README): set before NCCL starts.
NCCL_SAFE_ENV = {
    "NCCL_NVLS_ENABLE": "0",
    "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
    "NVSHMEM_DISABLE_NVLS": "1",
}


_C = TypeVar("_C", bound="CliConfig")


class CliConfig:
    """A config dataclass that is also a command's flags: one ``--kebab-case`` option per field
    (:func:`add_dataclass_arguments`), and the config back from the parsed namespace."""

    @classmethod
    def add_arguments(cls, parser: argparse.ArgumentParser) -> None:
        add_dataclass_arguments(cls, parser)

    @classmethod
    def from_args(cls: type[_C], args: argparse.Namespace) -> _C:
        return cls(**{f.name: getattr(args, f.name) for f in dataclasses.fields(cls)})  # type: ignore[arg-type]


@dataclass
class SFTConfig(CliConfig):
    """Every flag of ``dice train sft`` (``--kebab-case``), saved with every checkpoint."""

    data: str = field(
        metadata={
            "help": "examples: .jsonl(.gz) of training.corpus.Example, or packed rows (.npz / .safetensors)"
        }
    )
    out: str = field(
        default="runs/sft", metadata={"help": "output folder (checkpoints, final model, curves)"}
    )
    model: str | None = field(
        default=None, metadata={"help": "checkpoint folder to start from (engine format)"}
    )
    init_config: str | None = field(
        default=None, metadata={"help": "config.json for a randomly initialised model (instead of --model)"}
    )
    tokenizer: str | None = field(
        default=None, metadata={"help": "tokenizer folder (default: the --model folder)"}
    )
    eval_data: str | None = field(
        default=None, metadata={"help": "held-out examples (.jsonl or packed rows) for eval loss/accuracy"}
    )
    seq_len: int = field(
        default=4096, metadata={"help": "packed row length in tokens (the model sees 2x: noisy | clean)"}
    )
    micro_batch_size: int = field(default=1, metadata={"help": "rows per process per forward"})
    grad_accum: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    lr: float = field(default=1e-5, metadata={"help": "peak learning rate (DICE SFT: 1e-5)"})
    min_lr_ratio: float = field(
        default=0.1, metadata={"help": "cosine decay floor as a fraction of --lr (1.0 = constant)"}
    )
    warmup_ratio: float = field(default=0.03, metadata={"help": "linear warm-up, fraction of the steps"})
    weight_decay: float = field(default=0.0, metadata={"help": "AdamW weight decay"})
    adam_beta2: float = field(default=0.95, metadata={"help": "AdamW beta2"})
    grad_clip: float = field(default=1.0, metadata={"help": "max gradient norm (0 = off)"})
    epochs: float = field(default=1.0, metadata={"help": "passes over the data (ignored with --max-steps)"})
    max_steps: int = field(default=0, metadata={"help": "optimizer steps (0 = from --epochs)"})
    max_minutes: float = field(
        default=0.0, metadata={"help": "stop (and save) after this wall time; 0 = no limit"}
    )
    lr_schedule: str = field(
        default="steps",
        metadata={
            "help": "steps: the cosine decays over the steps | time: with --max-minutes, over whichever "
            "ends first, the steps or the training time (a time-budgeted run ends at the floor LR)"
        },
    )
    eps: float = field(default=1e-3, metadata={"help": "t ~ U(eps, 1)"})
    seed: int = field(default=0, metadata={"help": "seed for init, data order and noise"})
    mixed_precision: str = field(
        default="auto", metadata={"help": "no | bf16 | fp16 | auto (bf16 on CUDA, else no)"}
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute decoder layers in backward"}
    )
    compile: str = field(
        default="auto", metadata={"help": "torch.compile the decoder layers: yes | no | auto (on CUDA)"}
    )
    attention: str = field(
        default="auto",
        metadata={"help": "flex (BlockMask) | dense (bool mask, small T) | auto (flex on CUDA)"},
    )
    log_every: int = field(default=10, metadata={"help": "steps between log lines / curve points"})
    eval_every: int = field(
        default=0, metadata={"help": "steps between held-out evaluations (0 = at the end only)"}
    )
    eval_rows: int = field(default=64, metadata={"help": "held-out rows per evaluation"})
    final_eval_rows: int = field(
        default=0, metadata={"help": "held-out rows for the last evaluation (0 = --eval-rows)"}
    )
    save_every: int = field(
        default=0, metadata={"help": "steps between resumable checkpoints (0 = at the end only)"}
    )
    resume: str | None = field(
        default=None, metadata={"help": "resume from a checkpoint folder, or 'latest' in --out"}
    )
    save_state: bool = field(
        default=True,
        metadata={
            "help": "write a resumable checkpoint (weights, optimizer, RNG) at the end; "
            "--no-save-state writes the export (out/final) only"
        },
    )
    save_dtype: str = field(default="bfloat16", metadata={"help": "dtype of the exported model weights"})
    max_shard_mb: int = field(
        default=0, metadata={"help": "shard exported weights above this size (0 = one file)"}
    )

    def validate(self) -> None:
        if (self.model is None) == (self.init_config is None):
            raise ValueError("give exactly one of --model (a checkpoint) or --init-config (random init)")
        if self.init_config is not None and self.tokenizer is None:
            raise ValueError("--init-config needs --tokenizer (the folder holding tokenizer.json)")
        for name in ("seq_len", "micro_batch_size", "grad_accum"):
            if getattr(self, name) <= 0:
                raise ValueError(f"--{name.replace('_', '-')} must be positive")
        if self.mixed_precision not in ("auto", "no", "bf16", "fp16"):
            raise ValueError(f"--mixed-precision {self.mixed_precision!r}: use no, bf16, fp16 or auto")
        if self.compile not in ("auto", "yes", "no"):
            raise ValueError(f"--compile {self.compile!r}: use yes, no or auto")
        if self.attention not in ("auto", "flex", "dense"):
            raise ValueError(f"--attention {self.attention!r}: use flex, dense or auto")
        if not 0 < self.eps < 1:
            raise ValueError("--eps must be in (0, 1)")
        if self.lr_schedule not in ("steps", "time"):
            raise ValueError(f"--lr-schedule {self.lr_schedule!r}: use steps or time")
        if self.lr_schedule == "time" and not self.max_minutes:
            raise ValueError("--lr-schedule time needs --max-minutes (the time the decay spans)")


def add_dataclass_arguments(cls: type, parser: argparse.ArgumentParser) -> None:
    """One ``--kebab-case`` option per field of a config dataclass (``dice train sft`` and ``rl``): bools as
    ``--x/--no-x``, required fields as required options; a field's metadata gives its ``help`` and may set
    ``action="append"`` (a repeatable, required file option) or ``nargs``/``const``."""
    for f in dataclasses.fields(cls):
        meta = dict(f.metadata)
        kwargs: dict = {"help": meta.pop("help", "")}
        if f.type in ("bool", bool):
            kwargs.update(action=argparse.BooleanOptionalAction, default=f.default)
        elif meta.get("action") == "append":
            kwargs.update(action="append", required=True, metavar="FILE")
        else:
            kwargs.update(
                type={"int": int, "float": float}.get(str(f.type), str),
                nargs=meta.get("nargs"),
                const=meta.get("const"),
            )
            if f.default is dataclasses.MISSING:
                kwargs["required"] = True
            else:
                kwargs["default"] = f.default
        flag = "--" + f.name.replace("_", "-")
        parser.add_argument(flag, **{k: v for k, v in kwargs.items() if v is not None})
