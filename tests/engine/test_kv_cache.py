"""KVCache: slot layout, writes and the visibility rule."""

from __future__ import annotations

import pytest
import torch

from engine.kv_cache import KVCache


def make(batch: int = 2, slots: int = 10) -> KVCache:
    return KVCache(
        num_layers=2,
        batch_size=batch,
        num_kv_heads=1,
        head_dim=2,
        max_slots=slots,
        block_size=4,
        dtype=torch.float32,
        device="cpu",
    )


def test_slots_round_up_to_whole_blocks_and_offsets_are_checked():
    cache = make(slots=10)
    assert cache.max_slots == 12 and cache.k.shape == (2, 2, 1, 12, 2)
    cache.reset([0, 8])
    assert cache.offsets.tolist() == [0, 8]
    with pytest.raises(ValueError, match="multiples"):
        cache.reset([0, 3])
    with pytest.raises(ValueError, match="offsets"):
        cache.reset([0])


def test_write_stores_at_slots_and_returns_the_layer_cache():
    cache = make()
    k = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 1, 4, 2)
    slots = cache.slots(torch.tensor([4]), 4)
    assert slots.tolist() == [4, 5, 6, 7]
    k_all, v_all = cache.write(1, slots, k, -k)
    assert torch.equal(k_all[:, :, 4:8], k) and torch.equal(v_all[:, :, 4:8], -k)
    assert k_all.data_ptr() == cache.k[1].data_ptr()  # a view, no copy
    assert not cache.k[0].any() and not cache.k[1][:, :, :4].any()


def test_visibility_is_block_causal_bidirectional_in_block_and_hides_padding():
    cache = make(slots=12)
    cache.reset([0, 4])
    vis = cache.visibility(torch.tensor([4]), 4)  # queries at slots 4..7 (second block)
    assert vis.shape == (2, 1, 4, 12)
    row0 = vis[0, 0]
    assert row0[:, :8].all() and not row0[:, 8:].any()  # earlier block + own block, nothing later
    row1 = vis[1, 0]
    assert not row1[:, :4].any() and row1[:, 4:8].all() and not row1[:, 8:].any()  # padding hidden
    # a query inside the padding still sees itself (no all-masked row, so no NaN)
    pad = cache.visibility(torch.tensor([0]), 4)[1, 0]
    assert torch.equal(pad[:, :4], torch.eye(4, dtype=torch.bool)) and not pad[:, 4:].any()
    # prefill of two blocks at once: block-causal inside the span
    both = cache.visibility(torch.tensor([0]), 8)[0, 0]
    assert both[:4, :4].all() and not both[:4, 4:].any() and both[4:8, :8].all()
