// Elementwise vector addition, c[i] = a[i] + b[i]: the smallest kernel with a hole to fill.
// `dice masks examples/vector_add.cu` lists the hole; `dice complete examples/vector_add.cu` fills it and,
// on a GPU, checks the fill against the dice-spec below.

/* dice-spec
import numpy
import torch

N = 1_000_003  # not a multiple of the block size: the bounds check matters
THREADS = 256


def inputs():
    generator = torch.Generator(device="cuda").manual_seed(0)
    a = torch.randn(N, device="cuda", generator=generator)
    b = torch.randn(N, device="cuda", generator=generator)
    return [a, b]


def reference(a, b):
    return a + b


def launch(module, a, b):
    c = torch.empty_like(a)
    n = a.numel()
    blocks = (n + THREADS - 1) // THREADS
    module.get_function("vector_add")((blocks,), (THREADS,), (a, b, c, numpy.int32(n)))
    return c


atol = 1e-6
rtol = 1e-6
*/

extern "C" __global__ void vector_add(const float* __restrict__ a, const float* __restrict__ b,
                                      float* __restrict__ c, int n) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) {
        c[i] = a[i] + b[i];
    }
}
