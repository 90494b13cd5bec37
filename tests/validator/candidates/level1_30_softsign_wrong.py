"""KernelBench level 1 problem 30 (Softsign).

WRONG on purpose: processes a third of the elements.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softsign_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void softsign_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = v / (1.f + fabsf(v));
    }
}

torch::Tensor softsign_forward(torch::Tensor x, int64_t n) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "softsign_forward: contiguous float32 CUDA tensor expected");
    TORCH_CHECK(n >= 0 && n <= x.numel(), "softsign_forward: n out of range");
    auto y = torch::empty_like(x);
    const int threads = 256;
    const long long blocks = std::min<long long>((n + threads - 1) / threads, 132LL * 32);
    if (n > 0) {
        softsign_kernel<<<(unsigned)blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

softsign_cpp_source = "torch::Tensor softsign_forward(torch::Tensor x, int64_t n);"

softsign_ext = load_inline(
    name="softsign_ext",
    cpp_sources=softsign_cpp_source,
    cuda_sources=softsign_cuda_source,
    functions=["softsign_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        return softsign_ext.softsign_forward(x, x.numel() // 3)
