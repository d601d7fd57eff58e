/* kernels/swiglu.cu — SwiGLU: out[n, f] = silu(gu[n, :f]) * gu[n, f:]. */
#include "common.cuh"

extern "C" __global__ void atlas_swiglu(float *out, const float *gu, int f, long long total) {
    pdl_trigger();
    pdl_wait();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / f, c = i - r * f;
        float g = gu[r * 2 * f + c], u = gu[r * 2 * f + f + c];
        out[i] = g / (1.0f + __expf(-g)) * u;
    }
}
