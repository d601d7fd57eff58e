/* kernels/probe.cu — the smallest module: proves the build embeds kernels and the registry
 * loads them (tests/test-gpu-host.c), independent of the model's kernels. */
#include <stdint.h>

/* out[i] = value for i < n.  grid: ceil(n / blockDim.x) blocks. */
extern "C" __global__ void atlas_probe_fill_u32(uint32_t *out, uint32_t value, uint32_t n) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = value;
}

/* out[i] = in[i] * 2 + 1: checks that a kernel reads what the host uploaded. */
extern "C" __global__ void atlas_probe_affine_u32(uint32_t *out, const uint32_t *in, uint32_t n) {
    uint32_t i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) out[i] = in[i] * 2u + 1u;
}
