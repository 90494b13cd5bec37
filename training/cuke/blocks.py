"""Layer blocks of mainstream LLMs as KernelBench-format PyTorch references (CuKe augmentation, part b).

DICE's CuKe adds attention and MLP blocks of mainstream models over varied input shapes (36 instances) with
kernels from a teacher, kept when correct and faster. The references are generated here, so every one is
reproducible from the model dimensions below, and they are ordinary KernelBench problems (``class Model``,
module-level sizes, ``get_inputs``, ``get_init_inputs``): the validator, the prompt and the shape variants
treat them like any other reference. Four kinds:

- ``attention`` (level 3): a Llama/Qwen decoder layer's causal GQA self-attention: q/k/v projections (Qwen
  has q/k/v biases), RoPE on q and k, each key/value head shared by ``n_heads // n_kv_heads`` query heads,
  ``F.scaled_dot_product_attention(is_causal=True)``, o projection.
- ``mlp`` (level 3): the SwiGLU MLP, ``down(silu(gate(x)) * up(x))``.
- ``rmsnorm_residual`` (level 2): the residual add fused with the next RMSNorm. The norm weight is an input,
  not a parameter initialised to ones, so a kernel that skips the multiply cannot pass.
- ``rope`` (level 2): rotary embedding applied to q and k (rotate-half convention), outputs concatenated
  along the head axis as a fused q/k kernel writes them.

Everything is float32 (KernelBench's convention, which the validator's tolerances assume); RoPE is the plain
formulation (no Llama-3 frequency scaling, which only reshapes the table a kernel reads).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass

from training.cuke.records import Pair

SOURCE = "layer-blocks"
BLOCK_KINDS = ("attention", "mlp", "rmsnorm_residual", "rope")
BLOCK_LEVELS = {"attention": 3, "mlp": 3, "rmsnorm_residual": 2, "rope": 2}


@dataclass(frozen=True)
class ModelDims:
    """One decoder layer's sizes, as the model's config.json gives them."""

    hidden_size: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    qkv_bias: bool


# Mainstream open models of DICE's time, from their config.json files: Llama-3.1-8B (the common 8B shape:
# Mistral-7B and Qwen3-8B share its attention), Qwen2.5-7B (GQA 7:1, q/k/v biases, a wide MLP) and
# Llama-3.2-1B (head_dim 64, a small-model shape).
MODELS: dict[str, ModelDims] = {
    "llama3.1-8b": ModelDims(4096, 32, 8, 128, 14336, 500000.0, 1e-5, False),
    "qwen2.5-7b": ModelDims(3584, 28, 4, 128, 18944, 1000000.0, 1e-6, True),
    "llama3.2-1b": ModelDims(2048, 32, 8, 64, 8192, 500000.0, 1e-5, False),
}
# (batch, sequence length): one long prefill, a large batch of mid-length prompts, many short sequences;
# 2048, 8192 and 4096 tokens, so the MLP and norm blocks (which see batch * seq rows) differ too.
SHAPES: tuple[tuple[int, int], ...] = ((1, 2048), (8, 1024), (32, 128))


@dataclass(frozen=True)
class BlockShape:
    """One point of the grid: a model's layer at a batch size and sequence length."""

    model: str
    batch: int
    seq_len: int

    @property
    def tag(self) -> str:
        return f"{self.model}_b{self.batch}_s{self.seq_len}"


DEFAULT_GRID: tuple[BlockShape, ...] = tuple(BlockShape(m, b, s) for m in MODELS for b, s in SHAPES)

_HEADER = """import torch
import torch.nn as nn
import torch.nn.functional as F
"""

_ROPE_HELPERS = '''

def rotate_half(x):
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((-x2, x1), dim=-1)


def rope_tables(seq_len, head_dim, theta):
    """cos and sin of position * frequency, (seq_len, head_dim), each frequency used for both halves."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    freqs = torch.outer(torch.arange(seq_len, dtype=torch.float32), inv_freq)
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos(), emb.sin()
'''

_ATTENTION = '''

class Model(nn.Module):
    """Causal GQA self-attention of a Llama/Qwen decoder layer: q/k/v projections, RoPE on q and k, each
    key/value head shared by n_heads // n_kv_heads query heads, softmax(q k^T / sqrt(head_dim)) v, then the
    output projection."""

    def __init__(self, hidden_size, n_heads, n_kv_heads, head_dim, max_seq_len, rope_theta, qkv_bias):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, head_dim
        self.q_proj = nn.Linear(hidden_size, n_heads * head_dim, bias=qkv_bias)
        self.k_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=qkv_bias)
        self.v_proj = nn.Linear(hidden_size, n_kv_heads * head_dim, bias=qkv_bias)
        self.o_proj = nn.Linear(n_heads * head_dim, hidden_size, bias=False)
        cos, sin = rope_tables(max_seq_len, head_dim, rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, x):
        b, s, _ = x.shape
        q = self.q_proj(x).view(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, s, self.n_kv_heads, self.head_dim).transpose(1, 2)
        cos, sin = self.cos[:s], self.sin[:s]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        rep = self.n_heads // self.n_kv_heads
        k = k.repeat_interleave(rep, dim=1)
        v = v.repeat_interleave(rep, dim=1)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.o_proj(out.transpose(1, 2).reshape(b, s, self.n_heads * self.head_dim))
'''

_MLP = '''

class Model(nn.Module):
    """The SwiGLU MLP of a Llama/Qwen decoder layer: down(silu(gate(x)) * up(x)), no biases."""

    def __init__(self, hidden_size, intermediate_size):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))
'''

_RMSNORM = '''

class Model(nn.Module):
    """A decoder layer's residual add followed by the next RMSNorm: h = x + residual, then
    h / sqrt(mean(h^2) + eps) * weight over the hidden axis."""

    def __init__(self, eps):
        super().__init__()
        self.eps = eps

    def forward(self, x, residual, weight):
        h = x + residual
        return h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps) * weight
'''

_ROPE = '''

class Model(nn.Module):
    """Rotary position embedding applied to q (batch, n_heads, seq, head_dim) and k (batch, n_kv_heads, seq,
    head_dim), rotate-half convention; the rotated q and k concatenated along the head axis."""

    def __init__(self, head_dim, max_seq_len, rope_theta):
        super().__init__()
        cos, sin = rope_tables(max_seq_len, head_dim, rope_theta)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)

    def forward(self, q, k):
        s = q.shape[2]
        cos, sin = self.cos[:s], self.sin[:s]
        q = q * cos + rotate_half(q) * sin
        k = k * cos + rotate_half(k) * sin
        return torch.cat((q, k), dim=1)
'''

# kind -> (class source, helper source, constants it declares, get_inputs body, get_init_inputs list)
_KINDS: dict[str, tuple[str, str, tuple[str, ...], str, str]] = {
    "attention": (
        _ATTENTION,
        _ROPE_HELPERS,
        (
            "batch_size",
            "seq_len",
            "hidden_size",
            "n_heads",
            "n_kv_heads",
            "head_dim",
            "rope_theta",
            "qkv_bias",
        ),
        "[torch.randn(batch_size, seq_len, hidden_size)]",
        "[hidden_size, n_heads, n_kv_heads, head_dim, seq_len, rope_theta, qkv_bias]",
    ),
    "mlp": (
        _MLP,
        "",
        ("batch_size", "seq_len", "hidden_size", "intermediate_size"),
        "[torch.randn(batch_size, seq_len, hidden_size)]",
        "[hidden_size, intermediate_size]",
    ),
    "rmsnorm_residual": (
        _RMSNORM,
        "",
        ("batch_size", "seq_len", "hidden_size", "eps"),
        "[\n        torch.randn(batch_size, seq_len, hidden_size),\n"
        "        torch.randn(batch_size, seq_len, hidden_size),\n"
        "        1.0 + 0.1 * torch.randn(hidden_size),\n    ]",
        "[eps]",
    ),
    "rope": (
        _ROPE,
        _ROPE_HELPERS,
        ("batch_size", "seq_len", "n_heads", "n_kv_heads", "head_dim", "rope_theta"),
        "[\n        torch.randn(batch_size, n_heads, seq_len, head_dim),\n"
        "        torch.randn(batch_size, n_kv_heads, seq_len, head_dim),\n    ]",
        "[head_dim, seq_len, rope_theta]",
    ),
}


def tiny_dims(dims: ModelDims) -> ModelDims:
    """The same layer shrunk for a CPU test: its GQA ratio, bias and constants, head_dim 8, 2 kv heads."""
    rep = dims.n_heads // dims.n_kv_heads
    n_heads = 2 * rep
    return ModelDims(n_heads * 8, n_heads, 2, 8, n_heads * 16, dims.rope_theta, dims.rms_eps, dims.qkv_bias)


def block_reference(kind: str, dims: ModelDims, batch: int, seq_len: int) -> str:
    """The KernelBench-format reference source of one block at one shape."""
    if kind not in _KINDS:
        raise ValueError(f"unknown layer block kind {kind!r} (use one of {', '.join(BLOCK_KINDS)})")
    cls, helpers, names, inputs, init = _KINDS[kind]
    values = {
        "batch_size": batch,
        "seq_len": seq_len,
        "hidden_size": dims.hidden_size,
        "intermediate_size": dims.intermediate_size,
        "n_heads": dims.n_heads,
        "n_kv_heads": dims.n_kv_heads,
        "head_dim": dims.head_dim,
        "rope_theta": dims.rope_theta,
        "qkv_bias": dims.qkv_bias,
        "eps": dims.rms_eps,
    }
    constants = "".join(f"{name} = {values[name]!r}\n" for name in names)
    return (
        f"{_HEADER}{helpers}{cls}\n\n{constants}\n\n"
        f"def get_inputs():\n    return {inputs}\n\n\n"
        f"def get_init_inputs():\n    return {init}\n"
    )


def layer_block_references(
    grid: Iterable[BlockShape | tuple[str, int, int]] | None = None,
    *,
    kinds: Iterable[str] = BLOCK_KINDS,
    scale_down: bool = False,
) -> list[Pair]:
    """Every kind over every grid point (default: 3 models x 3 shapes x 4 kinds = 36 references), as Pairs
    with no candidate (``cuda_code`` None) for a teacher to solve. ``scale_down``: the same kinds and models
    at tiny sizes (``tiny_dims``, batch 2, sequence 8; one per kind and model), so a CPU test can run every
    forward."""
    points = [p if isinstance(p, BlockShape) else BlockShape(*p) for p in (grid or DEFAULT_GRID)]
    out: list[Pair] = []
    seen: set[str] = set()
    for kind in kinds:
        for point in points:
            if point.model not in MODELS:
                raise ValueError(
                    f"unknown model {point.model!r} in the block grid (known: {', '.join(MODELS)})"
                )
            dims = MODELS[point.model]
            batch, seq_len, tag = point.batch, point.seq_len, point.tag
            if scale_down:
                dims, batch, seq_len, tag = tiny_dims(dims), 2, 8, f"{point.model}_tiny"
            if f"block:{kind}:{tag}" in seen:
                continue
            seen.add(f"block:{kind}:{tag}")
            out.append(
                Pair(
                    id=f"block:{kind}:{tag}",
                    source=SOURCE,
                    pytorch_code=block_reference(kind, dims, batch, seq_len),
                    cuda_code=None,
                    level=BLOCK_LEVELS[kind],
                    name=f"{kind}_{tag}.py",
                    meta={
                        "block": kind,
                        "model": point.model,
                        "batch": batch,
                        "seq_len": seq_len,
                        **asdict(dims),
                    },
                )
            )
    return out


__all__ = [
    "BLOCK_KINDS",
    "BLOCK_LEVELS",
    "DEFAULT_GRID",
    "MODELS",
    "SHAPES",
    "SOURCE",
    "BlockShape",
    "ModelDims",
    "block_reference",
    "layer_block_references",
    "tiny_dims",
]
