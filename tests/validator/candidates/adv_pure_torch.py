"""ADVERSARIAL for KernelBench level 1 problem 19 (ReLU): no custom kernel at all.

Expected verdict: rejected, no_custom_kernel.
"""

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.clamp_min(x, 0.0)
