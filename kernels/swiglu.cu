/* kernels/swiglu.cu — the gated activations: out[n, f] = act(gu[n, :f]) * gu[n, f:], act
 * act's (glu_mul, common.cuh: SwiGLU, GeGLU or gpt-oss's clamped SwiGLU; also used by decode's
 * swiglu fusion in the gate_up GEMV's epilogue, kernels/gemv.cu, and the MoE kernels). */
#include "common.cuh"

extern "C" __global__ void atlas_swiglu(float *out, const float *gu, int f, long long total,
                                        glu_act act) {
    pdl_trigger();
    pdl_wait();
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        long long r = i / f, c = i - r * f;
        float g = gu[r * 2 * f + c], u = gu[r * 2 * f + f + c];
        out[i] = glu_mul(g, u, act);
    }
}

/* Prefill's bf16 path (ops_cuda.c, "bf16 copies for cuBLASLt"): gu is the gate_up matmul's
 * output in bf16 and out, in bf16, is the next matmul's input, so that neither the fp32
 * gate_up rows (2f floats a token) nor an fp32 out and its conversion pass cross memory.
 * 8 outputs a thread, f % 8 == 0. */
extern "C" __global__ void atlas_swiglu_bf16(bf16_t *out, const bf16_t *gu, int f, long long total,
                                             glu_act act) {
    pdl_trigger();
    pdl_wait();
    for (long long i = (blockIdx.x * (long long)blockDim.x + threadIdx.x) * 8; i < total;
         i += (long long)gridDim.x * blockDim.x * 8) {
        long long r = i / f, c = i - r * f;
        float g[8], u[8];
        unpack8(*(const uint4 *)(gu + r * 2 * f + c), g);
        unpack8(*(const uint4 *)(gu + r * 2 * f + f + c), u);
        uint32_t o[4];
#pragma unroll
        for (int j = 0; j < 4; j++)
            o[j] = pack_bf16x2(glu_mul(g[2 * j], u[2 * j], act),
                               glu_mul(g[2 * j + 1], u[2 * j + 1], act));
        *(uint4 *)(out + i) = make_uint4(o[0], o[1], o[2], o[3]);
    }
}
