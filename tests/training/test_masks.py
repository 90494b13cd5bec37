"""The block-diffusion attention mask, element by element against its definition."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from training.masks import block_mask_to_dense, build_block_mask, dense_mask


def reference_mask(doc_ids: list[int], block: int) -> list[list[bool]]:
    """The definition, written out with plain loops over the 2T positions of [noisy | clean]."""
    t = len(doc_ids)
    out = []
    for q in range(2 * t):
        row = []
        for k in range(2 * t):
            q_clean, k_clean = q >= t, k >= t
            qi, ki = q % t, k % t
            qb, kb = qi // block, ki // block
            if doc_ids[qi] != doc_ids[ki]:
                allowed = False
            elif not q_clean and not k_clean:
                allowed = qb == kb  # noisy block sees itself (bidirectionally)
            elif not q_clean and k_clean:
                allowed = kb < qb  # ... and the clean copy of earlier blocks
            elif q_clean and k_clean:
                allowed = kb <= qb  # clean copy: block-causal
            else:
                allowed = False  # clean never sees noisy
            row.append(allowed)
        out.append(row)
    return out


CASES = [
    [0] * 16,  # one document
    [0] * 8 + [1] * 12 + [2] * 4,  # packed documents
    [0] * 4 + [1] * 4 + [2] * 8 + [3] * 4,  # last document = padding tail
]


@pytest.mark.parametrize("docs", CASES)
def test_dense_mask_matches_definition_element_by_element(docs: list[int]) -> None:
    got = dense_mask(torch.tensor([docs]), 4)[0, 0].tolist()
    assert got == reference_mask(docs, 4)


def test_dense_mask_examples() -> None:
    mask = dense_mask(torch.tensor([[0] * 12]), 4)[0, 0]
    t = 12
    assert mask[5, 4] and mask[5, 7]  # noisy block 1 sees all of itself
    assert not mask[5, 8]  # ... not the next noisy block
    assert mask[5, t + 3] and not mask[5, t + 4]  # clean block 0 yes, clean block 1 (its own) no
    assert mask[t + 5, t + 7] and mask[t + 5, t + 0] and not mask[t + 5, t + 8]
    assert not mask[t + 5, 5]  # clean never sees noisy


@pytest.mark.parametrize("tile", [4, 8, 16, 128])
@pytest.mark.parametrize("docs", CASES)
def test_block_mask_expands_to_the_dense_mask(docs: list[int], tile: int) -> None:
    doc_ids = torch.tensor([docs, sorted(docs)[::-1]])  # two rows, different layouts
    doc_ids[1] = doc_ids[1].max() - doc_ids[1]
    bm = build_block_mask(doc_ids, 4, tile=tile)
    assert torch.equal(block_mask_to_dense(bm, 2), dense_mask(doc_ids, 4))


def test_block_mask_skips_empty_tiles_and_marks_full_ones() -> None:
    doc_ids = torch.zeros(1, 512, dtype=torch.long)
    doc_ids[0, 256:] = 1
    bm = build_block_mask(doc_ids, 4, tile=128)
    dense_tiles = bm.to_dense()[0, 0]
    assert dense_tiles.shape == (8, 8)
    assert int(dense_tiles.sum()) < 64  # cross-document and noisy->later tiles are skipped
    assert int(bm.full_kv_num_blocks.sum()) > 0  # clean->earlier clean tiles need no mask_mod call


def test_flex_attention_with_block_mask_equals_sdpa_with_dense_mask() -> None:
    from torch.nn.attention.flex_attention import flex_attention

    doc_ids = torch.tensor([[0] * 24 + [1] * 8, [0] * 32])
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 2, 64, 16, generator=gen) for _ in range(3))
    out_flex = flex_attention(q, k, v, block_mask=build_block_mask(doc_ids, 4, tile=16))
    out_sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=dense_mask(doc_ids, 4))
    assert torch.allclose(out_flex, out_sdpa, atol=1e-5)


def test_rejects_rows_not_aligned_to_blocks() -> None:
    with pytest.raises(ValueError, match="multiples of block size"):
        build_block_mask(torch.zeros(1, 10, dtype=torch.long), 4)
