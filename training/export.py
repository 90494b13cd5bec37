"""Writing a trained model in the engine's format (``out/final``), and finding a run's newest checkpoint, for
``dice train sft`` and ``rl`` alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch


def latest_checkpoint(out: Path) -> Path | None:
    """The newest ``checkpoints/step_N`` folder of a run (None: none yet)."""
    ckpts = sorted((out / "checkpoints").glob("step_*"), key=lambda p: int(p.name.split("_")[1]))
    return ckpts[-1] if ckpts else None


def export_engine_format(
    accelerator: Any,
    wrapped: torch.nn.Module,
    config: Any,
    final: Path,
    *,
    tokenizer_dir: Path,
    dtype: str,
    max_shard_mb: int,
) -> bool:
    """Gather ``wrapped``'s full state dict (a module holding the DiceModel as ``.model``; FSDP or
    DeepSpeed shards included) and, on the main process, save it with its tokenizer as a checkpoint
    ``engine.load_engine`` loads. Returns whether this process wrote it (the caller adds its own config
    and curves there); every process must call it (the gather is collective)."""
    from engine.checkpoint import save_model
    from engine.model import DiceModel

    state_dict = accelerator.get_state_dict(wrapped)
    if not accelerator.is_main_process:
        return False
    with torch.device("meta"):  # no default init: every tensor comes from the state dict
        export = DiceModel(config)
    export.load_state_dict(
        {k.removeprefix("model."): v for k, v in state_dict.items()}, strict=True, assign=True
    )
    if config.tie_word_embeddings:
        export.tie_weights()
    save_model(
        export,
        final,
        tokenizer_dir=tokenizer_dir,
        dtype=dtype,
        max_shard_bytes=max_shard_mb * 2**20 if max_shard_mb else None,
    )
    return True
