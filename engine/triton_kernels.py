"""Triton kernels for the decode step of a few tokens (batch x block <= 16 rows): the engine's fast path.

Why our own kernels: a denoising step multiplies 4 (or 8) rows by every weight of the model, which is a
matrix-vector product in all but name. cuBLAS picks GEMM tiles made for many rows, and the eager step spends
~25 small kernels per layer around them (norms, RoPE, cache writes, the attention mask, transposes). These
kernels read each weight once with enough programs in flight to keep the memory system busy (split-K where
the output is narrow), fuse what sits between the matrix products, and attend the few query rows against the
cache directly, from the slot numbers, instead of through a (B, 1, T, S) mask:

- ``skinny_linear``: y = x @ W^T (+ residual), x of at most 16 rows; split-K partials reduced by a second
  kernel when the output is too narrow to fill the GPU.
- ``skinny_gate_up``: silu(x @ Wg^T) * (x @ Wu^T) from the fused gate/up weight, in one kernel.
- ``qk_norm_rope_store``: the per-head RMSNorm of q and k, RoPE on both, q to a buffer and k, v into their
  cache slots, in one kernel.
- ``decode_attention``: flash-decoding over the cache (split over slots, then one combine), the cache's
  visibility rule applied from ``start`` and the rows' offsets; writes the (B*T, H*D) input of o_proj.

Roundings follow the eager path where it is cheap to do so (bf16 results of the products before the residual
add, cos/sin rounded to the activations' dtype as ``rope_cos_sin`` does); the sums run in another order, so
results match eager to bf16 rounding, not bit for bit (``tests/engine/test_triton_kernels.py``, and on the GPU
``tests/engine/test_gpu_engine.py``). Triton is imported only here; without it (CPU torch wheels) the engine
keeps its eager and graph paths. ``TRITON_INTERPRET=1`` runs these kernels on the CPU (tests; not bf16).
"""

from __future__ import annotations

import functools
import json
import os
import re
from pathlib import Path

import torch
from torch import Tensor

try:
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - CPU-only torch wheels ship no Triton
    triton = None
    tl = None

MAX_ROWS = 16  # rows (batch x query tokens) the skinny kernels take; more go to F.linear / SDPA


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET") == "1"


def available(device: torch.device | str) -> bool:
    """Whether these kernels can run on ``device``: Triton present and a CUDA device (or the interpreter)."""
    if triton is None:
        return False
    return torch.device(device).type == "cuda" or interpreting()


if triton is not None:

    @triton.jit
    def _skinny_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        res_ptr,
        M,
        N,
        stride_xm,
        stride_wn,
        stride_om,
        stride_os,
        stride_rm,
        K_SPLIT,
        BM: tl.constexpr,
        BN: tl.constexpr,
        BK: tl.constexpr,
        PARTIAL: tl.constexpr,
        GATED: tl.constexpr,
        RESIDUAL: tl.constexpr,
    ):
        """One (BN columns, K_SPLIT of K) tile. GATED: columns n of the gate half and of the up half (N
        apart) give silu(g) * u. PARTIAL: float32 partial sums at out[pid_s] (reduced by _reduce_kernel)."""
        pid_n = tl.program_id(0)
        pid_s = tl.program_id(1)
        rm = tl.arange(0, BM)
        rn = pid_n * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        k0 = pid_s * K_SPLIT
        mask_m = rm[:, None] < M
        mask_n = rn[:, None] < N
        x_ptrs = x_ptr + rm[:, None] * stride_xm + (k0 + rk)[None, :]
        w_ptrs = w_ptr + rn[:, None] * stride_wn + (k0 + rk)[None, :]
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        acc_up = tl.zeros((BM, BN), dtype=tl.float32)
        for _ in range(0, K_SPLIT, BK):
            x = tl.load(x_ptrs, mask=mask_m, other=0.0)
            w = tl.load(w_ptrs, mask=mask_n, other=0.0)
            acc = tl.dot(x, tl.trans(w), acc)
            if GATED:
                wu = tl.load(w_ptrs + N * stride_wn, mask=mask_n, other=0.0)
                acc_up = tl.dot(x, tl.trans(wu), acc_up)
            x_ptrs += BK
            w_ptrs += BK
        rn_row = rn[None, :]
        out_mask = mask_m & (rn_row < N)
        if PARTIAL:
            tl.store(out_ptr + pid_s * stride_os + rm[:, None] * stride_om + rn_row, acc, mask=out_mask)
        else:
            dtype = out_ptr.dtype.element_ty
            if GATED:  # as eager: silu(gate) and up rounded to the activations' dtype, then their product
                g = acc.to(dtype).to(tl.float32)
                u = acc_up.to(dtype).to(tl.float32)
                y = (g / (1.0 + tl.exp(-g))).to(dtype).to(tl.float32) * u
            else:
                y = acc.to(dtype).to(tl.float32)
            if RESIDUAL:
                r = tl.load(res_ptr + rm[:, None] * stride_rm + rn_row, mask=out_mask, other=0.0)
                y = y + r.to(tl.float32)
            tl.store(out_ptr + rm[:, None] * stride_om + rn_row, y.to(dtype), mask=out_mask)

    @triton.jit
    def _reduce_kernel(
        part_ptr, out_ptr, res_ptr, total, N, stride_om, stride_rm, SPLIT: tl.constexpr,
        RESIDUAL: tl.constexpr, BLOCK: tl.constexpr,
    ):  # fmt: skip
        """out[m, n] = sum over splits of part[s, m, n] (+ residual), in the output's dtype."""
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < total
        acc = tl.zeros((BLOCK,), dtype=tl.float32)
        for s in range(SPLIT):
            acc += tl.load(part_ptr + s * total + offs, mask=mask, other=0.0)
        dtype = out_ptr.dtype.element_ty
        y = acc.to(dtype).to(tl.float32)
        m = offs // N
        n = offs % N
        if RESIDUAL:
            y += tl.load(res_ptr + m * stride_rm + n, mask=mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + m * stride_om + n, y.to(dtype), mask=mask)


CONFIG_DIR = Path(__file__).parent / "kernel_configs"


def device_key(name: str) -> str:
    """The file stem of a device's tuned-config table: ``NVIDIA H200`` -> ``NVIDIA_H200``."""
    return re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_")


def rows_bucket(rows: int) -> int:
    """The row counts the tables are tuned for: a step of 4 tokens, an 8-token first step, up to 16."""
    return 4 if rows <= 4 else (8 if rows <= 8 else 16)


def table_key(n: int, k: int, gated: bool, rows: int) -> str:
    return f"{n}x{k}x{'gated' if gated else 'linear'}x{rows_bucket(rows)}"


@functools.lru_cache(maxsize=8)
def config_table(device_name: str) -> dict[str, tuple[int, int, int, int, int]]:
    """The tuned (BN, BK, split, warps, stages) per ``table_key`` for a device, {} where none was measured.

    Like vLLM's per-GPU fused-MoE tables: the best tile config depends on the chip, so it is measured on it
    (``benchmarks/engine_kernels.py --write-configs``: CUDA-graph timing of every config, weights rotated past
    the L2) and looked up here; shapes or chips without a table use the heuristic."""
    path = CONFIG_DIR / f"{device_key(device_name)}.json"
    try:
        data = json.loads(path.read_text())
        return {key: tuple(int(v) for v in cfg) for key, cfg in data["skinny"].items()}  # type: ignore[misc]
    except (OSError, ValueError, KeyError, TypeError):
        return {}


@functools.lru_cache(maxsize=512)
def skinny_config(
    n: int, k: int, gated: bool = False, rows: int = 4, device_name: str = ""
) -> tuple[int, int, int, int, int]:
    """(BN, BK, split, num_warps, num_stages) for an (n, k) weight times ``rows`` rows.

    The device's measured table first (``config_table``). Otherwise a heuristic: enough programs for every
    SM to stream weights (a few hundred) with each program reading a long contiguous run of its rows; a
    split of K is paid with a second, small kernel, so it is used only when the columns alone give too few
    programs.
    """
    tuned = config_table(device_name).get(table_key(n, k, gated, rows)) if device_name else None
    if tuned is not None and k % (tuned[1] * tuned[2]) == 0 and not (gated and tuned[2] > 1):
        return tuned
    bn = 32 if n >= 8192 and not gated else 16
    bk = 256 if k % 256 == 0 else (128 if k % 128 == 0 else 64)
    tiles = -(-n // bn)
    split = 1
    while not gated and tiles * split < 264 and k % (bk * split * 2) == 0 and k // (split * 2) >= 1024:
        split *= 2
    return bn, bk, split, 4, 4


@functools.lru_cache(maxsize=16)
def _cuda_name(index: int) -> str:
    return torch.cuda.get_device_name(index)


def _device_name(device: torch.device) -> str:
    """The name the tuned tables are keyed by ("" off CUDA: the interpreter uses the heuristic)."""
    if device.type != "cuda":
        return ""
    return _cuda_name(device.index if device.index is not None else torch.cuda.current_device())


def _rows(x: Tensor) -> Tensor:
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def skinny_linear(
    x: Tensor,
    weight: Tensor,
    residual: Tensor | None = None,
    *,
    config: tuple[int, int, int, int, int] | None = None,
) -> Tensor:
    """x (..., K) @ weight (N, K)^T (+ residual (..., N)), for at most MAX_ROWS rows of x."""
    k = x.shape[-1]
    n = weight.shape[0]
    x2 = _rows(x)
    m = x2.shape[0]
    out = torch.empty(m, n, dtype=x.dtype, device=x.device)
    res = None if residual is None else residual.reshape(m, n)
    cfg = config or skinny_config(n, k, False, m, _device_name(x.device))
    _launch(x2, weight, out, res, n, cfg, gated=False)
    return out.reshape(*x.shape[:-1], n)


def skinny_gate_up(x: Tensor, gate_up: Tensor, *, config=None) -> Tensor:
    """silu(x @ gate^T) * (x @ up^T) with gate_up = cat([gate, up]) (2I, K): one kernel, no split."""
    k = x.shape[-1]
    n = gate_up.shape[0] // 2
    x2 = _rows(x)
    out = torch.empty(x2.shape[0], n, dtype=x.dtype, device=x.device)
    bn, bk, _, warps, stages = config or skinny_config(n, k, True, x2.shape[0], _device_name(x.device))
    _launch(x2, gate_up, out, None, n, (bn, bk, 1, warps, stages), gated=True)
    return out.reshape(*x.shape[:-1], n)


def _launch(x2, weight, out, res, n, config, *, gated: bool) -> None:
    m, k = x2.shape
    if m > MAX_ROWS:
        raise ValueError(f"skinny kernels take at most {MAX_ROWS} rows, got {m}")
    if weight.stride(-1) != 1:
        raise ValueError("the weight must be contiguous along K")
    bn, bk, split, warps, stages = config
    if k % (bk * split):
        raise ValueError(f"K={k} is not a multiple of BK x split = {bk * split}")
    tiles = triton.cdiv(n, bn)
    kw = dict(BM=MAX_ROWS, BN=bn, BK=bk, GATED=gated, num_warps=warps, num_stages=stages)
    if split == 1:
        _skinny_kernel[(tiles, 1)](
            x2, weight, out, res if res is not None else out, m, n, x2.stride(0), weight.stride(0),
            out.stride(0), 0, res.stride(0) if res is not None else 0, k,
            PARTIAL=False, RESIDUAL=res is not None, **kw,
        )  # fmt: skip
        return
    part = torch.empty(split, m, n, dtype=torch.float32, device=x2.device)
    _skinny_kernel[(tiles, split)](
        x2, weight, part, part, m, n, x2.stride(0), weight.stride(0), n, m * n, 0, k // split,
        PARTIAL=True, RESIDUAL=False, **kw,
    )  # fmt: skip
    total = m * n
    _reduce_kernel[(triton.cdiv(total, 1024),)](
        part, out, res if res is not None else out, total, n, out.stride(0),
        res.stride(0) if res is not None else 0, SPLIT=split, RESIDUAL=res is not None, BLOCK=1024,
    )  # fmt: skip


if triton is not None:
    try:  # the precise cos/sin (angles reach thousands of radians; the fast approximations do not hold there)
        from triton.language.extra import libdevice
    except ImportError:  # pragma: no cover - older Triton
        from triton.language.extra.cuda import libdevice

    @triton.jit
    def _qk_norm_rope_kernel(
        qkv_ptr, qnw_ptr, knw_ptr, inv_freq_ptr, pos_ptr, start_ptr, q_out_ptr, k_ptr, v_ptr,
        T, H, G, stride_qkv, stride_cb, stride_cg, stride_cs, eps,
        D: tl.constexpr, INTERPRET: tl.constexpr,
    ):  # fmt: skip
        """Program (row, head): heads < H are q heads (normed, rotated, to q_out (M, H, D)); the rest are kv
        heads g (k normed, rotated and v as it is, to cache slot start + t of batch row b)."""
        row = tl.program_id(0)
        head = tl.program_id(1)
        half: tl.constexpr = D // 2
        d = tl.arange(0, D)
        rot = (d + half) % D
        is_q = head < H
        col = tl.where(is_q, head * D, H * D + (head - H) * D)
        base = qkv_ptr + row * stride_qkv + col
        x = tl.load(base + d).to(tl.float32)
        xr = tl.load(base + rot).to(tl.float32)
        dtype = q_out_ptr.dtype.element_ty
        w = tl.where(is_q, tl.load(qnw_ptr + d), tl.load(knw_ptr + d)).to(tl.float32)
        wr = tl.where(is_q, tl.load(qnw_ptr + rot), tl.load(knw_ptr + rot)).to(tl.float32)
        rstd = 1.0 / tl.sqrt(tl.sum(x * x, 0) / D + eps)
        xn = (x * rstd * w).to(dtype).to(tl.float32)
        xrn = (xr * rstd * wr).to(dtype).to(tl.float32)
        angle = tl.load(pos_ptr + row).to(tl.float32) * tl.load(inv_freq_ptr + d % half)
        if INTERPRET:  # the interpreter has no libdevice; its tl.cos/tl.sin are NumPy's (precise)
            cos = tl.cos(angle)
            sin = tl.sin(angle)
        else:
            cos = libdevice.cos(angle)
            sin = libdevice.sin(angle)
        cos = cos.to(dtype).to(tl.float32)
        sin = tl.where(d < half, -sin, sin).to(dtype).to(tl.float32)
        y = ((xn * cos).to(dtype).to(tl.float32) + xrn * sin).to(dtype)
        if is_q:
            tl.store(q_out_ptr + (row * H + head) * D + d, y)
        else:
            g = head - H
            b = row // T
            slot = tl.load(start_ptr) + row % T
            off = b * stride_cb + g * stride_cg + slot * stride_cs + d
            tl.store(k_ptr + off, y)
            v = tl.load(qkv_ptr + row * stride_qkv + (H + G) * D + g * D + d)
            tl.store(v_ptr + off, v)

    @triton.jit
    def _attn_split_kernel(
        q_ptr, k_ptr, v_ptr, start_ptr, offsets_ptr, ws_o_ptr, ws_ml_ptr,
        T, H, G, S, stride_cb, stride_cg, stride_cs, scale,
        REP: tl.constexpr, R: tl.constexpr, D: tl.constexpr, CHUNK: tl.constexpr, BS: tl.constexpr,
        NSPLIT: tl.constexpr,
    ):  # fmt: skip
        """Program (b * G + g, split): the REP*T query rows of kv head g against slots of one chunk."""
        bg = tl.program_id(0)
        sp = tl.program_id(1)
        b = bg // G
        g = bg % G
        i = tl.arange(0, R)  # query row i: head g*REP + i % REP, token i // REP
        t = i // REP
        h = g * REP + i % REP
        row_ok = i < REP * T
        start = tl.load(start_ptr)
        q_slot = start + t
        end = ((start + T - 1) // BS + 1) * BS  # no query sees past its own block
        j = sp * CHUNK + tl.arange(0, CHUNK)
        ws = (bg * NSPLIT + sp) * R + i
        d = tl.arange(0, D)  # a chunk wholly past `end` loads nothing and stores m = -inf, l = 0
        q_off = ((b * T + t[:, None]) * H + h[:, None]) * D + d[None, :]
        q = tl.load(q_ptr + q_off, mask=row_ok[:, None], other=0.0)
        kv_off = b * stride_cb + g * stride_cg + j[:, None] * stride_cs + d[None, :]
        in_range = (j < S) & (j < end)
        k = tl.load(k_ptr + kv_off, mask=in_range[:, None], other=0.0)
        s = tl.dot(q, tl.trans(k)) * scale  # (R, CHUNK) float32
        offset = tl.load(offsets_ptr + b)
        visible = (j[None, :] >= offset) & (j[None, :] // BS <= q_slot[:, None] // BS)
        visible = (visible | (j[None, :] == q_slot[:, None])) & in_range[None, :]
        s = tl.where(visible, s, float("-inf"))
        m = tl.max(s, 1)
        m_safe = tl.where(m == float("-inf"), 0.0, m)
        p = tl.exp(s - m_safe[:, None])
        l_sum = tl.sum(p, 1)
        v = tl.load(v_ptr + kv_off, mask=in_range[:, None], other=0.0)
        acc = tl.dot(p.to(v.dtype), v)  # (R, D) float32
        tl.store(ws_o_ptr + ws[:, None] * D + d[None, :], acc)
        tl.store(ws_ml_ptr + ws * 2, m)
        tl.store(ws_ml_ptr + ws * 2 + 1, l_sum)

    @triton.jit
    def _attn_combine_kernel(
        ws_o_ptr, ws_ml_ptr, out_ptr, T, H, G,
        REP: tl.constexpr, R: tl.constexpr, D: tl.constexpr, NSPLIT: tl.constexpr, NS_PAD: tl.constexpr,
    ):  # fmt: skip
        """Program (b * G + g, i): merge the splits of query row i into out (B*T, H*D)."""
        bg = tl.program_id(0)
        i = tl.program_id(1)
        b = bg // G
        g = bg % G
        sp = tl.arange(0, NS_PAD)
        ws = (bg * NSPLIT + sp) * R + i
        ok = sp < NSPLIT
        m = tl.load(ws_ml_ptr + ws * 2, mask=ok, other=float("-inf"))
        l_sum = tl.load(ws_ml_ptr + ws * 2 + 1, mask=ok, other=0.0)
        m_all = tl.max(m, 0)
        wgt = tl.where(m == float("-inf"), 0.0, tl.exp(m - m_all))
        d = tl.arange(0, D)
        o = tl.load(ws_o_ptr + ws[:, None] * D + d[None, :], mask=ok[:, None] & (wgt[:, None] > 0), other=0.0)
        out = tl.sum(o * wgt[:, None], 0) / tl.sum(l_sum * wgt, 0)
        t = i // REP
        h = g * REP + i % REP
        tl.store(out_ptr + ((b * T + t) * H + h) * D + d, out.to(out_ptr.dtype.element_ty))


def qk_norm_rope_store(
    qkv: Tensor,
    q_norm_weight: Tensor,
    k_norm_weight: Tensor,
    inv_freq: Tensor,
    position_ids: Tensor,
    start: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    *,
    num_heads: int,
    num_kv_heads: int,
    eps: float,
) -> Tensor:
    """qkv (B, T, (H + 2G) * D) -> q (B*T, H, D) normed and rotated; k (normed, rotated) and v written into
    the layer's cache (B, G, S, D) at slots [start, start + T)."""
    b, t, _ = qkv.shape
    d = k_cache.shape[-1]
    m = b * t
    qkv2 = qkv.reshape(m, -1)
    q_out = torch.empty(m, num_heads, d, dtype=qkv.dtype, device=qkv.device)
    if k_cache.stride(-1) != 1 or k_cache.stride() != v_cache.stride():
        raise ValueError("the K and V caches must share one layout, contiguous along the head dim")
    _qk_norm_rope_kernel[(m, num_heads + num_kv_heads)](
        qkv2, q_norm_weight, k_norm_weight, inv_freq, position_ids.reshape(m), start, q_out, k_cache, v_cache,
        t, num_heads, num_kv_heads, qkv2.stride(0), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        eps, D=d, INTERPRET=interpreting(), num_warps=1,
    )  # fmt: skip
    return q_out


ATTN_CHUNK = 64


def decode_attention(
    q: Tensor,
    k_cache: Tensor,
    v_cache: Tensor,
    start: Tensor,
    offsets: Tensor,
    *,
    tokens: int,
    block_size: int,
) -> Tensor:
    """q (B*T, H, D) at slots [start, start + T) against the layer's cache (B, G, S, D) -> (B*T, H*D).

    Visibility is the cache's (``KVCache.visibility``): slots of earlier blocks and of the query's own block,
    none before the row's offset (its padding), and the query's own slot always."""
    m, h, d = q.shape
    b, g, s, _ = k_cache.shape
    rep = h // g
    r = max(16, triton.next_power_of_2(rep * tokens))
    nsplit = triton.cdiv(s, ATTN_CHUNK)
    ws_o = torch.empty(b * g * nsplit * r, d, dtype=torch.float32, device=q.device)
    ws_ml = torch.empty(b * g * nsplit * r, 2, dtype=torch.float32, device=q.device)
    out = torch.empty(m, h * d, dtype=q.dtype, device=q.device)
    _attn_split_kernel[(b * g, nsplit)](
        q, k_cache, v_cache, start, offsets, ws_o, ws_ml, tokens, h, g, s,
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), d**-0.5,
        REP=rep, R=r, D=d, CHUNK=ATTN_CHUNK, BS=block_size, NSPLIT=nsplit, num_warps=4,
    )  # fmt: skip
    _attn_combine_kernel[(b * g, rep * tokens)](
        ws_o, ws_ml, out, tokens, h, g, REP=rep, R=r, D=d, NSPLIT=nsplit,
        NS_PAD=triton.next_power_of_2(nsplit), num_warps=4,
    )  # fmt: skip
    return out
