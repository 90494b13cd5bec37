"""The block-diffusion training attention mask over the ``[noisy | clean]`` layout.

A packed row holds ``T`` tokens (documents back to back, each padded to a multiple of the block size, so
block boundaries never straddle two documents). The model sees ``2T`` tokens: the noisy copy (``0..T-1``)
then the clean copy (``T..2T-1``), with the position ids duplicated. For query ``q`` and key ``k`` in the
same document, with block index ``b(i) = (i mod T) // block_size``:

- noisy ``q`` sees noisy ``k`` of its own block (bidirectional inside the block),
- noisy ``q`` sees clean ``k`` of strictly earlier blocks (the committed context),
- clean ``q`` sees clean ``k`` of its own and earlier blocks (block-causal), never the noisy copy.

Tokens of different documents never see each other. This is SDAR's ``block_diff_mask`` extended with
document ids for packing; :func:`build_block_mask` builds a flex_attention ``BlockMask`` tile by tile, so a
6k-token row (12k-token model input) never materialises a dense ``2T x 2T`` mask.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import Tensor

# flex_attention's default tile: the BlockMask records, per (query tile, key tile), none / partial / full.
FLEX_TILE = 128


def make_mask_mod(doc_ids: Tensor, block_size: int) -> Callable[[Tensor, Tensor, Tensor, Tensor], Tensor]:
    """The mask as a flex_attention ``mask_mod(b, h, q_idx, kv_idx) -> bool`` over ``2T`` positions.

    ``doc_ids``: (B, T) int, the document index of every token of each packed row (padding at the end of a
    row gets a document id of its own).
    """
    seq_len = doc_ids.shape[-1]

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        q_clean = q_idx >= seq_len
        kv_clean = kv_idx >= seq_len
        q_pos = q_idx - q_clean.to(q_idx.dtype) * seq_len
        kv_pos = kv_idx - kv_clean.to(kv_idx.dtype) * seq_len
        q_block = q_pos // block_size
        kv_block = kv_pos // block_size
        same_doc = doc_ids[b, q_pos] == doc_ids[b, kv_pos]
        noisy_self = ~q_clean & ~kv_clean & (q_block == kv_block)
        noisy_context = ~q_clean & kv_clean & (kv_block < q_block)
        clean_causal = q_clean & kv_clean & (kv_block <= q_block)
        return same_doc & (noisy_self | noisy_context | clean_causal)

    return mask_mod


def dense_mask(doc_ids: Tensor, block_size: int) -> Tensor:
    """The same mask as a dense bool tensor (B, 1, 2T, 2T), True = may attend. Only for small cases."""
    batch, seq_len = doc_ids.shape
    mask_mod = make_mask_mod(doc_ids, block_size)
    idx = torch.arange(2 * seq_len, device=doc_ids.device)
    b = torch.arange(batch, device=doc_ids.device)[:, None, None]
    return mask_mod(b, None, idx[None, :, None], idx[None, None, :]).unsqueeze(1)


def _tile_summary(doc_ids: Tensor, block_size: int, tile: int) -> tuple[Tensor, Tensor]:
    """Per (row, query tile, key tile): any allowed and all allowed. Returns two (B, Nq, Nk) bool tensors.

    The mask is constant on every ``block_size x block_size`` cell (documents start on block boundaries), so
    it is evaluated once per cell, a few query tiles at a time: memory O(cells per tile * 2T / block_size).
    """
    batch, seq_len = doc_ids.shape
    if seq_len % block_size or tile % block_size:
        raise ValueError(f"row length {seq_len} and tile {tile} must be multiples of block size {block_size}")
    device = doc_ids.device
    total = 2 * seq_len
    n_tiles = (total + tile - 1) // tile
    cells_per_tile = tile // block_size
    n_cells = total // block_size
    mask_mod = make_mask_mod(doc_ids, block_size)
    cell = torch.arange(n_tiles * cells_per_tile, device=device)
    cell_valid = cell < n_cells
    first = cell.clamp(max=n_cells - 1) * block_size  # first token of each cell
    b = torch.arange(batch, device=device)[:, None, None]
    kv_valid = cell_valid[None, :]
    any_tiles = torch.empty(batch, n_tiles, n_tiles, dtype=torch.bool, device=device)
    all_tiles = torch.empty_like(any_tiles)
    # A tile cut by the sequence end is never "full": its out-of-range part must stay masked.
    tile_complete = cell_valid.view(n_tiles, cells_per_tile).all(dim=1)
    chunk = max(1, 4096 // cells_per_tile)
    for q0 in range(0, n_tiles, chunk):
        q1 = min(n_tiles, q0 + chunk)
        q_cells = slice(q0 * cells_per_tile, q1 * cells_per_tile)
        allowed = mask_mod(b, None, first[q_cells][None, :, None], first[None, None, :])
        allowed = allowed & cell_valid[q_cells][:, None] & kv_valid  # (B, cq, n_cells_padded)
        allowed = allowed.view(batch, q1 - q0, cells_per_tile, n_tiles, cells_per_tile)
        any_tiles[:, q0:q1] = allowed.any(dim=4).any(dim=2)
        all_tiles[:, q0:q1] = (
            allowed.all(dim=4).all(dim=2) & tile_complete[q0:q1, None] & tile_complete[None, :]
        )
    return any_tiles, all_tiles


def _to_indices(tiles: Tensor) -> tuple[Tensor, Tensor]:
    """(B, Nq, Nk) bool -> (num_blocks (B, 1, Nq) int32, indices (B, 1, Nq, Nk) int32), the BlockMask form."""
    num = tiles.sum(dim=-1, dtype=torch.int32)
    # Stable sort puts the selected key tiles first, in increasing order.
    order = torch.argsort((~tiles).to(torch.int8), dim=-1, stable=True).to(torch.int32)
    return num.unsqueeze(1), order.unsqueeze(1)


def build_block_mask(doc_ids: Tensor, block_size: int, *, tile: int = FLEX_TILE):
    """The flex_attention ``BlockMask`` of the block-diffusion mask for packed rows ``doc_ids`` (B, T).

    Full tiles skip the ``mask_mod`` call entirely; partial tiles evaluate it; empty tiles are skipped.
    """
    from torch.nn.attention.flex_attention import BlockMask

    any_tiles, all_tiles = _tile_summary(doc_ids, block_size, tile)
    partial = any_tiles & ~all_tiles
    kv_num, kv_idx = _to_indices(partial)
    full_num, full_idx = _to_indices(all_tiles)
    total = 2 * doc_ids.shape[-1]
    return BlockMask.from_kv_blocks(
        kv_num,
        kv_idx,
        full_num,
        full_idx,
        BLOCK_SIZE=tile,
        mask_mod=make_mask_mod(doc_ids, block_size),
        seq_lengths=(total, total),
    )


def block_mask_to_dense(block_mask, batch: int) -> Tensor:
    """Expand a ``BlockMask`` to a dense bool (B, 1, Q, KV) mask (for tests): full tiles True, partial tiles
    through ``mask_mod``, missing tiles False."""
    q_len, kv_len = block_mask.seq_lengths
    tile_q, tile_kv = block_mask.BLOCK_SIZE
    tiles = block_mask.to_dense()  # (B|1, 1, Nq, Nk) int: 1 where the tile is partial or full
    full = torch.zeros_like(tiles, dtype=torch.bool)
    if block_mask.full_kv_num_blocks is not None:
        for bi in range(full.shape[0]):
            for qi in range(full.shape[2]):
                n = int(block_mask.full_kv_num_blocks[bi, 0, qi])
                full[bi, 0, qi, block_mask.full_kv_indices[bi, 0, qi, :n].long()] = True
    idx_q = torch.arange(q_len)
    idx_kv = torch.arange(kv_len)
    out = torch.zeros(batch, 1, q_len, kv_len, dtype=torch.bool)
    for bi in range(batch):
        src = min(bi, tiles.shape[0] - 1)
        present = tiles[src, 0].bool()[idx_q // tile_q][:, idx_kv // tile_kv]
        is_full = full[src, 0][idx_q // tile_q][:, idx_kv // tile_kv]
        evaluated = block_mask.mask_mod(torch.tensor(bi), None, idx_q[:, None], idx_kv[None, :])
        out[bi, 0] = is_full | (present & evaluated)
    return out
