"""KernelBench level 1 problem 47 (sum over a dimension, keepdim).

one thread per output, coalesced reads.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

sum_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// x viewed as (outer, r, inner); one thread per (outer, inner) output, consecutive threads read
// consecutive inner elements, so every step of the r loop is a coalesced row read.
__global__ void sum_dim_kernel(const float* __restrict__ x, float* __restrict__ y,
                               long long outer, long long r, long long inner) {
    long long idx = (long long)blockIdx.x * blockDim.x + threadIdx.x;
    if (idx >= outer * inner) return;
    long long o = idx / inner, k = idx % inner;
    const float* p = x + o * r * inner + k;
    float acc = 0.f;
    for (long long j = 0; j < r; ++j) acc += p[j * inner];
    y[idx] = acc;
}

torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim) {
    TORCH_CHECK(x.is_cuda() && x.scalar_type() == torch::kFloat32, "sum_dim_forward: float32 CUDA expected");
    auto xc = x.contiguous();
    dim = dim < 0 ? dim + xc.dim() : dim;
    TORCH_CHECK(dim >= 0 && dim < xc.dim(), "sum_dim_forward: bad dim");
    long long outer = 1, inner = 1, r = xc.size(dim);
    for (int64_t d = 0; d < dim; ++d) outer *= xc.size(d);
    for (int64_t d = dim + 1; d < xc.dim(); ++d) inner *= xc.size(d);
    auto sizes = xc.sizes().vec();
    sizes[dim] = 1;
    auto y = torch::empty(sizes, xc.options());
    const int threads = 256;
    long long total = outer * inner;
    sum_dim_kernel<<<(unsigned)((total + threads - 1) / threads), threads>>>(
        xc.data_ptr<float>(), y.data_ptr<float>(), outer, r, inner);
    return y;
}
"""

sum_cpp_source = "torch::Tensor sum_dim_forward(torch::Tensor x, int64_t dim);"

sum_ext = load_inline(
    name="sum_dim_ext",
    cpp_sources=sum_cpp_source,
    cuda_sources=sum_cuda_source,
    functions=["sum_dim_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self, dim: int):
        super().__init__()
        self.dim = dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return sum_ext.sum_dim_forward(x, self.dim)
