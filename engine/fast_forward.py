"""The cached forward of a denoising step through the Triton kernels (``engine.triton_kernels``).

Same contract as ``DiceModel.forward_cached`` (same arguments, same cache writes, logits of the last
``logits_last`` positions), for steps of at most ``MAX_ROWS`` rows (batch x tokens) on a CUDA device with
fused projections; anything else goes to the model's own forward. Per layer: RMSNorm, the q/k/v product,
one kernel for the q/k norms + RoPE + cache write, attention (two kernels), o_proj with the residual add,
RMSNorm, gate/up with SiLU, down_proj with the residual add: 9-11 kernels where the eager step runs ~25.
(An RMSNorm fused into the products' prologue, its row sums reduced in every K step, measured 2.4x
slower products on the H200 and was taken out: benchmarks/results/engine_kernels_notes.md.)
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from engine import triton_kernels as tk
from engine.kv_cache import KVCache
from engine.model import DiceModel, rope_inv_freq


def supported(model: DiceModel) -> str | None:
    """None when the fast forward can run this model, else why not (in words)."""
    c = model.config
    if not tk.available(model.lm_head.weight.device):
        return "needs Triton and a CUDA device"
    if model.lm_head.weight.dtype not in (torch.bfloat16, torch.float16):
        # tl.dot rounds float32 operands through tf32: the torch path keeps float32 exact
        return f"{model.lm_head.weight.dtype} weights (the kernels take bf16/fp16)"
    if c.attention_bias:
        return "attention biases are not supported by the fast kernels"
    if c.head_dim & (c.head_dim - 1) or c.head_dim < 16:
        return f"head_dim {c.head_dim} is not a power of two >= 16"
    if c.hidden_act != "silu":
        return f"activation {c.hidden_act!r} (the kernels fuse SiLU)"
    if any(layer.self_attn.fused_qkv is None for layer in model.model.layers):
        return "needs fused projections (DiceModel.fuse_projections)"
    return None


class FastForward:
    """Callable as ``model.forward_cached``; falls back to it for steps of more than MAX_ROWS rows."""

    def __init__(self, model: DiceModel) -> None:
        why = supported(model)
        if why is not None:
            raise ValueError(f"fast kernels unavailable: {why}")
        self.model = model
        c = model.config
        device = model.lm_head.weight.device
        # The table rope_cos_sin uses (angles = position * inv_freq, in float32).
        self.inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, device)

    @torch.no_grad()
    def __call__(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        cache: KVCache,
        start: Tensor,
        *,
        logits_last: int | None = None,
    ) -> Tensor:
        b, t = input_ids.shape
        m = self.model
        if b * t > tk.MAX_ROWS:
            return m.forward_cached(input_ids, position_ids, cache, start, logits_last=logits_last)
        c = m.config
        eps = c.rms_norm_eps
        hidden = (c.hidden_size,)
        pos = position_ids.expand(b, t).contiguous()
        x = m.model.embed_tokens(input_ids)
        for i, layer in enumerate(m.model.layers):
            attn, mlp = layer.self_attn, layer.mlp
            h = F.rms_norm(x, hidden, layer.input_layernorm.weight, eps)
            qkv = tk.skinny_linear(h, attn.fused_qkv[0])
            q = tk.qk_norm_rope_store(
                qkv, attn.q_norm.weight, attn.k_norm.weight, self.inv_freq, pos, start,
                cache.k[i], cache.v[i], num_heads=c.num_attention_heads,
                num_kv_heads=c.num_key_value_heads, eps=eps,
            )  # fmt: skip
            o = tk.decode_attention(
                q, cache.k[i], cache.v[i], start, cache.offsets, tokens=t, block_size=cache.block_size
            )
            x = tk.skinny_linear(o, attn.o_proj.weight, residual=x.reshape(b * t, -1)).reshape(b, t, -1)
            h = F.rms_norm(x, hidden, layer.post_attention_layernorm.weight, eps)
            a = tk.skinny_gate_up(h, mlp.fused_gate_up[0])
            x = tk.skinny_linear(a, mlp.down_proj.weight, residual=x.reshape(b * t, -1)).reshape(b, t, -1)
        if logits_last is not None:
            x = x[:, t - logits_last :]
        h = F.rms_norm(x, hidden, m.model.norm.weight, eps)
        return tk.skinny_linear(h, m.lm_head.weight)
