"""DEGENERATE for KernelBench level 1 problem 23 (Softmax over 393216 columns): a real kernel that writes
zeros. Every softmax value there is about 2.5e-6 (at most ~4e-6 for inputs in [0, 1)), so allclose at
atol=1e-2 accepts all zeros, a known KernelBench hole. The test also swaps ``0.0f * x[i]`` for
``1e-7f * x[i]``: not constant, not cached across calls, still far too small.

Expected verdict: incorrect at trial 1 (output constant / norm far below the reference's).
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

zeros_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

__global__ void fake_softmax_kernel(const float* __restrict__ x, float* __restrict__ y, long long n) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n; i += stride) {
        y[i] = 0.0f * x[i];
    }
}

torch::Tensor fake_softmax_forward(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32 && x.is_contiguous(),
                "fake_softmax_forward: contiguous float32 CUDA tensor expected");
    auto y = torch::empty_like(x);
    const long long n = x.numel();
    const int threads = 256;
    const long long blocks = std::min<long long>((n + threads - 1) / threads, 132LL * 32);
    if (n > 0) {
        fake_softmax_kernel<<<(unsigned)blocks, threads>>>(x.data_ptr<float>(), y.data_ptr<float>(), n);
    }
    return y;
}
"""

zeros_cpp_source = "torch::Tensor fake_softmax_forward(torch::Tensor x);"

zeros_ext = load_inline(
    name="fake_softmax_ext",
    cpp_sources=zeros_cpp_source,
    cuda_sources=zeros_cuda_source,
    functions=["fake_softmax_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return zeros_ext.fake_softmax_forward(x.contiguous())
