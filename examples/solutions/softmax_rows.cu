// Row-wise softmax of a (rows, cols) float32 matrix:
//     y[r, c] = exp(x[r, c] - max_c x[r, :]) / sum_c exp(x[r, c] - max_c x[r, :])
// One block per row. The block's threads stride over the row's columns, then combine their partial
// results with tree reductions in shared memory: first the maximum (for numerical stability), then the sum
// of exponentials. Two holes: the max-reduction and the normalisation.

#define BLOCK_SIZE 256                      // threads per block: a power of two, the reductions halve it
#define NEG_INF __int_as_float(0xff800000)  // -infinity without <cmath>

/* dice-spec
import numpy
import torch

ROWS, COLS = 4096, 1000  # COLS is not a multiple of the block size on purpose
BLOCK_SIZE = 256         # must match the #define in the kernel file


def inputs():
    generator = torch.Generator(device="cuda").manual_seed(0)
    return [torch.randn(ROWS, COLS, device="cuda", generator=generator) * 4.0]


def reference(x):
    return torch.softmax(x, dim=-1)


def launch(module, x):
    rows, cols = x.shape
    y = torch.empty_like(x)
    module.get_function("softmax_rows")(
        (rows,), (BLOCK_SIZE,), (x, y, numpy.int32(rows), numpy.int32(cols))
    )
    return y


atol = 1e-6
rtol = 1e-4
*/

extern "C" __global__ void softmax_rows(const float* __restrict__ x, float* __restrict__ y, int rows,
                                        int cols) {
    __shared__ float scratch[BLOCK_SIZE];
    const int row = blockIdx.x;
    if (row >= rows) {
        return;  // the whole block leaves together, so no __syncthreads below is skipped by half a block
    }
    const float* x_row = x + static_cast<size_t>(row) * cols;
    float* y_row = y + static_cast<size_t>(row) * cols;

    // 1. Row maximum: a strided scan per thread, then a tree reduction over scratch.
    float thread_max = NEG_INF;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        thread_max = fmaxf(thread_max, x_row[c]);
    }
    scratch[threadIdx.x] = thread_max;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
        }
        __syncthreads();
    }
    const float row_max = scratch[0];
    __syncthreads();  // everyone has read scratch[0] before it is reused for the sums

    // 2. Sum of exponentials, reduced the same way.
    float thread_sum = 0.0f;
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        thread_sum += expf(x_row[c] - row_max);
    }
    scratch[threadIdx.x] = thread_sum;
    __syncthreads();
    for (int stride = blockDim.x / 2; stride > 0; stride >>= 1) {
        if (threadIdx.x < stride) {
            scratch[threadIdx.x] += scratch[threadIdx.x + stride];
        }
        __syncthreads();
    }
    const float inv_sum = 1.0f / scratch[0];

    // 3. Normalise.
    for (int c = threadIdx.x; c < cols; c += blockDim.x) {
        y_row[c] = expf(x_row[c] - row_max) * inv_sum;
    }
}
