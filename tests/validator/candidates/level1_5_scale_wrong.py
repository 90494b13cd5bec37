"""KernelBench level 1 problem 5 (matrix * scalar).

WRONG on purpose: truncates the scalar to an int.
"""

import torch
import torch.nn as nn
from torch.utils.cpp_extension import load_inline

scale_cuda_source = r"""
#include <torch/extension.h>
#include <cuda_runtime.h>

// float4 loads/stores: the matrix is contiguous and its size a multiple of 4 (checked on the host).
__global__ void scale_vec4_kernel(const float4* __restrict__ a, float4* __restrict__ c, float s,
                                  long long n4) {
    long long stride = (long long)gridDim.x * blockDim.x;
    for (long long i = (long long)blockIdx.x * blockDim.x + threadIdx.x; i < n4; i += stride) {
        float4 v = a[i];
        c[i] = make_float4(v.x * s, v.y * s, v.z * s, v.w * s);
    }
}

torch::Tensor scale_forward(torch::Tensor a, double s) {
    TORCH_CHECK(a.is_cuda() && a.scalar_type() == torch::kFloat32, "scale_forward: float32 CUDA expected");
    auto ac = a.contiguous();
    TORCH_CHECK(ac.numel() % 4 == 0, "scale_forward: size must be a multiple of 4");
    auto c = torch::empty_like(ac);
    long long n4 = ac.numel() / 4;
    const int threads = 256;
    const long long blocks = std::min<long long>((n4 + threads - 1) / threads, 132LL * 32);
    scale_vec4_kernel<<<(unsigned)blocks, threads>>>(
        reinterpret_cast<const float4*>(ac.data_ptr<float>()), reinterpret_cast<float4*>(c.data_ptr<float>()),
        (float)s, n4);
    return c;
}
"""

scale_cpp_source = "torch::Tensor scale_forward(torch::Tensor a, double s);"

scale_ext = load_inline(
    name="scale_ext",
    cpp_sources=scale_cpp_source,
    cuda_sources=scale_cuda_source,
    functions=["scale_forward"],
    verbose=False,
)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, A: torch.Tensor, s: float) -> torch.Tensor:
        return scale_ext.scale_forward(A, int(s))
