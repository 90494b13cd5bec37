"""How a decode step's forward runs: eagerly, or as a replayed CUDA graph over a preallocated cache.

Both runners expose ``prefill(cache, ids, pos, start)`` (always eager) and
``step(cache, ids, pos, start, block)``, which returns (B, block, V) float32 logits; the decode loop does
not know which one it drives. Graphs are captured per (cache, input length) before the prompt is
prefilled, since capture warm-up writes into the cache slots it is pointed at. Prefill (also of a prompt's
remainder after reused prefix K/V) runs eagerly in both, so prefix reuse never meets a captured graph.
"""

from __future__ import annotations

import torch
from torch import Tensor

from engine.kv_cache import KVCache
from engine.model import DiceModel


def cache_slots(max_slots: int) -> int:
    """The slots a cache for ``max_slots`` gets: rounded up to a multiple of 256 so that requests of similar
    length share one cache (and, on the graph runner, one capture); the extra slots are masked. Both runners
    round alike, so they run the very same attention shapes."""
    return -(-max_slots // 256) * 256


class EagerRunner:
    def __init__(self, model: DiceModel) -> None:
        self.model = model

    def new_cache(self, batch_size: int, max_slots: int, block_size: int) -> KVCache:
        max_slots = cache_slots(max_slots)
        cfg = self.model.config
        p = self.model.lm_head.weight
        return KVCache(
            num_layers=cfg.num_hidden_layers,
            batch_size=batch_size,
            num_kv_heads=cfg.num_key_value_heads,
            head_dim=cfg.head_dim,
            max_slots=max_slots,
            block_size=block_size,
            dtype=p.dtype,
            device=p.device,
        )

    def prepare(self, cache: KVCache, lengths: tuple[int, ...], block_size: int) -> None:
        """Called once per generation before prefill (graph capture hook)."""

    def release(self) -> None:
        """Drop what the runner keeps between generations (nothing here)."""

    def prefill(self, cache: KVCache, ids: Tensor, pos: Tensor, start: int = 0) -> None:
        """Write the K/V of (B, T) prompt tokens at slots [start, start + T) (whole blocks)."""
        start_t = torch.full((1,), start, dtype=torch.long, device=ids.device)
        self.model.forward_cached(ids, pos, cache, start_t, logits_last=0)

    def step(self, cache: KVCache, ids: Tensor, pos: Tensor, start: Tensor, block_size: int) -> Tensor:
        return self.model.forward_cached(ids, pos, cache, start, logits_last=block_size).float()


class _Graph:
    def __init__(
        self, graph: torch.cuda.CUDAGraph, ids: Tensor, pos: Tensor, start: Tensor, out: Tensor
    ) -> None:
        self.graph, self.ids, self.pos, self.start, self.out = graph, ids, pos, start, out


class CudaGraphRunner(EagerRunner):
    """Replays one captured CUDA graph per (cache, step length): one launch per denoising step.

    What is captured: ``kernels=True``, the Triton fast path (``engine.fast_forward``: skinny products,
    fused norms/RoPE/cache writes, flash-decoding over the cache); ``compile=True``, the model's cached
    forward through ``torch.compile`` (fusing the elementwise kernels between the matmuls); else the model's
    own eager forward. Capture and its warm-up run under ``no_grad``: traced with autograd on, AOTAutograd
    fails on the in-place cache write (seen on the H200), and a step never needs gradients.
    """

    def __init__(self, model: DiceModel, *, compile: bool = False, kernels: bool = False) -> None:
        super().__init__(model)
        if compile and kernels:
            raise ValueError("choose compile or kernels, not both")
        if kernels:
            from engine.fast_forward import FastForward

            self._forward = FastForward(model)
        elif compile:
            # default mode: no autotuning (minutes at 8B) and no cudagraphs of its own (we capture).
            self._forward = torch.compile(model.forward_cached, dynamic=False, fullgraph=True)
        else:
            self._forward = model.forward_cached
        self.kernels, self.compiled = kernels, compile
        self._graphs: dict[tuple[int, int], _Graph] = {}
        self._pool = torch.cuda.graph_pool_handle()
        self._caches: dict[tuple[int, int, int], KVCache] = {}

    def new_cache(self, batch_size: int, max_slots: int, block_size: int) -> KVCache:
        key = (batch_size, cache_slots(max_slots), block_size)
        if key not in self._caches:
            self._caches[key] = super().new_cache(batch_size, max_slots, block_size)
        return self._caches[key]

    def release(self) -> None:
        """Drop every captured graph and preallocated cache (the next generation captures again). A trainer
        calls this between its rollouts and its update: one cache per (rows, slots) shape is kept for reuse,
        and at 1.7B a cache of 256 rows x 3,328 slots holds 98 GB the update needs."""
        self._graphs.clear()
        self._caches.clear()
        self._pool = torch.cuda.graph_pool_handle()  # the old pool's blocks go when its graphs do

    def prepare(self, cache: KVCache, lengths: tuple[int, ...], block_size: int) -> None:
        for length in lengths:
            if (id(cache), length) not in self._graphs:
                self._graphs[(id(cache), length)] = self._capture(cache, length, block_size)

    def _capture(self, cache: KVCache, length: int, block_size: int) -> _Graph:
        device = cache.k.device
        b = cache.batch_size
        ids = torch.zeros(b, length, dtype=torch.long, device=device)
        pos = torch.zeros(b, length, dtype=torch.long, device=device)
        start = torch.zeros(1, dtype=torch.long, device=device)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side), torch.no_grad():
            for _ in range(2):
                self._forward(ids, pos, cache, start, logits_last=block_size).float()
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph, pool=self._pool), torch.no_grad():
            out = self._forward(ids, pos, cache, start, logits_last=block_size).float()
        return _Graph(graph, ids, pos, start, out)

    def step(self, cache: KVCache, ids: Tensor, pos: Tensor, start: Tensor, block_size: int) -> Tensor:
        g = self._graphs.get((id(cache), ids.shape[1]))
        if g is None:  # a shape prepare() did not foresee: stay correct, run it uncaptured
            with torch.no_grad():
                return self._forward(ids, pos, cache, start, logits_last=block_size).float()
        g.ids.copy_(ids)
        g.pos.copy_(pos)
        g.start.copy_(start)
        g.graph.replay()
        return g.out
