"""KernelBench level 1 problem 26 (GELU).

one fused grid-stride CUDA kernel.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

gelu_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void gelu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = 0.5f * v * (1.f + erff(v * 0.70710678118654752f));
    }
}

torch::Tensor gelu_forward(torch::Tensor x, int64_t n) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "gelu_forward: contiguous float32 CUDA tensor expected");
    TORCH_CHECK(n >= 0 && n <= x.numel(), "gelu_forward: n out of range");
    auto y = torch::empty_like(x);
    const int threads = 256;
    const long long blocks = std::min<long long>((n + threads - 1) / threads, 132LL * 32);
    if (n > 0) {
        gelu_kernel<<<(unsigned)blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

gelu_cpp_source = "torch::Tensor gelu_forward(torch::Tensor x, int64_t n);"

gelu_ext = load_inline(
    name="gelu_ext",
    cpp_sources=gelu_cpp_source,
    cuda_sources=gelu_cuda_source,
    functions=["gelu_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.contiguous()
        return gelu_ext.gelu_forward(x, x.numel())
