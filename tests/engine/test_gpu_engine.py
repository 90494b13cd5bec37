"""CUDA: cached == uncached decoding on the GPU; the CUDA-graph path, the compiled path and the Triton fast
path (``engine.fast_forward``) against the eager path."""

from __future__ import annotations

import pytest
import torch

from engine import load_engine
from engine.checkpoint import save_model
from engine.model import DiceModel
from engine.runner import EagerRunner
from engine.sampling import dynamic_policy, static_policy
from engine.testing import tiny_config
from tests.engine.test_decode import uncached_decode

pytestmark = pytest.mark.gpu

TEXTS = [
    "__global__ void relu_kernel(const float* x, float* y, int n) {",
    "import torch.nn as nn",
    "import torch",
    "<|im_start|>user\nWrite a softmax kernel<|im_end|>\n<|im_start|>assistant\n",
]


@pytest.mark.parametrize(("policy_name", "policy"), [("static", static_policy), ("dynamic", dynamic_policy)])
def test_cached_equals_uncached_on_cuda(tiny_ckpt, policy_name, policy):
    eng = load_engine(tiny_ckpt, device="cuda", dtype=torch.float32, cuda_graphs=False)
    for text in TEXTS:
        prompt = eng.tokenizer.encode(text)
        out = eng.generate(prompt, max_new_tokens=14, policy=policy_name, threshold=0.5, stop_ids=[])
        ref_ids, ref_steps = uncached_decode(eng, prompt, max_new=14, steps=4, policy=policy, threshold=0.5)
        assert out.ids[0] == ref_ids and out.step_map[0] == ref_steps


def _wide_checkpoint(tiny_ckpt, tmp_path):
    # A wider random model than dice-tiny, so the graph holds realistic kernels (GQA 8/2, head dim 64).
    torch.manual_seed(0)
    config = tiny_config(
        640,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=2,
        head_dim=64,
        mask_token_id=639,
        eos_token_id=523,
        pad_token_id=523,
    )
    model = DiceModel(config)
    model.init_weights(std=0.05, head_std=0.1, seed=0)
    return save_model(model, tmp_path / "wide", tokenizer_dir=tiny_ckpt)


def test_cuda_graph_path_equals_eager_path(tiny_ckpt, tmp_path):
    """float32: the replayed graphs run the same kernels as eager mode, so whole generations match."""
    folder = _wide_checkpoint(tiny_ckpt, tmp_path)
    eager = load_engine(folder, device="cuda", dtype=torch.float32, cuda_graphs=False)
    graphs = load_engine(folder, device="cuda", dtype=torch.float32, cuda_graphs=True, kernels=False)
    prompts = [eager.tokenizer.encode(t) for t in TEXTS]
    for kwargs in (
        {},
        {"policy": "dynamic", "threshold": 0.3, "steps_per_block": 2},
        {"temperature": 1.0, "top_p": 0.9, "seed": 3},
    ):
        a = eager.generate(prompts, max_new_tokens=24, stop_ids=[], **kwargs)
        b = graphs.generate(prompts, max_new_tokens=24, stop_ids=[], **kwargs)
        assert a.ids == b.ids and a.step_map == b.step_map, kwargs
        for ca, cb in zip(a.confidences, b.confidences, strict=True):
            assert ca == pytest.approx(cb, abs=1e-5)
        # replaying the same captured graphs again (cache reuse) gives the same answer
        assert graphs.generate(prompts, max_new_tokens=24, stop_ids=[], **kwargs).ids == b.ids
    # a trainer gives the graphs and caches back between rollouts and update; the next generation recaptures
    held = torch.cuda.memory_allocated()
    graphs.release_buffers()
    assert not graphs.runner._graphs and not graphs.runner._caches
    assert torch.cuda.memory_allocated() < held
    assert (
        graphs.generate(prompts, max_new_tokens=24, stop_ids=[]).ids
        == eager.generate(prompts, max_new_tokens=24, stop_ids=[]).ids
    )


@pytest.mark.parametrize("kernels", [False, True], ids=["torch-kernels", "triton-kernels"])
def test_cuda_graph_step_matches_eager_step_in_bf16(tiny_ckpt, tmp_path, kernels):
    folder = _wide_checkpoint(tiny_ckpt, tmp_path)
    eng = load_engine(folder, device="cuda", dtype=torch.bfloat16, cuda_graphs=True, kernels=kernels)
    assert eng.runner.kernels is kernels
    runner, eager = eng.runner, EagerRunner(eng.model)
    prompt = torch.randint(0, 600, (2, 16), device="cuda")
    pos = torch.arange(16, device="cuda")[None].expand(2, 16)
    block = torch.randint(0, 600, (2, 4), device="cuda")
    block_pos = torch.arange(16, 20, device="cuda")[None].expand(2, 4)
    start = torch.full((1,), 16, dtype=torch.long, device="cuda")
    logits = []
    for r in (runner, eager):
        cache = r.new_cache(2, 64, 4)
        cache.reset([0, 0])
        r.prepare(cache, (4, 8), 4)
        r.prefill(cache, prompt, pos)
        logits.append(r.step(cache, block, block_pos, start, 4).clone())
    torch.testing.assert_close(logits[0], logits[1], rtol=1e-2, atol=1e-2)


def test_prefix_reuse_under_cuda_graphs_equals_no_reuse(tiny_ckpt, tmp_path):
    """Reused prompt K/V are copied in before the graphs' eager prefill of the rest: same generations."""
    folder = _wide_checkpoint(tiny_ckpt, tmp_path)
    reuse = load_engine(folder, device="cuda", dtype=torch.float32, cuda_graphs=True)
    plain = load_engine(folder, device="cuda", dtype=torch.float32, cuda_graphs=True, prefix_cache_entries=0)
    tok = reuse.tokenizer
    opening = tok.encode(" ".join(TEXTS) * 3)
    prompts = [opening + tok.encode(t) for t in TEXTS]  # a shared opening, different endings and lengths
    for batch in ([prompts[0]], [prompts[1]], [prompts[2]] * 3, [prompts[3], prompts[0], prompts[3]]):
        a = reuse.generate(batch, max_new_tokens=16, stop_ids=[])
        b = plain.generate(batch, max_new_tokens=16, stop_ids=[])
        assert a.ids == b.ids and a.step_map == b.step_map
    assert reuse.prefix_cache.reused_tokens >= len(opening) // 4 * 4 * 3


def test_triton_kernels_generate_as_eager_on_dice_tiny():
    """The embedded (trained) model in bf16: the fast path's greedy generations equal the eager path's, token
    for token, but for rare bf16 near-ties (90 % of tokens before a row's first difference)."""
    fast = load_engine(device="cuda", dtype=torch.bfloat16, kernels=True)
    eager = load_engine(device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    assert fast.runner.kernels and not getattr(eager.runner, "kernels", False)
    prompts = [fast.tokenizer.encode(t) for t in TEXTS]
    same = total = 0
    for kwargs in ({}, {"policy": "dynamic", "threshold": 0.9}):
        a = eager.generate(prompts, max_new_tokens=32, stop_ids=[], **kwargs)
        b = fast.generate(prompts, max_new_tokens=32, stop_ids=[], **kwargs)
        for ra, rb in zip(a.ids, b.ids, strict=True):
            n = next((i for i, (x, y) in enumerate(zip(ra, rb, strict=False)) if x != y), len(ra))
            same += n  # tokens equal up to the first difference (after it the contexts differ)
            total += len(ra)
        # one row at a time == the batch (the fast path at batch 1 and at batch 4)
        one = fast.generate(prompts[:1], max_new_tokens=32, stop_ids=[], **kwargs)
        assert one.ids[0] == b.ids[0]
    print(f"fast == eager on {same}/{total} tokens before the first difference")
    assert same >= 0.9 * total


def test_the_fast_path_is_the_default_for_half_precision_graphs(tiny_ckpt, tmp_path):
    folder = _wide_checkpoint(tiny_ckpt, tmp_path)
    assert load_engine(folder, device="cuda", dtype=torch.bfloat16).runner.kernels
    assert not load_engine(folder, device="cuda", dtype=torch.float32).runner.kernels  # exact fp32 stays
    assert not load_engine(folder, device="cuda", dtype=torch.bfloat16, compile=True).runner.kernels
    eager = load_engine(folder, device="cuda", dtype=torch.bfloat16, cuda_graphs=False)
    assert not getattr(eager.runner, "kernels", False)


def test_compiled_graph_path_runs_and_equals_eager(tiny_ckpt, tmp_path):
    """torch.compile inside the captured graph (traced under no_grad: with autograd on, AOTAutograd failed
    on the in-place cache write) gives the eager path's generations in float32."""
    folder = _wide_checkpoint(tiny_ckpt, tmp_path)
    eager = load_engine(folder, device="cuda", dtype=torch.float32, cuda_graphs=False)
    compiled = load_engine(folder, device="cuda", dtype=torch.float32, cuda_graphs=True, compile=True)
    prompts = [eager.tokenizer.encode(t) for t in TEXTS]
    a = eager.generate(prompts, max_new_tokens=16, stop_ids=[])
    b = compiled.generate(prompts, max_new_tokens=16, stop_ids=[])
    assert a.ids == b.ids and a.step_map == b.step_map
    # a step called outside any no_grad / inference_mode (as benchmarks do) works too
    cache = compiled.runner.new_cache(1, 64, 4)
    cache.reset([0])
    compiled.runner.prepare(cache, (4, 8), 4)
    ids = torch.zeros(1, 4, dtype=torch.long, device="cuda")
    pos = torch.arange(4, device="cuda")[None]
    out = compiled.runner.step(cache, ids, pos, torch.zeros(1, dtype=torch.long, device="cuda"), 4)
    assert torch.isfinite(out).all()
