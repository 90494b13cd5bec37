"""The block-diffusion objective as one module, so DDP / FSDP / DeepSpeed wrap a single forward.

Each row (T tokens, several documents) is noised per document (``training.losses.add_noise``) from a
generator seeded by (seed, epoch, row index), laid out as ``[noisy | clean]`` (2T tokens, position ids
duplicated) under the block-diffusion mask (``training.masks``); the forward returns the summed 1/t-weighted
cross-entropy of the masked tokens.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from training.losses import add_noise, weighted_masked_ce_sum
from training.masks import build_block_mask, dense_mask


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
