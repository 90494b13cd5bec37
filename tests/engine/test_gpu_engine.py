"""CUDA: cached == uncached decoding on the GPU, and the CUDA-graph path == the eager path."""

from __future__ import annotations

import pytest
import torch

from engine import load_engine
from engine.checkpoint import save_model
from engine.model import DiceModel
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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cuda_graph_path_equals_eager_path(tiny_ckpt, tmp_path, dtype):
    # A wider random model than dice-tiny, so the graph holds realistic kernels (GQA 8/2, head dim 64).
    torch.manual_seed(0)
    model = DiceModel(
        tiny_config(
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
    )
    model.init_weights(std=0.05, head_std=0.1, seed=0)
    folder = save_model(model, tmp_path / "wide", tokenizer_dir=tiny_ckpt)
    (folder / "tokenizer_config.json").write_text((tiny_ckpt / "tokenizer_config.json").read_text())
    eager = load_engine(folder, device="cuda", dtype=dtype, cuda_graphs=False)
    graphs = load_engine(folder, device="cuda", dtype=dtype, cuda_graphs=True)
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
            assert ca == pytest.approx(cb, abs=1e-6)
        # replaying the same captured graphs again (cache reuse) gives the same answer
        c = graphs.generate(prompts, max_new_tokens=24, stop_ids=[], **kwargs)
        assert c.ids == b.ids
