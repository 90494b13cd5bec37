"""A correct `ModelNew` for examples/kernelbench_softmax.py: one block per row, warp-shuffle reductions for
the row maximum and the sum of exponentials (a fixture for the validator and assistant tests)."""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

softmax_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>
#include <math_constants.h>

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;

__device__ __forceinline__ float warp_max(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v = fmaxf(v, __shfl_xor_sync(0xffffffff, v, offset));
    }
    return v;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int offset = 16; offset > 0; offset >>= 1) {
        v += __shfl_xor_sync(0xffffffff, v, offset);
    }
    return v;
}

// Reduces one value per thread to one value per block; every thread gets the result.
template <bool IsMax>
__device__ float block_reduce(float v, float* shared) {
    const int lane = threadIdx.x % 32;
    const int warp = threadIdx.x / 32;
    v = IsMax ? warp_max(v) : warp_sum(v);
    if (lane == 0) {
        shared[warp] = v;
    }
    __syncthreads();
    v = lane < kWarps ? shared[lane] : (IsMax ? -CUDART_INF_F : 0.0f);
    v = IsMax ? warp_max(v) : warp_sum(v);
    __syncthreads();  // shared[] is reused by the next reduction
    return v;
}

__global__ void softmax_rows_kernel(const float* __restrict__ x, float* __restrict__ y, int cols) {
    __shared__ float shared[kWarps];
    const float* x_row = x + static_cast<size_t>(blockIdx.x) * cols;
    float* y_row = y + static_cast<size_t>(blockIdx.x) * cols;

    float thread_max = -CUDART_INF_F;
    for (int c = threadIdx.x; c < cols; c += kThreads) {
        thread_max = fmaxf(thread_max, x_row[c]);
    }
    const float row_max = block_reduce<true>(thread_max, shared);

    float thread_sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += kThreads) {
        thread_sum += expf(x_row[c] - row_max);
    }
    const float inv_sum = 1.0f / block_reduce<false>(thread_sum, shared);

    for (int c = threadIdx.x; c < cols; c += kThreads) {
        y_row[c] = expf(x_row[c] - row_max) * inv_sum;
    }
}

torch::Tensor softmax_rows(torch::Tensor x) {
    TORCH_CHECK(x.is_cuda() && x.dim() == 2 && x.scalar_type() == torch::kFloat32,
                "softmax_rows expects a 2-D float32 CUDA tensor");
    x = x.contiguous();
    auto y = torch::empty_like(x);
    const int rows = static_cast<int>(x.size(0));
    const int cols = static_cast<int>(x.size(1));
    if (rows > 0) {
        softmax_rows_kernel<<<rows, kThreads>>>(x.data_ptr<float>(), y.data_ptr<float>(), cols);
    }
    return y;
}
"""

softmax_cpp_source = "torch::Tensor softmax_rows(torch::Tensor x);"

softmax = load_inline(
    name="softmax_rows",
    cpp_sources=softmax_cpp_source,
    cuda_sources=softmax_source,
    functions=["softmax_rows"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.softmax = softmax

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.softmax.softmax_rows(x)
