"""The SDAR block-diffusion loss: hand-computed values, noising invariants."""

from __future__ import annotations

import math

import torch

from training.losses import Noised, add_noise, block_diffusion_loss, weighted_masked_ce_sum


def test_weighted_ce_sum_equals_hand_computation() -> None:
    logits = torch.tensor([[2.0, 0.0, -1.0], [0.5, 0.5, 3.0]])
    targets = torch.tensor([0, 1])
    p = torch.tensor([0.5, 0.25])
    # CE_i = log(sum exp) - logit[target]
    ce0 = math.log(math.exp(2.0) + math.exp(0.0) + math.exp(-1.0)) - 2.0
    ce1 = math.log(math.exp(0.5) + math.exp(0.5) + math.exp(3.0)) - 0.5
    expected = ce0 / 0.5 + ce1 / 0.25
    assert math.isclose(float(weighted_masked_ce_sum(logits, targets, p)), expected, rel_tol=1e-6)


def test_block_diffusion_loss_on_fixed_batch_and_mask() -> None:
    vocab = 3
    input_ids = torch.tensor([[0, 1, 2, 1]])
    logits = torch.zeros(1, 4, vocab)
    logits[0, 1] = torch.tensor([1.0, 2.0, 0.0])
    logits[0, 3] = torch.tensor([0.0, 0.0, 4.0])
    masked = torch.tensor([[False, True, False, True]])
    p_mask = torch.full((1, 4), 0.4)
    noised = Noised(noisy_ids=input_ids.masked_fill(masked, 9), masked=masked, p_mask=p_mask)
    answer_tokens = 3  # trainable tokens in the batch, masked or not
    ce1 = math.log(math.exp(1) + math.exp(2) + 1) - 2.0
    ce3 = math.log(2 + math.exp(4)) - 0.0
    expected = (ce1 / 0.4 + ce3 / 0.4) / answer_tokens
    got = block_diffusion_loss(logits, input_ids, noised, answer_tokens)
    assert math.isclose(float(got), expected, rel_tol=1e-6)


def test_add_noise_invariants() -> None:
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(0, 50, (4, 64), generator=gen)
    loss_mask = torch.zeros(4, 64, dtype=torch.bool)
    loss_mask[:, 20:40] = True
    loss_mask[:, 52:60] = True
    doc = torch.zeros(4, 64, dtype=torch.long)
    doc[:, 48:] = 1
    doc[:, 60:] = 2  # padding tail: no trainable token
    out = add_noise(ids, loss_mask, doc, mask_id=99, eps=1e-3, generator=torch.Generator().manual_seed(0))
    assert not (out.masked & ~loss_mask).any(), "only trainable tokens are masked"
    assert torch.equal(out.noisy_ids[out.masked], torch.full((int(out.masked.sum()),), 99))
    assert torch.equal(out.noisy_ids[~out.masked], ids[~out.masked])
    for b in range(4):
        for d in (0, 1):
            sel = doc[b] == d
            assert out.masked[b][sel].any(), "every document with answer tokens gets a masked token"
            t = out.p_mask[b][sel]
            assert torch.all(t == t[0]) and 1e-3 <= float(t[0]) < 1.0, "one t ~ U(eps, 1) per document"
    again = add_noise(ids, loss_mask, doc, mask_id=99, eps=1e-3, generator=torch.Generator().manual_seed(0))
    assert torch.equal(again.masked, out.masked) and torch.equal(again.p_mask, out.p_mask)


def test_masking_rate_follows_t() -> None:
    # Many one-document rows: the masked fraction of each row is close to its t on average.
    ids = torch.zeros(400, 256, dtype=torch.long)
    loss_mask = torch.ones_like(ids, dtype=torch.bool)
    doc = torch.zeros_like(ids)
    out = add_noise(ids, loss_mask, doc, mask_id=1, generator=torch.Generator().manual_seed(1))
    frac = out.masked.float().mean(dim=1)
    t = out.p_mask[:, 0]
    assert float((frac - t).abs().mean()) < 0.03
    assert 0.4 < float(t.mean()) < 0.6  # U(eps, 1)
