/* kernels/gemv.cu — matmul for decode: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), n <= 8.
 *
 * Bandwidth-bound: every weight byte is read once per step, so the kernel is built to keep
 * many 16-byte loads in flight: a warp owns R rows, each lane reads 8 bf16 of each row per
 * 256-wide chunk, and U chunks are loaded before any is used (R * U loads of 16 bytes in
 * flight per thread). x (fp32, small) stays in L1/L2. k % 8 == 0. */
#include "common.cuh"

enum { GEMV_WARPS = 4, GEMV_R = 2, GEMV_U = 4 };

template <int N>
__device__ __forceinline__ void gemv_chunk(float (&acc)[GEMV_R][N], const uint4 (&wv)[GEMV_R],
                                           const float *x, int n, int k, int kk) {
#pragma unroll
    for (int j = 0; j < N; j++) {
        if (j < n) {
            const float4 *xp = (const float4 *)(x + (size_t)j * k + kk);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) {
                float f[8];
                unpack8(wv[r], f);
                acc[r][j] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w +
                             f[4] * b.x + f[5] * b.y + f[6] * b.z + f[7] * b.w;
            }
        }
    }
}

template <int N>
__device__ __forceinline__ void gemv_body(float *out, const float *x, const bf16_t *w,
                                          const bf16_t *bias, int n, int m, int k) {
    int lane = threadIdx.x & 31;
    int row0 = (blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5)) * GEMV_R;
    if (row0 >= m) return;
    const bf16_t *wr[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) wr[r] = w + (size_t)min(row0 + r, m - 1) * k;
    float acc[GEMV_R][N];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
        for (int j = 0; j < N; j++) acc[r][j] = 0.0f;

    int kk = lane * 8;
    for (; kk + (GEMV_U - 1) * 256 < k; kk += GEMV_U * 256) {
        uint4 wv[GEMV_U][GEMV_R];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) wv[u][r] = ld_stream16(wr[r] + kk + u * 256);
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) gemv_chunk<N>(acc, wv[u], x, n, k, kk + u * 256);
    }
    for (; kk < k; kk += 256) {
        uint4 wv[GEMV_R];
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) wv[r] = ld_stream16(wr[r] + kk);
        gemv_chunk<N>(acc, wv, x, n, k, kk);
    }
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
#pragma unroll
        for (int j = 0; j < N; j++) {
            float s = warp_sum(acc[r][j]);
            if (lane == 0 && j < n && row0 + r < m)
                out[(size_t)j * m + row0 + r] = s + (bias ? bf2f(bias[row0 + r]) : 0.0f);
        }
    }
}

/* grid ceil(m / (GEMV_WARPS * GEMV_R)), block 32 * GEMV_WARPS. */
extern "C" __global__ void __launch_bounds__(128) atlas_gemv1(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<1>(out, x, w, bias, 1, m, k);
}

extern "C" __global__ void __launch_bounds__(128) atlas_gemv4(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<4>(out, x, w, bias, n, m, k);
}

extern "C" __global__ void __launch_bounds__(128) atlas_gemv8(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<8>(out, x, w, bias, n, m, k);
}
