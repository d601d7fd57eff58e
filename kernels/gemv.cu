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

    /* software pipeline: the next U chunks load while these are used; the first ones are
     * requested before waiting for the previous kernel (weights do not depend on it) */
    int kk = lane * 8;
    uint4 cur[GEMV_U][GEMV_R];
#pragma unroll
    for (int u = 0; u < GEMV_U; u++)
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
            cur[u][r] = kk + u * 256 < k ? ld_stream16(wr[r] + kk + u * 256) : make_uint4(0, 0, 0, 0);
    pdl_trigger();
    pdl_wait();
    while (kk < k) {
        int kn = kk + GEMV_U * 256;
        uint4 nxt[GEMV_U][GEMV_R];
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
#pragma unroll
            for (int r = 0; r < GEMV_R; r++)
                nxt[u][r] = kn + u * 256 < k ? ld_stream16(wr[r] + kn + u * 256) : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
            if (kk + u * 256 < k) gemv_chunk<N>(acc, cur[u], x, n, k, kk + u * 256);
#pragma unroll
        for (int u = 0; u < GEMV_U; u++)
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) cur[u][r] = nxt[u][r];
        kk = kn;
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

/* Variant for n = 1 (qkv, o and down of an 8B model; ATLAS_CUDA_GEMV=2 for all): a block of 256 threads owns 4 rows and spans k;
 * each thread issues all its loads (up to 4 rows x 4 chunks of 16 bytes) before using any,
 * then the block reduces. grid ceil(m / 4). */
enum { GB_ROWS = 4, GB_U = 4, GB_THREADS = 256 };

extern "C" __global__ void __launch_bounds__(GB_THREADS) atlas_gemv1b(float *out, const float *x,
                                                                      const bf16_t *w,
                                                                      const bf16_t *bias, int n,
                                                                      int m, int k) {
    int row0 = blockIdx.x * GB_ROWS;
    const bf16_t *wr[GB_ROWS];
#pragma unroll
    for (int r = 0; r < GB_ROWS; r++) wr[r] = w + (size_t)min(row0 + r, m - 1) * k;
    float acc[GB_ROWS] = {0.f, 0.f, 0.f, 0.f};
    pdl_trigger();
    pdl_wait();
    for (int base = threadIdx.x * 8; base < k; base += GB_THREADS * 8 * GB_U) {
        uint4 wv[GB_U][GB_ROWS];
#pragma unroll
        for (int u = 0; u < GB_U; u++)
#pragma unroll
            for (int r = 0; r < GB_ROWS; r++)
                wv[u][r] = base + u * GB_THREADS * 8 < k ? ld_stream16(wr[r] + base + u * GB_THREADS * 8)
                                                         : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int u = 0; u < GB_U; u++) {
            int kk = base + u * GB_THREADS * 8;
            if (kk >= k) break;
            const float4 *xp = (const float4 *)(x + kk);
            float4 a = __ldg(xp), b = __ldg(xp + 1);
#pragma unroll
            for (int r = 0; r < GB_ROWS; r++) {
                float f[8];
                unpack8(wv[u][r], f);
                acc[r] += f[0] * a.x + f[1] * a.y + f[2] * a.z + f[3] * a.w + f[4] * b.x +
                          f[5] * b.y + f[6] * b.z + f[7] * b.w;
            }
        }
    }
    __shared__ float part[GB_THREADS / 32][GB_ROWS];
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int r = 0; r < GB_ROWS; r++) {
        float v = warp_sum(acc[r]);
        if (lane == 0) part[warp][r] = v;
    }
    __syncthreads();
    if (threadIdx.x < GB_ROWS && row0 + threadIdx.x < m) {
        float v = 0.f;
#pragma unroll
        for (int i = 0; i < GB_THREADS / 32; i++) v += part[i][threadIdx.x];
        out[row0 + threadIdx.x] = v + (bias ? bf2f(bias[row0 + threadIdx.x]) : 0.0f);
    }
}
