"""Preallocated K/V cache for block-diffusion decoding.

Layout: slot s of row b holds the token at position ``s - offsets[b]``; each row's prompt is left-padded by a
whole number of blocks so that every row's current block sits at the same slots (lockstep batched decoding).
Slots are grouped into blocks of ``block_size``; a query at slot q sees keys of its own block and of earlier
blocks, never the padding before ``offsets[b]``. Denoising steps write the (noisy) block into its slots; the
next forward after the block is complete overwrites them with the clean K/V. Slots after the current block
hold stale values and are invisible, so nothing is ever cleared.

``PrefixCache`` keeps the prefilled K/V of recent prompts (LRU, bounded by entries and tokens) so that a
prompt sharing a block-aligned prefix with one of them prefills only the rest. That is exact (up to the
float rounding of GEMMs of other shapes) because a committed block's K/V depend only on its own and earlier
blocks (block-causal attention, absolute positions).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
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

    @classmethod
    def _over(cls, k: Tensor, v: Tensor, offsets: Tensor, block_size: int) -> KVCache:
        """A cache over existing (L, B, G, S, D) storage (views or copies of another cache's rows)."""
        cache = cls.__new__(cls)
        cache.k, cache.v, cache.offsets, cache.block_size = k, v, offsets, block_size
        cache._slots = torch.arange(k.shape[3], device=k.device)
        cache._slot_blocks = cache._slots // block_size
        return cache

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

    def rows(self, rows: Sequence[int]) -> tuple[KVCache, bool]:
        """A cache of the given rows and whether it is a view (writes land here) or a copy (see put_rows)."""
        rows = list(rows)
        if rows == list(range(rows[0], rows[0] + len(rows))):
            sl = slice(rows[0], rows[0] + len(rows))
            return KVCache._over(self.k[:, sl], self.v[:, sl], self.offsets[sl], self.block_size), True
        idx = torch.tensor(rows, device=self.k.device)
        sub = KVCache._over(
            self.k.index_select(1, idx), self.v.index_select(1, idx), self.offsets[idx], self.block_size
        )
        return sub, False

    def put_rows(self, rows: Sequence[int], sub: KVCache, end: int) -> None:
        """Write slots [0, end) of ``sub`` (from ``rows(rows)``, a copy) back into those rows."""
        idx = torch.tensor(list(rows), device=self.k.device)
        self.k[:, :, :, :end].index_copy_(1, idx, sub.k[:, :, :, :end])
        self.v[:, :, :, :end].index_copy_(1, idx, sub.v[:, :, :, :end])

    def copy_rows(self, src: Sequence[int], dst: Sequence[int], end: int) -> None:
        """Row dst[i] gets slots [0, end) of row src[i] (rows with the same prompt share one prefill)."""
        src_t = torch.tensor(list(src), device=self.k.device)
        dst_t = torch.tensor(list(dst), device=self.k.device)
        self.k[:, :, :, :end].index_copy_(1, dst_t, self.k[:, :, :, :end].index_select(1, src_t))
        self.v[:, :, :, :end].index_copy_(1, dst_t, self.v[:, :, :, :end].index_select(1, src_t))

    def read(self, row: int, start: int, length: int) -> tuple[Tensor, Tensor]:
        """Copies of row ``row``'s K and V at slots [start, start + length), each (L, G, length, D)."""
        sl = slice(start, start + length)
        return self.k[:, row, :, sl].clone(), self.v[:, row, :, sl].clone()

    def load(self, row: int, start: int, k: Tensor, v: Tensor) -> None:
        """Store (L, G, n, D) K/V (from ``read`` or a PrefixCache) at slots [start, start + n) of ``row``."""
        n = k.shape[2]
        if start + n > self.max_slots:
            raise ValueError(f"{n} slots from {start} do not fit in {self.max_slots}")
        self.k[:, row, :, start : start + n].copy_(k)
        self.v[:, row, :, start : start + n].copy_(v)

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


class PrefixCache:
    """LRU of prefilled prompt K/V, keyed by whole blocks of prompt tokens (and the block size).

    An entry holds the K/V (L, G, n, D) of the first n tokens of a prompt, n a multiple of the block size.
    ``lookup`` returns the longest block-aligned prefix a new prompt shares with any entry (any prefix of an
    entry is usable on its own). Memory is bounded by ``max_entries`` and ``max_tokens`` (summed over
    entries; a longer prompt is kept up to ``max_tokens``). The K/V belong to the model's current weights:
    call ``clear`` after changing them. Safe to share between threads (each operation holds a lock;
    looked-up K/V stay valid after their entry is evicted).
    """

    def __init__(self, *, max_entries: int = 4, max_tokens: int = 8192) -> None:
        if max_entries < 1 or max_tokens < 1:
            raise ValueError(f"max_entries and max_tokens must be >= 1, got {max_entries}, {max_tokens}")
        self.max_entries = max_entries
        self.max_tokens = max_tokens
        self._entries: OrderedDict[tuple[int, tuple[int, ...]], tuple[Tensor, Tensor]] = OrderedDict()
        self.hits = 0  # lookups that reused at least one block
        self.misses = 0
        self.reused_tokens = 0
        self._lock = threading.RLock()

    def __len__(self) -> int:
        return len(self._entries)

    @property
    def tokens(self) -> int:
        with self._lock:
            return sum(len(key[1]) for key in self._entries)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    @staticmethod
    def _common(a: Sequence[int], b: Sequence[int]) -> int:
        n = min(len(a), len(b))
        for i in range(n):
            if a[i] != b[i]:
                return i
        return n

    def lookup(self, tokens: Sequence[int], block_size: int) -> tuple[int, Tensor | None, Tensor | None]:
        """(n, K, V): the first n tokens (whole blocks) of ``tokens`` are cached, K/V each (L, G, n, D)."""
        with self._lock:
            best, best_key = 0, None
            for key in self._entries:
                if key[0] == block_size:
                    n = self._common(key[1], tokens) // block_size * block_size
                    if n > best:
                        best, best_key = n, key
            if best_key is None:
                self.misses += 1
                return 0, None, None
            self._entries.move_to_end(best_key)
            self.hits += 1
            self.reused_tokens += best
            k, v = self._entries[best_key]
            return best, k[:, :, :best], v[:, :, :best]

    def store(self, tokens: Sequence[int], block_size: int, k: Tensor, v: Tensor) -> None:
        """Keep the K/V (L, G, len(tokens), D) of ``tokens`` (a whole number of blocks)."""
        with self._lock:
            n = min(len(tokens), self.max_tokens) // block_size * block_size
            if n == 0:
                return
            if len(tokens) % block_size or k.shape[2] != len(tokens) or v.shape != k.shape:
                raise ValueError(
                    f"expected K/V of {len(tokens)} tokens in whole blocks, got {tuple(k.shape)}"
                )
            key = (block_size, tuple(tokens[:n]))
            for old in list(self._entries):
                if old[0] != block_size:
                    continue
                if old[1] == key[1][: len(old[1])]:  # an older entry this one extends: superseded
                    del self._entries[old]
                elif key[1] == old[1][:n]:  # already held by a longer entry
                    self._entries.move_to_end(old)
                    return
            # contiguous(): a truncated entry must not keep the longer K/V alive through a view
            self._entries[key] = (k[:, :, :n].contiguous(), v[:, :, :n].contiguous())
            while len(self._entries) > self.max_entries or self.tokens > self.max_tokens:
                self._entries.popitem(last=False)
