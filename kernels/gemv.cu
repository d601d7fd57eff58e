/* kernels/gemv.cu — matmul for decode: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), n <= 8.
 *
 * Bandwidth-bound: every weight byte is read once per step, so the kernel is built to keep
 * many 16-byte loads in flight: a warp owns R rows, each lane reads 8 bf16 of each row per
 * 256-wide chunk, and U chunks are loaded before any is used (R * U loads of 16 bytes in
 * flight per thread). x (fp32, small) stays in L1/L2. k % 8 == 0. */
#include "common.cuh"

enum { GEMV_WARPS = 4, GEMV_U = 4 };

template <int N, int GEMV_R>
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

template <int N, int GEMV_R>
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
            if (kk + u * 256 < k) gemv_chunk<N, GEMV_R>(acc, cur[u], x, n, k, kk + u * 256);
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

/* grid ceil(m / (GEMV_WARPS * 2)), block 32 * GEMV_WARPS (R = 2 rows a warp). */
extern "C" __global__ void __launch_bounds__(128) atlas_gemv1(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<1, 2>(out, x, w, bias, 1, m, k);
}

extern "C" __global__ void __launch_bounds__(128) atlas_gemv4(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<4, 2>(out, x, w, bias, n, m, k);
}

extern "C" __global__ void __launch_bounds__(128) atlas_gemv8(float *out, const float *x,
                                                              const bf16_t *w, const bf16_t *bias,
                                                              int n, int m, int k) {
    gemv_body<8, 2>(out, x, w, bias, n, m, k);
}

/* n = 1, 4 rows a warp: half the blocks of atlas_gemv1, for long outputs (gate_up, lm_head)
 * where atlas_gemv1's 1.7 waves of blocks leave a partial last wave. grid ceil(m / 16). */
extern "C" __global__ void __launch_bounds__(128) atlas_gemv1r4(float *out, const float *x,
                                                                const bf16_t *w, const bf16_t *bias,
                                                                int n, int m, int k) {
    gemv_body<1, 4>(out, x, w, bias, 1, m, k);
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

/* --- small batches on the tensor cores ----------------------------------------------------------
 * atlas_gemv_mma: out[n, m] = x[n, k] @ w[m, k]^T (+ bias), n <= 8, k % 32 == 0. Still bound by
 * reading w once, but the fp32 kernels above re-read x once per row pair and multiply on the
 * FMA units: at n = 8 they read 8x more x than w through L1 and ran 2.7x slower than n = 1.
 * Here a block owns 16 rows and its 4 warps share k, a warp taking 32 columns at a time:
 * each lane loads 16 bytes of 2 rows (rows g and g + 8, g = lane / 4) and 8 floats of x row g,
 * and mma.sync m16n8k16 multiplies them. The k order inside a 32-column block is permuted the
 * same way for w and x (a sum does not care), so that every load is a plain 16-byte vector.
 * x is split as hi + lo bf16 pairs and multiplied twice, which keeps about 16 bits of it
 * (near the fp32 kernels' results) at no cost that shows: the tensor cores are idle anyway. */
enum { GM_WARPS = 4, GM_U = 4 };

__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], uint32_t a0, uint32_t a1,
                                               uint32_t a2, uint32_t a3, uint32_t b0,
                                               uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, "
                 "{%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

/* (a, b) as bf16x2 hi and the rest lo: a ~ hi.lo16 + lo.lo16 to ~16 bits. */
__device__ __forceinline__ void split_bf16x2(float a, float b, uint32_t &hi, uint32_t &lo) {
    hi = pack_bf16x2(a, b);
    lo = pack_bf16x2(a - __uint_as_float(hi << 16), b - __uint_as_float(hi & 0xffff0000u));
}

/* One 32-column block: rows g, g + 8 of the tile (wl, wh: 8 bf16 at column q * 8 each) times
 * x row g (xa, xb: the same 8 columns). Step s covers physical columns q*8 + s*4 + 0..3,
 * as logical k (2q, 2q+1) and (2q+8, 2q+9) of the m16n8k16 fragments. */
__device__ __forceinline__ void gemv_mma_block(float (&c)[4], uint4 wl, uint4 wh, float4 xa,
                                               float4 xb) {
    uint32_t h0, l0, h1, l1;
    split_bf16x2(xa.x, xa.y, h0, l0);
    split_bf16x2(xa.z, xa.w, h1, l1);
    mma_bf16_16816(c, wl.x, wh.x, wl.y, wh.y, h0, h1);
    mma_bf16_16816(c, wl.x, wh.x, wl.y, wh.y, l0, l1);
    split_bf16x2(xb.x, xb.y, h0, l0);
    split_bf16x2(xb.z, xb.w, h1, l1);
    mma_bf16_16816(c, wl.z, wh.z, wl.w, wh.w, h0, h1);
    mma_bf16_16816(c, wl.z, wh.z, wl.w, wh.w, l0, l1);
}

/* grid ceil(m / 16), block 128. */
extern "C" __global__ void __launch_bounds__(GM_WARPS * 32) atlas_gemv_mma(float *out, const float *x,
                                                                         const bf16_t *w,
                                                                         const bf16_t *bias, int n,
                                                                         int m, int k) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, q = lane & 3;
    int r0 = blockIdx.x * 16, nk = k / 32;
    const bf16_t *wl = w + (size_t)min(r0 + g, m - 1) * k + q * 8;
    const bf16_t *wh = w + (size_t)min(r0 + g + 8, m - 1) * k + q * 8;
    const float *xr = x + (size_t)min(g, n - 1) * k + q * 8;
    bool has_x = g < n;
    float c[4] = {0.0f, 0.0f, 0.0f, 0.0f};

    /* warp takes 32-column blocks warp, warp + 4, ...; U of them in flight, the first ones
     * requested before waiting for the previous kernel (weights do not depend on it) */
    uint4 cl[GM_U], ch[GM_U];
#pragma unroll
    for (int u = 0; u < GM_U; u++) {
        int kb = warp + u * GM_WARPS;
        cl[u] = kb < nk ? ld_stream16(wl + kb * 32) : make_uint4(0, 0, 0, 0);
        ch[u] = kb < nk ? ld_stream16(wh + kb * 32) : make_uint4(0, 0, 0, 0);
    }
    pdl_trigger();
    pdl_wait();
    for (int it = warp; it < nk; it += GM_U * GM_WARPS) {
        uint4 nl[GM_U], nh[GM_U];
#pragma unroll
        for (int u = 0; u < GM_U; u++) {
            int kb = it + (GM_U + u) * GM_WARPS;
            nl[u] = kb < nk ? ld_stream16(wl + kb * 32) : make_uint4(0, 0, 0, 0);
            nh[u] = kb < nk ? ld_stream16(wh + kb * 32) : make_uint4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < GM_U; u++) {
            int kb = it + u * GM_WARPS;
            if (kb < nk) {
                float4 xa = make_float4(0.f, 0.f, 0.f, 0.f), xb = xa;
                if (has_x) {
                    xa = __ldg((const float4 *)(xr + kb * 32));
                    xb = __ldg((const float4 *)(xr + kb * 32 + 4));
                }
                gemv_mma_block(c, cl[u], ch[u], xa, xb);
            }
        }
#pragma unroll
        for (int u = 0; u < GM_U; u++) {
            cl[u] = nl[u];
            ch[u] = nh[u];
        }
    }
    /* c[0..1]: row r0 + g, columns (x rows) 2q, 2q + 1; c[2..3]: row r0 + g + 8 */
    __shared__ float red[GM_WARPS][4][32];
#pragma unroll
    for (int i = 0; i < 4; i++) red[warp][i][lane] = c[i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int i = 0; i < 4; i++) {
        float v = red[0][i][lane] + red[1][i][lane] + red[2][i][lane] + red[3][i][lane];
        int row = r0 + g + (i >= 2 ? 8 : 0), col = 2 * q + (i & 1);
        if (row < m && col < n) out[(size_t)col * m + row] = v + (bias ? bf2f(bias[row]) : 0.0f);
    }
}
