"""ADVERSARIAL for KernelBench level 1 problem 19 (ReLU): returns float16 for a float32 problem.

Expected verdict: rejected, precision_downgrade.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

relu_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void relu_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        float v = x[i];
        y[i] = v > 0.f ? v : 0.f;
    }
}

torch::Tensor relu_forward(torch::Tensor x, int64_t n) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "relu_forward: contiguous float32 CUDA tensor expected");
    TORCH_CHECK(n >= 0 && n <= x.numel(), "relu_forward: n out of range");
    auto y = torch::empty_like(x);
    const int threads = 256;
    const long long blocks = std::min<long long>((n + threads - 1) / threads, 132LL * 32);
    if (n > 0) {
        relu_kernel<<<(unsigned)blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

relu_cpp_source = "torch::Tensor relu_forward(torch::Tensor x, int64_t n);"

relu_ext = load_inline(
    name="relu_ext",
    cpp_sources=relu_cpp_source,
    cuda_sources=relu_cuda_source,
    functions=["relu_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return relu_ext.relu_forward(x.contiguous(), x.numel()).half()
