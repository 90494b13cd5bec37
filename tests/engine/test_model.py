"""DiceModel and ModelConfig: config parsing, attention masks, references, the cached forward."""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from engine.errors import ConfigError, UnsupportedArchitectureError
from engine.kv_cache import KVCache
from engine.model import DiceModel, ModelConfig, block_causal_block_mask, block_causal_mask, linear
from engine.testing import tiny_config


def make_model(seed: int = 0, **overrides: object) -> DiceModel:
    torch.manual_seed(seed)
    model = DiceModel(tiny_config(96, **overrides))
    model.init_weights(std=0.2, head_std=0.5, seed=seed)
    return model.eval()


def reference_logits(model: DiceModel, ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
    """Independent float64 implementation: explicit RoPE tables, repeated K/V, masked softmax.

    (The model computes RoPE angles in float32, as transformers does, hence 1e-5 tolerances.)
    """
    cfg = model.config
    sd = {k: v.double() for k, v in model.state_dict().items()}
    b, t = ids.shape
    hd, nh, nkv = cfg.head_dim, cfg.num_attention_heads, cfg.num_key_value_heads

    def rms(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        return w * x / torch.sqrt((x * x).mean(-1, keepdim=True) + cfg.rms_norm_eps)

    pos = torch.arange(t, dtype=torch.float64)
    inv = cfg.rope_theta ** (-torch.arange(0, hd, 2, dtype=torch.float64) / hd)
    ang = pos[:, None] * inv[None]  # (T, D/2)
    cos, sin = ang.cos(), ang.sin()

    def rope(x: torch.Tensor) -> torch.Tensor:  # (B, H, T, D), first half paired with second half
        x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
        return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1)

    x = sd["model.embed_tokens.weight"][ids]
    for i in range(cfg.num_hidden_layers):
        p = f"model.layers.{i}."
        h = rms(x, sd[p + "input_layernorm.weight"])
        q = (h @ sd[p + "self_attn.q_proj.weight"].T).view(b, t, nh, hd)
        k = (h @ sd[p + "self_attn.k_proj.weight"].T).view(b, t, nkv, hd)
        v = (h @ sd[p + "self_attn.v_proj.weight"].T).view(b, t, nkv, hd)
        q = rope(rms(q, sd[p + "self_attn.q_norm.weight"]).transpose(1, 2))
        k = rope(rms(k, sd[p + "self_attn.k_norm.weight"]).transpose(1, 2))
        v = v.transpose(1, 2)
        k = k.repeat_interleave(nh // nkv, dim=1)
        v = v.repeat_interleave(nh // nkv, dim=1)
        scores = q @ k.transpose(-1, -2) / hd**0.5
        scores = scores.masked_fill(~allowed, float("-inf"))
        a = (scores.softmax(-1) @ v).transpose(1, 2).reshape(b, t, nh * hd)
        x = x + a @ sd[p + "self_attn.o_proj.weight"].T
        h = rms(x, sd[p + "post_attention_layernorm.weight"])
        gate = h @ sd[p + "mlp.gate_proj.weight"].T
        x = (
            x
            + (torch.nn.functional.silu(gate) * (h @ sd[p + "mlp.up_proj.weight"].T))
            @ sd[p + "mlp.down_proj.weight"].T
        )
    return rms(x, sd["model.norm.weight"]) @ sd["lm_head.weight"].T


def test_config_reads_the_sdar_release_configs(shared_data):
    for name, hidden, mlp in (("config-4b.json", 2560, 9728), ("config-8b.json", 4096, 12288)):
        cfg = ModelConfig.from_json(shared_data / "sdar-tokenizer" / name)
        assert (cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers) == (hidden, mlp, 36)
        assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (32, 8, 128)
        assert cfg.block_size == 4 and cfg.mask_token_id == 151669 and cfg.vocab_size == 151936
        assert cfg.rope_theta == 1e6 and not cfg.tie_word_embeddings
        assert cfg.extra["fuse_cross_entropy"] is True  # unknown fields are kept
        with torch.device("meta"):
            n = sum(p.numel() for p in DiceModel(cfg).parameters())
        assert n == cfg.num_parameters
    assert (
        8.1e9
        < ModelConfig.from_json(shared_data / "sdar-tokenizer" / "config-8b.json").num_parameters
        < 8.3e9
    )


def test_config_round_trip_and_errors(tmp_path):
    cfg = tiny_config(96, mask_token_id=95)
    data = cfg.to_dict() | {"some_future_field": [1, 2]}
    again = ModelConfig.from_dict(json.loads(json.dumps(data)))
    assert again == cfg and again.extra["some_future_field"] == [1, 2]
    assert again.to_dict()["some_future_field"] == [1, 2]

    bad = dict(data)
    del bad["num_hidden_layers"]
    with pytest.raises(ConfigError, match="num_hidden_layers"):
        ModelConfig.from_dict(bad, source="x/config.json")
    with pytest.raises(UnsupportedArchitectureError, match="llama"):
        ModelConfig.from_dict(data | {"model_type": "llama"})
    with pytest.raises(UnsupportedArchitectureError, match="MistralForCausalLM"):
        ModelConfig.from_dict(data | {"architectures": ["MistralForCausalLM"]})
    with pytest.raises(ConfigError, match="num_key_value_heads"):
        ModelConfig.from_dict(data | {"num_key_value_heads": 3})
    with pytest.raises(ConfigError, match="hidden_size"):
        ModelConfig.from_dict(data | {"hidden_size": "64"})
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(ConfigError, match="not valid JSON"):
        ModelConfig.from_json(tmp_path)
    with pytest.raises(ConfigError, match="not found"):
        ModelConfig.from_json(tmp_path / "nowhere")
    # head_dim defaults to hidden / heads as in transformers
    no_hd = {k: v for k, v in data.items() if k != "head_dim"}
    assert ModelConfig.from_dict(no_hd).head_dim == 64 // 4


def test_block_causal_logits_match_independent_reference():
    model = make_model().double()
    ids = torch.randint(0, 96, (2, 11))
    expected = reference_logits(model, ids, block_causal_mask(11, 4))
    with torch.no_grad():
        got = model(ids)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    # A bidirectional (all-True) mask is the plain full-attention model; the first block sees only itself
    # in both, so those positions must coincide with the full-attention reference on the first block.
    full = torch.ones(1, 1, 4, 4, dtype=torch.bool)
    with torch.no_grad():
        first_block = model(ids[:, :4], mask=full)
    torch.testing.assert_close(got[:, :4], first_block, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(first_block, reference_logits(model, ids[:, :4], full), rtol=1e-5, atol=1e-5)


def test_block_size_one_equals_hf_qwen3_causal_lm():
    transformers = pytest.importorskip("transformers")
    model = make_model(block_size=1)
    cfg = model.config
    hf_cfg = transformers.Qwen3Config(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=cfg.rope_theta,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=False,
        attention_bias=False,
    )
    hf_cfg._attn_implementation = "eager"
    hf = transformers.Qwen3ForCausalLM(hf_cfg).eval()
    missing, unexpected = hf.load_state_dict(model.state_dict(), strict=False)
    assert not unexpected and all("rotary" in k for k in missing)
    ids = torch.randint(0, 96, (2, 9))
    with torch.no_grad():
        torch.testing.assert_close(model(ids), hf(ids).logits, rtol=1e-4, atol=1e-4)


def test_mask_forms_agree_and_bad_masks_are_rejected():
    model = make_model()
    ids = torch.randint(0, 96, (2, 8))
    with torch.no_grad():
        default = model(ids)
        explicit = model(ids, position_ids=torch.arange(8)[None].expand(2, 8), mask=block_causal_mask(8, 4))
        batched = model(ids, mask=block_causal_mask(8, 4).expand(2, 1, 8, 8))
        flex = model(ids, mask=block_causal_block_mask(8, 4))
    torch.testing.assert_close(default, explicit)
    torch.testing.assert_close(default, batched)
    torch.testing.assert_close(default, flex, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="bool"):
        model(ids, mask=block_causal_mask(8, 4).float())
    with pytest.raises(ValueError, match="bool"):
        model(ids, mask=block_causal_mask(7, 4))


def test_noisy_clean_layout_through_a_bool_mask():
    """SFT's [noisy | clean] input: a noisy block sees itself and earlier clean blocks."""
    model = make_model()
    t, bs = 8, 4
    clean = torch.randint(0, 90, (1, t))
    noisy = clean.clone()
    noisy[0, [1, 2, 6]] = 95
    q = torch.arange(2 * t)
    qb, is_noisy = (q % t) // bs, q < t
    allowed = torch.where(
        is_noisy[:, None],
        (is_noisy[None] & (qb[None] == qb[:, None])) | (~is_noisy[None] & (qb[None] < qb[:, None])),
        ~is_noisy[None] & (qb[None] <= qb[:, None]),
    )[None, None]
    pos = torch.cat([torch.arange(t), torch.arange(t)])[None]
    with torch.no_grad():
        both = model(torch.cat([noisy, clean], 1), position_ids=pos, mask=allowed)
        # Reference for the second noisy block: clean block 0 followed by noisy block 1, block-causal.
        ref = model(torch.cat([clean[:, :4], noisy[:, 4:]], 1))
    torch.testing.assert_close(both[:, 4:8], ref[:, 4:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(both[:, t:], model(clean), rtol=1e-5, atol=1e-5)


def test_gradient_checkpointing_gives_the_same_gradients():
    ids = torch.randint(0, 96, (2, 8))
    grads = []
    for flag in (False, True):
        model = make_model().train()
        model.gradient_checkpointing = flag
        model(ids).float().logsumexp(-1).mean().backward()
        grads.append(model.model.layers[0].self_attn.q_proj.weight.grad.clone())
    torch.testing.assert_close(grads[0], grads[1])


def test_tied_embeddings_share_one_tensor():
    model = make_model(tie_word_embeddings=True)
    assert model.lm_head.weight is model.model.embed_tokens.weight


def test_cached_forward_matches_full_forward_with_left_padding():
    model = make_model()
    bs = 4
    cache = KVCache(
        num_layers=2,
        batch_size=2,
        num_kv_heads=2,
        head_dim=16,
        max_slots=24,
        block_size=bs,
        dtype=torch.float32,
        device="cpu",
    )
    # Row 0: 12 tokens; row 1: 4 tokens left-padded by two blocks. Prefill then one block at a time.
    ids0 = torch.randint(0, 96, (1, 16))
    ids1 = torch.randint(0, 96, (1, 8))
    cache.reset([0, 8])
    ids = torch.cat([ids0[:, :12], torch.cat([torch.zeros(1, 8, dtype=torch.long), ids1[:, :4]], 1)])
    pos = torch.stack([torch.arange(12), torch.arange(-8, 4).clamp(min=0)])
    with torch.no_grad():
        pre = model.forward_cached(ids, pos, cache, torch.tensor([0]))
        step = model.forward_cached(
            torch.cat([ids0[:, 12:], ids1[:, 4:]]),
            torch.stack([torch.arange(12, 16), torch.arange(4, 8)]),
            cache,
            torch.tensor([12]),
        )
        full0, full1 = model(ids0), model(ids1)
    torch.testing.assert_close(pre[0], full0[0, :12], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(pre[1, 8:], full1[0, :4], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step[0], full0[0, 12:], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(step[1], full1[0, 4:], rtol=1e-5, atol=1e-5)


def test_fused_projections_keep_logits_keys_and_memory():
    model = make_model()
    ids = torch.randint(0, 96, (2, 10))
    with torch.no_grad():
        before = model(ids)
    keys = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.raises(RuntimeError, match="inference"):
        make_model().train().fuse_projections()
    model.fuse_projections()
    attn = model.model.layers[0].self_attn
    assert attn.fused_qkv is not None and attn.q_proj.weight.data_ptr() == attn.fused_qkv[0].data_ptr()
    after_state = model.state_dict()
    assert after_state.keys() == keys.keys() and all(torch.equal(after_state[k], v) for k, v in keys.items())
    with torch.no_grad():
        torch.testing.assert_close(model(ids), before, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    ("rows", "out_f", "in_f"),
    [(4, 512, 256), (8, 4096, 256), (16, 256, 256), (17, 512, 256), (4, 256, 1024), (0, 512, 256)],
)
def test_linear_matches_f_linear(rows, out_f, in_f):
    # rows <= 16 with out >= in take the W @ x^T path; the others are F.linear itself
    gen = torch.Generator().manual_seed(rows + out_f)
    x = torch.randn(1, rows, in_f, generator=gen)
    w = torch.randn(out_f, in_f, generator=gen)
    b = torch.randn(out_f, generator=gen)
    for bias in (None, b):
        got = linear(x, w, bias)
        assert got.shape == (1, rows, out_f)
        torch.testing.assert_close(got, F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
