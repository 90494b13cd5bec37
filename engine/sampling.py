"""Pure functions of one denoising step: sample every masked slot, then a policy picks what to commit.

Shapes: B rows, L slots of the current block, V vocabulary. Nothing here syncs with the host, so a step can
run inside a block without waiting on the GPU.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import Tensor

NEG_INF = float("-inf")


@dataclass(frozen=True)
class SamplingParams:
    """temperature 0 = greedy (argmax). ``filtered_confidence`` ranks by the probability after temperature,
    top-k and top-p (DICE's released evaluation script); the default ranks by the unfiltered distribution
    (SDAR's own evaluation decoder), so greedy confidences are real probabilities, not 1.0."""

    temperature: float = 0.0
    top_k: int | None = None
    top_p: float | None = None
    filtered_confidence: bool = False

    def __post_init__(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k is not None and self.top_k < 1:
            raise ValueError(f"top_k must be >= 1 or None, got {self.top_k}")
        if self.top_p is not None and not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")


def filter_logits(logits: Tensor, top_k: int | None, top_p: float | None) -> Tensor:
    """Top-k then top-p (nucleus) filtering with -inf, as SDAR's sampler does; ties at the k-th value stay."""
    if top_k is not None and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, NEG_INF)
    if top_p is not None and top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        drop_sorted = cum > top_p
        drop_sorted[..., 1:] = drop_sorted[..., :-1].clone()  # keep the token that crosses p
        drop_sorted[..., 0] = False
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, NEG_INF)
    return logits


def sample_tokens(
    logits: Tensor,
    params: SamplingParams,
    generator: torch.Generator | None = None,
    *,
    need_entropy: bool = False,
) -> tuple[Tensor, Tensor, Tensor | None]:
    """tokens (B, L), confidence (B, L), entropy (B, L) or None, from float logits (B, L, V).

    Sampling uses the exponential-race form of categorical sampling (argmax of q / Exp(1)), which draws
    exactly from q without a host sync. Unfiltered confidences come from one logsumexp pass; the entropy
    (of the unfiltered distribution, for the EB policy) only when asked, as it costs two more passes.
    """
    logits = logits.float()
    scaled = logits / params.temperature if params.temperature > 0 else logits
    lse = torch.logsumexp(scaled, dim=-1, keepdim=True)
    entropy = None
    if need_entropy:
        log_p = scaled - lse
        entropy = -(log_p.exp() * log_p).nan_to_num().sum(-1)
    if params.temperature == 0:
        tokens = scaled.argmax(-1)
        if params.filtered_confidence:  # the filtered distribution of greedy decoding is one-hot
            return tokens, torch.ones(tokens.shape, device=tokens.device), entropy
    else:
        q = filter_logits(scaled, params.top_k, params.top_p).softmax(-1)
        race = torch.empty_like(q).exponential_(1.0, generator=generator)
        tokens = (q / race).argmax(-1)
        if params.filtered_confidence:
            return tokens, q.gather(-1, tokens[..., None])[..., 0], entropy
    confidence = (scaled.gather(-1, tokens[..., None]) - lse).exp()[..., 0]
    return tokens, confidence, entropy


Policy = Callable[[Tensor, Tensor | None, Tensor, int, float], Tensor]


def static_policy(
    confidence: Tensor, entropy: Tensor, masked: Tensor, quota: int, threshold: float
) -> Tensor:
    """Commit the ``quota`` most confident masked slots (fewer if fewer are masked)."""
    scores = confidence.masked_fill(~masked, NEG_INF)
    idx = torch.topk(scores, min(quota, scores.shape[-1]), dim=-1).indices
    return torch.zeros_like(masked).scatter(-1, idx, True) & masked


def dynamic_policy(
    confidence: Tensor, entropy: Tensor, masked: Tensor, quota: int, threshold: float
) -> Tensor:
    """Commit every masked slot above ``threshold``; when fewer than ``quota`` are, the top ``quota``."""
    high = (confidence > threshold) & masked
    enough = high.sum(-1, keepdim=True) >= quota
    return torch.where(enough, high, static_policy(confidence, entropy, masked, quota, threshold))


def entropy_policy(
    confidence: Tensor, entropy: Tensor, masked: Tensor, quota: int, threshold: float
) -> Tensor:
    """EB-sampler: commit the lowest-entropy masked slots while their entropy sum stays below ``threshold``
    (nats), at least one."""
    if entropy is None:
        raise ValueError("the entropy policy needs entropies (sample_tokens(..., need_entropy=True))")
    ent = entropy.masked_fill(~masked, float("inf"))
    sorted_ent, order = torch.sort(ent, dim=-1, stable=True)
    count = (sorted_ent.cumsum(-1) < threshold).sum(-1, keepdim=True).clamp(min=1)
    positions = torch.arange(ent.shape[-1], device=ent.device).expand_as(order)
    rank = torch.empty_like(order).scatter(-1, order, positions)
    return (rank < count) & masked


POLICIES: dict[str, Policy] = {"static": static_policy, "dynamic": dynamic_policy, "entropy": entropy_policy}


def transfer_schedule(block_size: int, steps: int) -> list[int]:
    """Tokens to commit at each step of a block: block/steps, the remainder on the first steps (SDAR)."""
    if steps < 1:
        raise ValueError(f"steps_per_block must be >= 1, got {steps}")
    base, extra = divmod(block_size, steps)
    return [max(1, base + (1 if i < extra else 0)) for i in range(steps)]
