"""A tiny random DICE checkpoint in the real on-disk format, for every part's CPU tests.

``make_tiny_checkpoint`` trains a small byte-level BPE (Qwen2 pre-tokenizer, ChatML specials,
``<|endoftext|>`` and ``<|MASK|>``) on the CUDA/C++/Python text below, builds a 2-layer model with
block size 4 and writes config.json (model_type sdar), model.safetensors, tokenizer.json and
tokenizer_config.json. Same arguments -> byte-identical files. Takes well under a second.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

import torch
from tokenizers import Tokenizer as _Backend

from engine.checkpoint import save_model
from engine.model import DiceModel, ModelConfig
from engine.tokenizer import train_byte_level_bpe

SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|MASK|>")
TINY_VOCAB = 640  # BPE vocabulary incl. specials; the embedding is padded to a multiple of 64 like Qwen's

TINY_CORPUS = r"""
#include <cuda_runtime.h>
#include <torch/extension.h>

__global__ void elementwise_add_kernel(const float* a, const float* b, float* out, int size) {
    int idx = blockIdx.x * blockDim.x + threadIdx.x;
    if (idx < size) {
        out[idx] = a[idx] + b[idx];
    }
}

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, int n) {
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += blockDim.x * gridDim.x) {
        float v = x[i];
        y[i] = v > 0.0f ? v : 0.0f;
    }
}

__global__ void softmax_rows(const float* x, float* y, int rows, int cols) {
    int row = blockIdx.x;
    if (row >= rows) return;
    extern __shared__ float shared[];
    float max_val = -INFINITY;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        max_val = fmaxf(max_val, x[row * cols + c]);
    }
    shared[threadIdx.x] = max_val;
    __syncthreads();
    for (int s = blockDim.x / 2; s > 0; s >>= 1) {
        if (threadIdx.x < s) shared[threadIdx.x] = fmaxf(shared[threadIdx.x], shared[threadIdx.x + s]);
        __syncthreads();
    }
    float sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        float e = expf(x[row * cols + c] - shared[0]);
        y[row * cols + c] = e;
        sum += e;
    }
}

torch::Tensor elementwise_add_cuda(torch::Tensor a, torch::Tensor b) {
    auto size = a.numel();
    auto out = torch::zeros_like(a);
    const int block_size = 256;
    const int num_blocks = (size + block_size - 1) / block_size;
    elementwise_add_kernel<<<num_blocks, block_size>>>(a.data_ptr<float>(), b.data_ptr<float>(),
                                                       out.data_ptr<float>(), size);
    return out;
}

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.relu(a + b)

class ModelNew(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.elementwise_add = elementwise_add

    def forward(self, a, b):
        return self.elementwise_add.elementwise_add_cuda(a, b)

def get_inputs():
    a = torch.randn(4096, 1024).cuda()
    b = torch.randn(4096, 1024).cuda()
    return [a, b]

def get_init_inputs():
    return []

You write custom CUDA kernels to replace the pytorch operators in the given architecture to get speedups.
Output the new code in codeblocks. Please generate real code, NOT pseudocode, make sure the code compiles
and is fully functional. Just output the new model code, no other text, and NO testing code!
"""


def _train_tokenizer(corpus: Iterable[str]) -> _Backend:
    # Specials after the learned vocabulary, as in Qwen2 (eos first, mask last).
    return train_byte_level_bpe(list(corpus), TINY_VOCAB, SPECIAL_TOKENS)


def tiny_config(vocab_size: int, **overrides: object) -> ModelConfig:
    """The tiny architecture (hidden 64, 2 layers, 4 q / 2 kv heads, block 4) for a given vocabulary."""
    fields = dict(
        vocab_size=vocab_size,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=16,
        rms_norm_eps=1e-6,
        rope_theta=1_000_000.0,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        block_size=4,
        model_type="sdar",
        architectures=("SDARForCausalLM",),
        torch_dtype="float32",
    )
    fields.update(overrides)
    return ModelConfig(**fields)  # type: ignore[arg-type]


def make_tiny_checkpoint(
    out_dir: str | Path, *, seed: int = 0, vocab_corpus: Iterable[str] | None = None
) -> Path:
    """Write a tiny random DICE checkpoint to ``out_dir`` and return the folder.

    ``vocab_corpus`` replaces the built-in text the BPE is trained on. The weights are scaled so the random
    model is confident (peaked logits), which makes greedy decoding and threshold policies meaningful.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = _train_tokenizer(vocab_corpus if vocab_corpus is not None else TINY_CORPUS.splitlines(True))
    backend.save(str(out / "tokenizer.json"))
    ids = {t: backend.token_to_id(t) for t in SPECIAL_TOKENS}
    vocab = backend.get_vocab_size(with_added_tokens=True)
    config = tiny_config(
        -(-vocab // 64) * 64,
        mask_token_id=ids["<|MASK|>"],
        eos_token_id=ids["<|endoftext|>"],
        pad_token_id=ids["<|endoftext|>"],
        bos_token_id=None,
    )
    model = DiceModel(config)
    model.init_weights(std=0.25, head_std=0.6, seed=seed)
    save_model(model, out, dtype=torch.float32)
    tok_config = {
        "tokenizer_class": "Qwen2Tokenizer",
        "eos_token": "<|endoftext|>",
        "pad_token": "<|endoftext|>",
        "mask_token": "<|MASK|>",
        "bos_token": None,
        "model_max_length": config.max_position_embeddings,
    }
    (out / "tokenizer_config.json").write_text(json.dumps(tok_config, indent=2) + "\n", encoding="utf-8")
    return out
