"""Prompt-prefix K/V reuse: decoding with reuse gives exactly what decoding without it gives."""

from __future__ import annotations

import pytest
import torch

from engine import Engine, load_engine
from engine.kv_cache import KVCache, PrefixCache
from engine.prompts import infill_opening, infill_prompt
from engine.sampling import static_policy
from tests.engine.test_decode import uncached_decode

KERNEL = """__global__ void scale(const float* x, float* y, float a, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        y[i] = a * x[i];
    }
}
"""


@pytest.fixture(scope="module")
def plain(tiny_ckpt) -> Engine:
    eng = load_engine(tiny_ckpt, device="cpu", prefix_cache_entries=0)
    assert eng.prefix_cache is None
    return eng


@pytest.fixture()
def cached(tiny_ckpt) -> Engine:
    return load_engine(tiny_ckpt, device="cpu")


def infill_ids(eng: Engine, hole: int, middle_cut: int = 0) -> list[int]:
    """The editor's prompt for a hole at ``hole`` in KERNEL (``middle_cut`` chars removed after it)."""
    prompt, response_prefix = infill_prompt(KERNEL[:hole], KERNEL[hole + middle_cut :])
    return eng.tokenizer.encode(prompt + response_prefix)


def prefill_widths(eng: Engine, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Records (rows, tokens) of every prefill forward the engine runs."""
    calls: list[tuple[int, int]] = []
    original = eng.runner.prefill

    def spy(cache, ids, pos, start=0):
        calls.append(tuple(ids.shape))
        return original(cache, ids, pos, start)

    monkeypatch.setattr(eng.runner, "prefill", spy)
    return calls


GEN = {"max_new_tokens": 12, "stop_ids": [], "policy": "static", "steps_per_block": 4}


def same(a, b) -> None:
    assert a.ids == b.ids
    assert a.step_map == b.step_map
    assert a.finished == b.finished
    for ca, cb in zip(a.confidences, b.confidences, strict=True):
        assert ca == pytest.approx(cb, abs=1e-5)


def test_shared_prefix_pair_prefills_only_the_rest_and_decodes_the_same(cached, plain, monkeypatch):
    first = infill_ids(cached, KERNEL.index("y[i]"))
    second = infill_ids(cached, KERNEL.index("if (i"), middle_cut=3)  # an edit nearer the top
    common = next(i for i, (a, b) in enumerate(zip(first, second, strict=False)) if a != b)
    assert common > 100 and len(second) > common + 8
    calls = prefill_widths(cached, monkeypatch)
    same(cached.generate(first, **GEN), plain.generate(first, **GEN))
    assert calls == [(1, len(first) // 4 * 4)]  # cold: the whole prompt
    out = cached.generate(second, **GEN)
    reused = common // 4 * 4
    assert calls[1] == (1, len(second) // 4 * 4 - reused)  # warm: only what follows the shared blocks
    assert cached.prefix_cache.reused_tokens == reused
    same(out, plain.generate(second, **GEN))
    ref_ids, ref_steps = uncached_decode(cached, second, max_new=12, steps=4, policy=static_policy)
    assert out.ids[0] == ref_ids and out.step_map[0] == ref_steps  # and both equal a full forward per step
    for policy in ({"policy": "dynamic", "threshold": 0.5}, {"temperature": 0.8, "seed": 3}):
        args = {**GEN, **policy}
        same(cached.generate(second, **args), plain.generate(second, **args))


def test_primed_template_opening_is_reused_by_the_first_request(cached, plain, monkeypatch):
    opening = cached.tokenizer.encode(infill_opening())
    assert cached.prime_prefix_cache() == len(opening) // 4 * 4
    ids = infill_ids(cached, KERNEL.index("y[i]"))
    assert ids[: len(opening) // 4 * 4] == opening[: len(opening) // 4 * 4]  # the prompts share it
    widths = prefill_widths(cached, monkeypatch)
    before = cached.prefix_cache.reused_tokens
    same(cached.generate(ids, **GEN), plain.generate(ids, **GEN))
    reused = cached.prefix_cache.reused_tokens - before
    assert reused >= len(opening) // 4 * 4 - 4  # at most the last block tokenizes differently
    assert widths == [(1, len(ids) // 4 * 4 - reused)]
    assert cached.prime_prefix_cache("a") == 0  # less than a block: nothing to keep
    assert plain.prime_prefix_cache() == 0  # no prefix cache


def test_repeated_prompt_prefills_once(cached, plain, monkeypatch):
    prompt = infill_ids(cached, KERNEL.index("y[i]"))
    calls = prefill_widths(cached, monkeypatch)
    out = cached.generate([prompt] * 3, **GEN)  # the n candidates of one request
    assert calls == [(1, len(prompt) // 4 * 4)]
    ref = plain.generate(prompt, **GEN)
    assert out.ids == ref.ids * 3 and out.step_map == ref.step_map * 3
    cached.generate(prompt, **{**GEN, "temperature": 1.0, "seed": 1})  # the next candidate: no prefill
    assert len(calls) == 1
    sampled = cached.infill(KERNEL[:50], KERNEL[50:], n=2, max_new_tokens=8, temperature=1.0, seed=5)
    assert [c.token_ids for c in sampled] == [
        c.token_ids
        for c in plain.infill(KERNEL[:50], KERNEL[50:], n=2, max_new_tokens=8, temperature=1.0, seed=5)
    ]


def test_batch_of_different_lengths_with_shared_and_repeated_prompts(cached, plain, monkeypatch):
    tok = cached.tokenizer
    base = infill_ids(cached, KERNEL.index("y[i]"))
    other = infill_ids(cached, KERNEL.index("int i"))
    short = tok.encode("__global__ void k(float* y) {")
    cached.generate(other[: len(other) // 2], **GEN)  # warms part of `other` only
    batch = [base, other, base, short, tok.encode("a"), other]  # repeats not adjacent: a gathered prefill
    calls = prefill_widths(cached, monkeypatch)
    out = cached.generate(batch, **GEN)
    assert len(calls) == 1 and calls[0][0] == 4  # one forward over the 4 distinct prompts
    for i, p in enumerate(batch):
        ref = plain.generate(p, **GEN)
        assert out.ids[i] == ref.ids[0] and out.step_map[i] == ref.step_map[0], i
    # Everything is cached now: the same batch again runs no prefill forward at all.
    again = cached.generate(batch, **GEN)
    assert len(calls) == 1 and again.ids == out.ids


def test_prefix_cache_lru_and_bounds():
    def kv(n: int, fill: float) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.full((2, 1, n, 3), fill), torch.full((2, 1, n, 3), -fill)

    pc = PrefixCache(max_entries=2, max_tokens=20)
    assert pc.lookup([1, 2, 3, 4], 4) == (0, None, None)
    pc.store([1, 2, 3, 4, 5, 6, 7, 8], 4, *kv(8, 1.0))
    n, k, v = pc.lookup([1, 2, 3, 4, 5, 6, 0, 0, 9], 4)  # shares 6 tokens: one whole block is usable
    assert n == 4 and k.shape == (2, 1, 4, 3) and float(k[0, 0, 0, 0]) == 1.0 and float(v.max()) == -1.0
    assert pc.lookup([1, 2, 3, 4, 5, 6, 7, 8], 2)[0] == 0  # another block size is another attention pattern
    pc.store([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12], 4, *kv(12, 2.0))  # extends the entry: replaces it
    assert len(pc) == 1 and pc.tokens == 12
    pc.store([1, 2, 3, 4], 4, *kv(4, 3.0))  # already held by the longer entry
    assert len(pc) == 1 and float(pc.lookup([1, 2, 3, 4], 4)[1][0, 0, 0, 0]) == 2.0
    pc.store([7] * 8, 4, *kv(8, 4.0))
    assert len(pc) == 2 and pc.tokens == 20
    pc.store([8] * 4, 4, *kv(4, 5.0))  # over both bounds: the least recently used entry goes
    assert len(pc) == 2 and pc.lookup([1, 2, 3, 4], 4)[0] == 0 and pc.lookup([7] * 8, 4)[0] == 8
    pc.store(list(range(40)), 4, *kv(40, 6.0))  # longer than max_tokens: its first 20 are kept
    assert pc.tokens == 20 and pc.lookup(list(range(40)), 4)[0] == 20
    with pytest.raises(ValueError, match="whole blocks"):
        pc.store([1, 2, 3, 4, 5], 4, *kv(5, 1.0))
    with pytest.raises(ValueError, match=">= 1"):
        PrefixCache(max_entries=0)
    pc.clear()
    assert len(pc) == 0


def test_kv_cache_row_operations():
    cache = KVCache(
        num_layers=2,
        batch_size=3,
        num_kv_heads=1,
        head_dim=2,
        max_slots=8,
        block_size=4,
        dtype=torch.float32,
        device="cpu",
    )
    cache.reset([0, 4, 0])
    k = torch.arange(2 * 4 * 2, dtype=torch.float32).view(2, 1, 4, 2)
    cache.load(1, 4, k, -k)
    rk, rv = cache.read(1, 4, 4)
    assert torch.equal(rk, k) and torch.equal(rv, -k)
    cache.copy_rows([1], [2], 8)
    assert torch.equal(cache.k[:, 2], cache.k[:, 1])
    view, is_view = cache.rows([1, 2])
    assert is_view and view.offsets.tolist() == [4, 0]
    view.k[0, 0, 0, 0, 0] = 99.0
    assert float(cache.k[0, 1, 0, 0, 0]) == 99.0
    copy, is_view = cache.rows([0, 2])
    assert not is_view and copy.batch_size == 2
    copy.k.fill_(7.0)
    cache.put_rows([0, 2], copy, 4)
    assert float(cache.k[:, [0, 2], :, :4].min()) == 7.0 and float(cache.k[:, 2, :, 4:].max()) != 7.0
    with pytest.raises(ValueError, match="do not fit"):
        cache.load(0, 6, k, k)
