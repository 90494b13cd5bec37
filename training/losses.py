"""The SDAR block-diffusion SFT objective: forward noising and the 1/t-weighted masked cross-entropy.

Per document (a packed row may hold several) ``t ~ U(eps, 1)``; each trainable (response) token is replaced
by the mask token with probability ``t``; the loss is the cross-entropy of the masked tokens weighted by
``1/t``, summed, and divided by the number of trainable tokens (SDAR's
``forward_add_noise_packed`` + ``FusedLinearDiffusionCrossEntropyLoss(reduction="sum") / answer_len``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True)
class Noised:
    """One noised batch. All tensors (B, T)."""

    noisy_ids: Tensor  # input ids with the masked positions replaced by the mask id
    masked: Tensor  # bool: position was masked (and so carries loss)
    p_mask: Tensor  # float: the masking probability t of the position's document


def add_noise(
    input_ids: Tensor,
    loss_mask: Tensor,
    doc_ids: Tensor,
    mask_id: int,
    *,
    eps: float = 1e-3,
    generator: torch.Generator | None = None,
) -> Noised:
    """Mask trainable tokens with a per-document rate ``t ~ U(eps, 1)``.

    ``input_ids`` (B, T) int; ``loss_mask`` (B, T) bool, True on trainable tokens; ``doc_ids`` (B, T) int,
    document index inside each row (0..D-1). Every document with a trainable token gets at least one masked
    token (SDAR retries, then forces one), so no document contributes a zero-information sample.
    Random numbers come from ``generator`` on the CPU, so the noise does not depend on the device.
    """
    if not (input_ids.shape == loss_mask.shape == doc_ids.shape):
        raise ValueError("input_ids, loss_mask and doc_ids must have the same (B, T) shape")
    batch, seq_len = input_ids.shape
    n_docs = int(doc_ids.max().item()) + 1 if doc_ids.numel() else 1
    t_doc = eps + (1.0 - eps) * torch.rand(batch, n_docs, generator=generator)  # (B, D)
    u = torch.rand(batch, seq_len, generator=generator)  # (B, T)
    tie_break = torch.rand(batch, seq_len, generator=generator)
    device = input_ids.device
    t_doc, u, tie_break = t_doc.to(device), u.to(device), tie_break.to(device)
    p_mask = torch.gather(t_doc, 1, doc_ids.long())
    masked = (u < p_mask) & loss_mask
    # Force one masked token in any document that has trainable tokens but drew none.
    masked_count = torch.zeros(batch, n_docs, device=device).scatter_add_(1, doc_ids.long(), masked.float())
    trainable_count = torch.zeros(batch, n_docs, device=device).scatter_add_(
        1, doc_ids.long(), loss_mask.float()
    )
    needs = (masked_count == 0) & (trainable_count > 0)
    if bool(needs.any()):
        needs_tok = torch.gather(needs, 1, doc_ids.long()) & loss_mask
        score = torch.where(needs_tok, tie_break, torch.full_like(tie_break, -1.0))
        best = torch.full((batch, n_docs), -1.0, device=device).scatter_reduce(
            1, doc_ids.long(), score, reduce="amax"
        )
        chosen = needs_tok & (score == torch.gather(best, 1, doc_ids.long()))
        masked = masked | chosen
    noisy = torch.where(masked, torch.full_like(input_ids, mask_id), input_ids)
    return Noised(noisy_ids=noisy, masked=masked, p_mask=p_mask)


def weighted_masked_ce_sum(logits: Tensor, targets: Tensor, p_mask: Tensor) -> Tensor:
    """Sum over positions of ``CE(logits, target) / p_mask``; inputs already restricted to masked positions.

    ``logits`` (N, V) any float dtype (computed in float32); ``targets`` (N,) int; ``p_mask`` (N,) float.
    """
    ce = F.cross_entropy(logits.float(), targets.long(), reduction="none")
    return (ce / p_mask.float()).sum()


def block_diffusion_loss(
    logits: Tensor, input_ids: Tensor, noised: Noised, num_answer_tokens: Tensor | int
) -> Tensor:
    """The SFT loss for one batch: ``sum_masked CE / t`` divided by ``num_answer_tokens``.

    ``logits`` (B, T, V): the model's output on the noisy copy (no shift: logit i predicts token i);
    ``input_ids`` (B, T) the clean targets. ``num_answer_tokens`` is the normaliser: the count of trainable
    tokens in the batch (or, under data parallelism, in the global batch).
    """
    sel = noised.masked
    total = weighted_masked_ce_sum(logits[sel], input_ids[sel], noised.p_mask[sel])
    return total / num_answer_tokens
