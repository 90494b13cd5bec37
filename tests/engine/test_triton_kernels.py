"""The Triton kernels of the fast decode step, run by Triton's interpreter on the CPU (float16: the
interpreter does not do bfloat16), against the eager path. On the GPU (bf16, compiled) the same checks run in
``test_gpu_engine.py``. Skipped where Triton is not installed."""

from __future__ import annotations

import os

import pytest
import torch

pytest.importorskip("triton")


@pytest.fixture(scope="module")
def tk():
    if not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("no GPU and Triton's interpreter not chosen (tests/conftest.py sets TRITON_INTERPRET=1)")
    import engine.triton_kernels as module

    return module


def rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    out, ref = out.double(), ref.double()
    assert torch.isfinite(out).all()
    return float((out - ref).norm() / ref.norm())


DEV = "cuda" if torch.cuda.is_available() else "cpu"
DT = torch.bfloat16 if DEV == "cuda" else torch.float16  # the interpreter has no bfloat16
# Relative-error bounds for results rounded to DT (bf16 keeps 8 bits, fp16 11: unit roundoff 3.9e-3 and
# 4.9e-4): one rounding of the output (LINEAR), a rounded output plus a rounded residual, or silu(g) * u
# from rounded g and u (TWICE). Measured on the H200 in bf16: 2.0-2.5e-3 and 5.6e-3.
LINEAR, TWICE = (4e-3, 8e-3) if DEV == "cuda" else (2e-3, 3e-3)


@pytest.mark.parametrize("rows", [1, 4, 8, 16])
@pytest.mark.parametrize(
    "n,k,config",
    [
        (48, 256, (16, 64, 1, 4, 1)),
        (40, 512, (16, 128, 2, 4, 1)),
        (64, 256, (32, 64, 4, 4, 1)),
        (96, 128, None),
    ],
)
def test_skinny_linear_matches_a_float64_product(tk, rows, n, k, config):
    g = torch.Generator().manual_seed(rows * 1000 + n)
    x = torch.randn(rows, k, generator=g).to(DEV, DT)
    w = (torch.randn(n, k, generator=g) / k**0.5).to(DEV, DT)
    res = torch.randn(rows, n, generator=g).to(DEV, DT)
    ref = x.double() @ w.double().T
    assert rel_err(tk.skinny_linear(x, w, config=config), ref) < LINEAR
    assert rel_err(tk.skinny_linear(x, w, res, config=config), ref + res.double()) < LINEAR
    # a batch of rows in (B, T, K) form, as the model passes it
    out3 = tk.skinny_linear(x.reshape(1, rows, k), w, config=config)
    assert out3.shape == (1, rows, n)


def test_gate_up_is_silu_gate_times_up(tk):
    g = torch.Generator().manual_seed(3)
    x = torch.randn(4, 128, generator=g).to(DEV, DT)
    w = (torch.randn(2 * 48, 128, generator=g) / 128**0.5).to(DEV, DT)
    gate, up = (x.double() @ w.double().T).chunk(2, -1)
    ref = torch.nn.functional.silu(gate) * up
    assert rel_err(tk.skinny_gate_up(x, w, config=(16, 64, 1, 4, 1)), ref) < TWICE


def test_a_tuned_table_is_looked_up_by_device_and_shape(tk, tmp_path, monkeypatch):
    """The per-device table wins for its shapes (and row bucket); other shapes, other chips, a broken
    file or a config that does not divide K fall back to the heuristic."""
    heuristic = tk.skinny_config(2048, 2048, False, 4, "")
    (tmp_path / "Some_GPU_X.json").write_text(
        '{"device": "Some GPU-X", "skinny": {"2048x2048xlinearx4": [32, 128, 1, 8, 3],'
        ' "2048x2048xlinearx8": [16, 128, 8, 4, 3], "2048x2048xgatedx4": [16, 128, 2, 4, 3],'
        ' "2048x1152xlinearx4": [16, 256, 1, 4, 3]}}'
    )
    (tmp_path / "Broken.json").write_text("{not json")
    monkeypatch.setattr(tk, "CONFIG_DIR", tmp_path)
    tk.config_table.cache_clear()
    tk.skinny_config.cache_clear()
    try:
        assert tk.device_key("Some GPU-X") == "Some_GPU_X"
        assert tk.skinny_config(2048, 2048, False, 4, "Some GPU-X") == (32, 128, 1, 8, 3)
        assert tk.skinny_config(2048, 2048, False, 3, "Some GPU-X") == (32, 128, 1, 8, 3)
        assert tk.skinny_config(2048, 2048, False, 8, "Some GPU-X") == (16, 128, 8, 4, 3)
        assert tk.skinny_config(2048, 2048, False, 16, "Some GPU-X") == heuristic  # no 16-row entry
        assert tk.skinny_config(2048, 2048, True, 4, "Some GPU-X")[2] == 1  # gated: never split
        assert tk.skinny_config(4096, 2048, False, 4, "Some GPU-X") == tk.skinny_config(4096, 2048)
        not_dividing = tk.skinny_config(2048, 1152, False, 4, "Some GPU-X")  # 1152 is no multiple of 256
        assert not_dividing == tk.skinny_config(2048, 1152)
        assert tk.skinny_config(2048, 2048, False, 4, "Broken") == heuristic
        assert tk.skinny_config(2048, 2048, False, 4, "Other GPU") == heuristic
    finally:
        tk.config_table.cache_clear()
        tk.skinny_config.cache_clear()


def test_too_many_rows_or_a_k_the_tiles_do_not_divide_are_refused(tk):
    with pytest.raises(ValueError, match="at most 16 rows"):
        tk.skinny_linear(torch.zeros(17, 64, dtype=DT, device=DEV), torch.zeros(16, 64, dtype=DT, device=DEV))
    with pytest.raises(ValueError, match="not a multiple"):
        x, w = torch.zeros(2, 96, dtype=DT, device=DEV), torch.zeros(16, 96, dtype=DT, device=DEV)
        tk.skinny_linear(x, w, config=(16, 64, 1, 4, 1))


def test_split_k_needs_more_programs_than_columns_give():
    from engine.triton_kernels import skinny_config

    assert skinny_config(2048, 2048)[2] > 1  # 128 column tiles: split
    assert skinny_config(151936, 4096)[2] == 1  # lm_head: thousands of tiles


def _model(tk, *, tail_blocks: int = 0):
    from engine.model import DiceModel
    from engine.testing import tiny_config

    cfg = tiny_config(300, hidden_size=128, intermediate_size=256, num_attention_heads=4,
                      num_key_value_heads=2, head_dim=32)  # fmt: skip
    torch.manual_seed(0)
    model = DiceModel(cfg)
    model.init_weights(std=0.08, seed=0)
    model = model.to(DEV, DT).eval()
    model.fuse_projections()
    return model


@pytest.mark.parametrize("batch,offsets", [(1, [0]), (2, [0, 8]), (3, [4, 0, 12])])
@pytest.mark.parametrize("tokens", [4, 8])
def test_fast_forward_equals_the_cached_forward(tk, batch, offsets, tokens):
    """Logits and the K/V written equal the model's own cached forward: the same step on a prefilled cache,
    rows with left padding (their offsets), the first step of a block (8 tokens: previous + current)."""
    from engine.fast_forward import FastForward
    from engine.kv_cache import KVCache

    model = _model(tk)
    cfg = model.config
    fast = FastForward(model)

    def new_cache():
        c = KVCache(num_layers=cfg.num_hidden_layers, batch_size=batch, num_kv_heads=cfg.num_key_value_heads,
                    head_dim=cfg.head_dim, max_slots=256, block_size=4, dtype=DT, device=DEV)  # fmt: skip
        c.reset(offsets)
        return c

    g = torch.Generator().manual_seed(batch * 10 + tokens)
    prompt = 24
    ids = torch.randint(0, 300, (batch, prompt), generator=g).to(DEV)
    pos = (torch.arange(prompt)[None] - torch.tensor(offsets)[:, None]).clamp(min=0).to(DEV)
    caches = []
    start = prompt - (tokens - 4)
    step_ids = torch.randint(0, 300, (batch, tokens), generator=g).to(DEV)
    step_pos = (start + torch.arange(tokens)[None] - torch.tensor(offsets)[:, None]).to(DEV)
    st = torch.tensor([start], device=DEV)
    with torch.no_grad():
        for _ in range(2):
            c = new_cache()
            model.forward_cached(ids, pos, c, torch.tensor([0], device=DEV), logits_last=0)
            caches.append(c)
        ref = model.forward_cached(step_ids, step_pos, caches[0], st, logits_last=4)
        out = fast(step_ids, step_pos, caches[1], st, logits_last=4)
    assert out.shape == ref.shape == (batch, 4, cfg.vocab_size)
    assert rel_err(out, ref) < 1e-2
    assert (out.argmax(-1) == ref.argmax(-1)).float().mean() > 0.9
    written = slice(start, start + tokens)
    assert rel_err(caches[1].k[:, :, :, written], caches[0].k[:, :, :, written]) < 1e-2
    assert rel_err(caches[1].v[:, :, :, written], caches[0].v[:, :, :, written]) < LINEAR


def test_float32_models_keep_the_torch_path(tk):
    """tl.dot would round float32 operands through tf32: the fast path takes bf16/fp16 models only."""
    from engine.fast_forward import FastForward, supported

    model = _model(tk).float()
    assert "bf16/fp16" in supported(model)
    with pytest.raises(ValueError, match="bf16/fp16"):
        FastForward(model)


def test_every_shipped_table_entry_is_usable_for_its_key():
    """engine/kernel_configs/*.json (measured on the chip they are named after): each key parses, each config
    divides its K and gated products never split, so skinny_config takes every entry as it is."""
    import json

    from engine import triton_kernels as tk

    tables = sorted(tk.CONFIG_DIR.glob("*.json"))
    assert tables, "no tuned table shipped"
    for path in tables:
        data = json.loads(path.read_text())
        assert tk.device_key(data["device"]) == path.stem
        assert tk.config_table(data["device"]), path
        for key, cfg in data["skinny"].items():
            n, k, kind, rows = key.split("x")
            bn, bk, split, warps, stages = cfg
            assert kind in ("gated", "linear") and int(rows) in (4, 8, 16), key
            assert int(k) % (bk * split) == 0 and not (kind == "gated" and split > 1), key
            assert bn in (16, 32, 64) and warps in (1, 2, 4, 8) and stages >= 1, key
            assert tk.table_key(int(n), int(k), kind == "gated", int(rows)) == key
            assert tk.skinny_config(int(n), int(k), kind == "gated", int(rows), data["device"]) == tuple(cfg)
