"""SDAR / DICE block-diffusion transformer (Qwen3 decoder layout) and its config.

Shapes: B batch, T query length, S key length (cache slots), H query heads, G kv heads, D head dim.
Module and parameter names follow the Hugging Face Qwen3/SDAR checkpoints (``model.layers.N.self_attn.q_proj``
...), so ``state_dict`` keys are the safetensors keys of a released checkpoint.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.checkpoint import checkpoint

from engine.config_checks import (  # noqa: F401 - re-exported: the names callers know
    KNOWN_ARCHITECTURES,
    KNOWN_MODEL_TYPES,
    REQUIRED_FIELDS,
    config_fields,
)
from engine.errors import ConfigError

if TYPE_CHECKING:
    from engine.kv_cache import KVCache

try:  # flex_attention is optional: plain SDPA covers every mask the engine builds itself
    from torch.nn.attention.flex_attention import BlockMask, create_block_mask, flex_attention
except ImportError:  # pragma: no cover - torch < 2.5
    BlockMask = None
    create_block_mask = None
    flex_attention = None


@dataclass(frozen=True)
class ModelConfig:
    """The fields of an SDAR/DICE ``config.json`` this engine reads; unknown fields are kept in ``extra``."""

    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    rms_norm_eps: float = 1e-6
    rope_theta: float = 1_000_000.0
    max_position_embeddings: int = 32768
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    hidden_act: str = "silu"
    block_size: int = 4
    mask_token_id: int | None = None
    bos_token_id: int | None = None
    eos_token_id: int | tuple[int, ...] | None = None
    pad_token_id: int | None = None
    model_type: str = "sdar"
    architectures: tuple[str, ...] = ("SDARForCausalLM",)
    torch_dtype: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict, compare=False, hash=False, repr=False)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], *, source: str = "config") -> ModelConfig:
        """Validate and convert a parsed config.json; ``source`` names the file in error messages. Every
        field's type and bounds are checked (:mod:`engine.config_checks`) before anything is sized by it."""
        known = frozenset(f.name for f in dataclasses.fields(cls))
        return cls(**config_fields(data, source, known))

    @classmethod
    def from_json(cls, path: str | Path) -> ModelConfig:
        path = Path(path)
        if path.is_dir() and path.name != "config.json":
            path = path / "config.json"
        if path.is_dir():
            raise ConfigError(f"{path}: is a folder, not a file (config.json must be a JSON file)")
        if not path.is_file():
            raise ConfigError(f"{path}: config.json not found")
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"{path}: not valid JSON ({exc})") from exc
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read ({exc.strerror or exc})") from exc
        return cls.from_dict(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = dict(self.extra)
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    def to_json(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps(self.to_dict(), indent=2, sort_keys=True) + "\n", encoding="utf-8")

    @property
    def num_parameters(self) -> int:
        d, h, g, hd = self.hidden_size, self.num_attention_heads, self.num_key_value_heads, self.head_dim
        attn = d * h * hd * 2 + d * g * hd * 2 + 2 * hd
        mlp = 3 * d * self.intermediate_size
        layers = self.num_hidden_layers * (attn + mlp + 2 * d)
        head = 0 if self.tie_word_embeddings else self.vocab_size * d
        return self.vocab_size * d + layers + d + head


def block_causal_mask(seq_len: int, block_size: int, device: torch.device | str | None = None) -> Tensor:
    """(1, 1, T, T) bool: position i may attend to j when j's block is not after i's block."""
    blocks = torch.arange(seq_len, device=device) // block_size
    return (blocks[:, None] >= blocks[None, :])[None, None]


def block_causal_block_mask(seq_len: int, block_size: int, device: torch.device | str = "cpu") -> BlockMask:
    """The same block-causal pattern as a flex_attention ``BlockMask`` (for training on long sequences)."""
    if create_block_mask is None:  # pragma: no cover
        raise RuntimeError("flex_attention needs torch >= 2.5")

    def mask_mod(b: Tensor, h: Tensor, q_idx: Tensor, kv_idx: Tensor) -> Tensor:
        return q_idx // block_size >= kv_idx // block_size

    return create_block_mask(mask_mod, None, None, seq_len, seq_len, device=device)


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        # One fused kernel on CUDA (statistics in float32); the reference Qwen3 RMSNorm spends seven small
        # kernels, which dominate a decode step of a few tokens.
        return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)


def rope_inv_freq(head_dim: int, theta: float, device: torch.device | str | None = None) -> Tensor:
    """(D/2,) float32 inverse frequencies of Qwen3's RoPE (as transformers computes them)."""
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))


def rope_cos_sin(
    position_ids: Tensor, head_dim: int, theta: float, dtype: torch.dtype
) -> tuple[Tensor, Tensor]:
    """cos and signed sin, each (B, 1, T, D), for the rotate-half RoPE convention of Qwen3.

    Angles are computed in float32 as transformers does. The sin table carries the rotation's sign
    ([-sin, sin]) so that ``apply_rope`` needs a roll instead of a split, negate and concatenate.
    """
    inv_freq = rope_inv_freq(head_dim, theta, position_ids.device)
    freqs = position_ids.float()[..., None] * inv_freq  # (B, T, D/2)
    cos = torch.cat((freqs, freqs), dim=-1).cos()
    sin = freqs.sin()
    return cos.to(dtype)[:, None], torch.cat((-sin, sin), dim=-1).to(dtype)[:, None]


def apply_rope(x: Tensor, cos: Tensor, signed_sin: Tensor) -> Tensor:
    """x * cos + rotate_half(x) * sin, where rotate_half(x) * sin == roll(x, D/2) * [-sin, sin]."""
    return torch.addcmul(x * cos, x.roll(x.shape[-1] // 2, dims=-1), signed_sin)


def group_mask(mask: Tensor, rep: int) -> Tensor:
    """(B|1, 1, T, S) -> (B|1, 1, rep*T, S): the mask for queries folded by ``_grouped_sdpa``."""
    b, _, t, s = mask.shape
    return mask[:, :, None].expand(b, 1, rep, t, s).reshape(b, 1, rep * t, s)


def _grouped_sdpa(q: Tensor, k: Tensor, v: Tensor, grouped_mask: Tensor) -> Tensor:
    """SDPA for short queries against a long GQA cache without repeating K/V.

    q (B, H, T, D), k/v (B, G, S, D), grouped_mask (B|1, 1, H/G*T, S) bool from ``group_mask``. The H/G
    query heads that share a kv head are folded into the query length, so K/V are read once per kv head.
    """
    b, h, t, d = q.shape
    g = k.shape[1]
    out = F.scaled_dot_product_attention(q.reshape(b, g, (h // g) * t, d), k, v, attn_mask=grouped_mask)
    return out.reshape(b, h, t, d)


# Rows up to which a CPU linear with out >= in features runs as W @ x^T. For a few rows against a weight
# that is not in cache (a decode step streams all ~20 MB of dice-tiny's weights), MKL (torch 2.13) runs
# that orientation about twice as fast as F.linear's x @ W^T: for the 4- or 8-token steps of one 33-step
# request, gate/up went from 46.6 to 22.9 ms and lm_head from 36.8 to 16.4 ms under torch.profiler.
# With out < in (down_proj, 1024 -> 256) it is about twice as slow, so those stay on F.linear.
SKINNY_ROWS = 16


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """F.linear; on CPU as (out, in) @ (in, rows) when x (..., in) has at most SKINNY_ROWS rows and
    out >= in (same values up to float summation order)."""
    rows = x.numel() // x.shape[-1]
    out_f, in_f = weight.shape
    if x.device.type != "cpu" or rows > SKINNY_ROWS or rows == 0 or out_f < in_f:
        return F.linear(x, weight, bias)
    y = torch.mm(weight, x.reshape(rows, x.shape[-1]).t()).t()  # (rows, out), transposed strides
    if bias is not None:
        y = y + bias
    return y.reshape(*x.shape[:-1], out_f)


def _fuse_linears(*linears: nn.Linear) -> tuple[Tensor, Tensor | None]:
    """One (sum of out, in) weight holding the linears' weights; they become row views into it, so the
    checkpoint keys and memory stay as they were. Inference only: the views no longer require grad."""
    weight = torch.cat([lin.weight.detach() for lin in linears], 0)
    has_bias = linears[0].bias is not None
    bias = torch.cat([lin.bias.detach() for lin in linears], 0) if has_bias else None
    start = 0
    for lin in linears:
        end = start + lin.out_features
        lin.weight = nn.Parameter(weight[start:end], requires_grad=False)
        if bias is not None:
            lin.bias = nn.Parameter(bias[start:end], requires_grad=False)
        start = end
    return weight, bias


class Attention(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.layer_idx = layer_idx
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = config.head_dim
        hd, bias = config.head_dim, config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.num_heads * hd, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.num_kv_heads * hd, bias=bias)
        self.o_proj = nn.Linear(self.num_heads * hd, config.hidden_size, bias=bias)
        self.q_norm = RMSNorm(hd, config.rms_norm_eps)
        self.k_norm = RMSNorm(hd, config.rms_norm_eps)
        self.fused_qkv: tuple[Tensor, Tensor | None] | None = None

    def fuse_projections(self) -> None:
        self.fused_qkv = _fuse_linears(self.q_proj, self.k_proj, self.v_proj)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | BlockMask,
        cache: KVCache | None = None,
        slots: Tensor | None = None,
    ) -> Tensor:
        b, t, _ = x.shape
        hd = self.head_dim
        if self.fused_qkv is not None:  # one GEMM instead of three
            qkv = linear(x, *self.fused_qkv)
            q_lin, k_lin, v_lin = qkv.split(
                (self.num_heads * hd, self.num_kv_heads * hd, self.num_kv_heads * hd), -1
            )
        else:
            q_lin, k_lin, v_lin = self.q_proj(x), self.k_proj(x), self.v_proj(x)
        q = self.q_norm(q_lin.view(b, t, self.num_heads, hd)).transpose(1, 2)  # (B, H, T, D)
        k = self.k_norm(k_lin.view(b, t, self.num_kv_heads, hd)).transpose(1, 2)  # (B, G, T, D)
        v = v_lin.view(b, t, self.num_kv_heads, hd).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if cache is not None:
            k, v = cache.write(self.layer_idx, slots, k, v)  # (B, G, S, D): the whole cache, masked by `mask`
            out = _grouped_sdpa(q, k, v, mask)
        elif BlockMask is not None and isinstance(mask, BlockMask):
            out = flex_attention(q, k, v, block_mask=mask, enable_gqa=True)
        else:
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, enable_gqa=self.num_heads != self.num_kv_heads
            )
        out = out.transpose(1, 2).reshape(b, t, self.num_heads * hd)
        if self.fused_qkv is not None:  # inference (see linear); modules otherwise, so wrappers (LoRA) apply
            return linear(out, self.o_proj.weight, self.o_proj.bias)
        return self.o_proj(out)


class MLP(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)
        self.fused_gate_up: tuple[Tensor, Tensor | None] | None = None

    def fuse_projections(self) -> None:
        self.fused_gate_up = _fuse_linears(self.gate_proj, self.up_proj)

    def forward(self, x: Tensor) -> Tensor:
        if self.fused_gate_up is not None:
            gate, up = linear(x, *self.fused_gate_up).chunk(2, dim=-1)
            return linear(F.silu(gate) * up, self.down_proj.weight)
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_idx: int) -> None:
        super().__init__()
        self.self_attn = Attention(config, layer_idx)
        self.mlp = MLP(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        x: Tensor,
        cos: Tensor,
        sin: Tensor,
        mask: Tensor | BlockMask,
        cache: KVCache | None = None,
        slots: Tensor | None = None,
    ) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask, cache, slots)
        return x + self.mlp(self.post_attention_layernorm(x))


class Backbone(nn.Module):
    """``model.*`` in checkpoint keys: embeddings, layers, final norm."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(DecoderLayer(config, i) for i in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)


class DiceModel(nn.Module):
    """Block-diffusion LM: the logit at position i predicts token i (no shift)."""

    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        self.config = config
        self.model = Backbone(config)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.model.embed_tokens.weight
        self.gradient_checkpointing = False

    def tie_weights(self) -> None:
        self.lm_head.weight = self.model.embed_tokens.weight

    @torch.no_grad()
    def fuse_projections(self) -> None:
        """Inference: q/k/v and gate/up run as one GEMM each (fewer, larger kernels per decode step).

        The original parameters become views into the fused weights, so ``state_dict`` keys, values and
        memory are unchanged; the model can no longer be trained. Call it once the model is on its device.
        """
        if self.training:
            raise RuntimeError("fuse_projections is for inference; call model.eval() first")
        for layer in self.model.layers:
            if layer.self_attn.fused_qkv is None:
                layer.self_attn.fuse_projections()
                layer.mlp.fuse_projections()

    @torch.no_grad()
    def init_weights(
        self, *, std: float = 0.02, seed: int | None = None, head_std: float | None = None
    ) -> None:
        """Random normal init (norms to one); ``seed`` makes it reproducible on any device."""
        gen = None
        if seed is not None:
            device = self.lm_head.weight.device
            gen = torch.Generator(device=device)
            gen.manual_seed(seed)
        for name, p in self.named_parameters():
            if name.endswith("norm.weight"):
                p.fill_(1.0)
            elif name.endswith(".bias"):
                p.zero_()
            else:
                s = head_std if (head_std is not None and name == "lm_head.weight") else std
                p.normal_(0.0, s, generator=gen)

    def _rope(self, position_ids: Tensor, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
        return rope_cos_sin(position_ids, self.config.head_dim, self.config.rope_theta, dtype)

    def forward(
        self,
        input_ids: Tensor,
        position_ids: Tensor | None = None,
        mask: Tensor | BlockMask | None = None,
    ) -> Tensor:
        """Logits (B, T, V) of a full sequence.

        mask: None = block-causal over the sequence with ``config.block_size``; a flex_attention
        BlockMask; or a bool tensor (B|1, 1, T, T), True = may attend. Every query row must see at least
        one key.
        """
        b, t = input_ids.shape
        device = input_ids.device
        if position_ids is None:
            position_ids = torch.arange(t, device=device)[None].expand(b, t)
        if mask is None:
            mask = block_causal_mask(t, self.config.block_size, device)
        elif isinstance(mask, Tensor) and (
            mask.dtype != torch.bool or mask.dim() != 4 or mask.shape[1] != 1 or mask.shape[-2:] != (t, t)
        ):
            raise ValueError(
                f"mask must be a bool (B|1, 1, {t}, {t}) tensor, got {mask.dtype} {tuple(mask.shape)}"
            )
        x = self.model.embed_tokens(input_ids)
        cos, sin = self._rope(position_ids, x.dtype)
        for layer in self.model.layers:
            if self.gradient_checkpointing and self.training and torch.is_grad_enabled():
                x = checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        return self.lm_head(self.model.norm(x))

    def forward_cached(
        self,
        input_ids: Tensor,
        position_ids: Tensor,
        cache: KVCache,
        start: Tensor,
        *,
        logits_last: int | None = None,
    ) -> Tensor:
        """Run (B, T) tokens that occupy cache slots [start, start + T), writing their K/V into the cache.

        Attention follows the cache's visibility rule (earlier blocks + own block, bidirectional inside a
        block, left padding hidden). ``start`` is a 1-element long tensor so the call can be graph-captured.
        Returns logits of the last ``logits_last`` positions (all when None).
        """
        t = input_ids.shape[1]
        rep = self.config.num_attention_heads // self.config.num_key_value_heads
        mask = group_mask(cache.visibility(start, t), rep)  # (B, 1, rep*T, S), built once for all layers
        x = self.model.embed_tokens(input_ids)
        if x.device.type == "cpu":
            # Additive float mask once here instead of SDPA's bool -> float `where` in every layer's call
            # (the same values; one (rep*T, S) pass per layer less, ~2 % of a CPU decode step).
            mask = torch.zeros(mask.shape, dtype=x.dtype).masked_fill_(~mask, float("-inf"))
        slots = cache.slots(start, t)
        cos, sin = self._rope(position_ids, x.dtype)
        for layer in self.model.layers:
            x = layer(x, cos, sin, mask, cache, slots)
        if logits_last is not None:
            x = x[:, t - logits_last :]
        return linear(self.model.norm(x), self.lm_head.weight, self.lm_head.bias)


def param_bytes(model: nn.Module) -> int:
    """Bytes of distinct parameter storage (tied weights counted once)."""
    seen: set[int] = set()
    total = 0
    for p in model.parameters():
        if p.data_ptr() in seen:
            continue
        seen.add(p.data_ptr())
        total += p.numel() * p.element_size()
    return total


def expected_shapes(config: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint key -> shape implied by the config (lm_head included even when tied)."""
    with torch.device("meta"):
        model = DiceModel(config)
    return {k: tuple(v.shape) for k, v in model.state_dict(keep_vars=True).items()}


__all__ = [
    "ModelConfig",
    "DiceModel",
    "block_causal_mask",
    "block_causal_block_mask",
    "rope_cos_sin",
    "apply_rope",
    "param_bytes",
    "expected_shapes",
]
