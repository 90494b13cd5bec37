"""Row softmax as a KernelBench-format reference: `dice generate examples/kernelbench_softmax.py` asks the
model for a `ModelNew` that computes the same thing with a custom CUDA kernel (torch `load_inline`).

KernelBench format: a `Model(nn.Module)` whose `forward` is the reference computation, `get_inputs()` (the
forward arguments; the harness moves tensors to the GPU) and `get_init_inputs()` (the constructor's).
"""

import torch
import torch.nn as nn


class Model(nn.Module):
    """Softmax over the last dimension of a (batch_size, dim) matrix."""

    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x, dim=1)


batch_size = 512
dim = 16384


def get_inputs():
    x = torch.randn(batch_size, dim)
    return [x]


def get_init_inputs():
    return []
