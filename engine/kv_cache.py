"""Preallocated K/V cache for block-diffusion decoding.

Layout: slot s of row b holds the token at position ``s - offsets[b]``; each row's prompt is left-padded by a
whole number of blocks so that every row's current block sits at the same slots (lockstep batched decoding).
Slots are grouped into blocks of ``block_size``; a query at slot q sees keys of its own block and of earlier
blocks, never the padding before ``offsets[b]``. Denoising steps write the (noisy) block into its slots; the
next forward after the block is complete overwrites them with the clean K/V. Slots after the current block
hold stale values and are invisible, so nothing is ever cleared.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


class KVCache:
    def __init__(
        self,
        *,
        num_layers: int,
        batch_size: int,
        num_kv_heads: int,
        head_dim: int,
        max_slots: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device | str,
    ) -> None:
        max_slots = -(-max_slots // block_size) * block_size
        shape = (num_layers, batch_size, num_kv_heads, max_slots, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # (L, B, G, S, D)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.block_size = block_size
        self.offsets = torch.zeros(batch_size, dtype=torch.long, device=device)  # (B,) first real slot
        self._slots = torch.arange(max_slots, device=device)
        self._slot_blocks = self._slots // block_size

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    @property
    def max_slots(self) -> int:
        return self.k.shape[3]

    def reset(self, offsets: Sequence[int] | Tensor) -> None:
        """Start a new batch: ``offsets[b]`` slots of left padding (multiples of block_size) for row b."""
        offsets = torch.as_tensor(offsets, dtype=torch.long)
        if offsets.shape != self.offsets.shape:
            raise ValueError(f"expected {self.batch_size} offsets, got {tuple(offsets.shape)}")
        if bool((offsets % self.block_size).any()):
            raise ValueError("offsets must be multiples of block_size")
        self.offsets.copy_(offsets)  # in place: graph-captured steps keep reading the same tensor

    def slots(self, start: Tensor, length: int) -> Tensor:
        """(T,) slot indices [start, start + T) as a device tensor (no host sync, graph-capturable)."""
        return start + self._slots[:length]

    def write(self, layer: int, slots: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store k/v (B, G, T, D) at ``slots``; return the layer's whole (B, G, S, D) cache."""
        self.k[layer].index_copy_(2, slots, k)
        self.v[layer].index_copy_(2, slots, v)
        return self.k[layer], self.v[layer]

    def visibility(self, start: Tensor, length: int) -> Tensor:
        """(B, 1, T, S) bool attention mask for queries at slots [start, start + T).

        A query always sees itself, so padding rows never produce NaN (their K/V stay invisible to real rows).
        """
        q_slots = start + self._slots[:length]  # (T,)
        same_or_earlier = self._slot_blocks[None, :] <= (q_slots // self.block_size)[:, None]  # (T, S)
        not_padding = self._slots[None, :] >= self.offsets[:, None]  # (B, S)
        own = self._slots[None, :] == q_slots[:, None]  # (T, S)
        return ((same_or_earlier[None] & not_padding[:, None]) | own[None])[:, None]
