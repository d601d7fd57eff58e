/* kernels/quant_mma.cuh — the bodies of the 2-64 row tensor-core matmuls of quantized
 * weights and of x's split for them (atlas_qmma*, atlas_qmmp*, atlas_qsplit_*:
 * kernels/quant.cu instantiates them). */
#ifndef ATLAS_KERNELS_QUANT_MMA_CUH
#define ATLAS_KERNELS_QUANT_MMA_CUH

#include "quant.cuh"

/* --- 2 to 64 rows on the tensor cores ----------------------------------------------------------
 * atlas_qmma<NG>_<fmt>: out[n, m] = x[n, k] @ w^T (+ bias), n <= 8 NG, as atlas_gemv_mma
 * (kernels/gemv.cu) does for bf16: a block owns 16 weight rows and its 4 warps share k; each
 * lane loads 16 bytes of codes of rows g and g + 8 (g = lane / 4) a chunk, dequantizes them in
 * registers into the A fragments of mma.sync m16n8k16, and multiplies them with x rows g,
 * g + 8, ... of the same columns (x split into hi + lo bf16, as there). The k order inside a
 * lane's columns is permuted the same way for w and x, so a chunk's k steps mix its CH
 * columns. When one scale covers a whole chunk (groups of CH columns or more: FP8 blocks of
 * 128, INT4 groups of 128, per channel), the codes go into the fragments unscaled (exact in
 * bf16: e4m3, e2m1, q - zero) and the chunk's fp32 partial sums are scaled, as block-scaled
 * GEMMs do, so the product is as exact as the fp32 GEMV's but for x's split; smaller groups
 * round code x scale to bf16 (exact for MXFP4's powers of two and NVFP4's e4m3 scales, whose
 * fp32 global factor is the rowscale). Every weight byte is read once whatever n is. */
enum { QM_WARPS = 4 };

/* (q - z) of nibbles j and j + 4 of v (columns j, j + 4 of its 8) as bf16x2 (j's low): 128 + q
 * is the nibble under bf16 128.0's exponent, z128 is 128 + z in both halves, and the
 * difference of such small integers is exact. */
__device__ __forceinline__ uint32_t int4_pair(uint32_t v, int j, uint32_t z128) {
    uint32_t c = ((v >> (4 * j)) & 0x000F000Fu) | 0x43004300u, d;
    asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(z128), "r"(0xBF80BF80u), "r"(c));
    return d;
}

/* The pairs of columns the tensor-core kernels put in one bf16x2, of a lane's E columns, for
 * k step s (four columns): FP8 (4s, 4s + 1) and (4s + 2, 4s + 3); the 4-bit formats the
 * nibbles int4_pair takes, (8w + j, 8w + j + 4) and (8w + j + 1, 8w + j + 5) with w = s / 2,
 * j = 2 (s % 2). first: the first pair's first column; the second pair starts one (4-bit)
 * or two (FP8) after it, each pair's second column one (FP8) or four after its first. */
template <int FMT> __device__ __forceinline__ int pair_first(int s) {
    return FMT == QF_FP8 ? 4 * s : 8 * (s >> 1) + 2 * (s & 1);
}
template <int FMT> __host__ __device__ constexpr int pair_next() { return FMT == QF_FP8 ? 2 : 1; }
template <int FMT> __host__ __device__ constexpr int pair_gap() { return FMT == QF_FP8 ? 1 : 4; }

/* x [n, k] split into bf16 hi + lo (split_bf16x2) once for every block of a tensor-core matmul
 * (each re-split its x: about 6 instructions a pair of values, a block of 16 weight rows,
 * bench/RESULTS.md): xs[t, c / 4 + s] for the E columns from c (a multiple of E) is
 * (hi, lo) of the first pair of k step s, then (hi, lo) of the second, in pair_first's
 * order. grid-stride over n k / 4 slots, block 256. */
template <int FMT>
__device__ __forceinline__ void qsplit_body(uint4 *xs, const float *x, int n, int k) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    pdl_wait(); /* x is the previous kernel's; xs may still be read by the previous matmul */
    const long long per_row = k / 4, total = (long long)n * per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int t = (int)(i / per_row), c4 = (int)(i % per_row) * 4;
        int c0 = c4 / E * E, st = (c4 - c0) / 4, f = c0 + pair_first<FMT>(st);
        const float *xr = x + (size_t)t * k;
        int f2 = f + pair_next<FMT>();
        uint32_t h0, l0, h1, l1;
        split_bf16x2(xr[f], xr[f + pair_gap<FMT>()], h0, l0);
        split_bf16x2(xr[f2], xr[f2 + pair_gap<FMT>()], h1, l1);
        xs[i] = make_uint4(h0, l0, h1, l1);
    }
    pdl_trigger();
}
/* SPLIT: x comes split (atlas_qsplit_*, xs) and the A fragments pair columns as
 * pair_first says; INT4 with a scale a chunk takes its codes straight into bf16x2 pairs
 * (int4_pair) instead of floats one at a time. CHUNKED: the caller promises a scale a chunk
 * (q.csh >= CH_LOG2), so only that path is compiled: the float arrays of the other, which
 * the compiler had to keep registers for, go (atlas_qmmp2_int4 168 registers, atlas_qmmq2_int4
 * 72: three blocks an SM against seven). */
template <int FMT, int NG, bool SPLIT = false, bool CHUNKED = false>
__device__ __forceinline__ void qmma_body(float *out, const float *x, const uint8_t *w,
                                          const bf16_t *bias, int n, int m, int k, qargs q,
                                          const uint4 *xs = nullptr) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    constexpr int CH = 4 * E; /* columns a warp takes a chunk */
    constexpr int CH_LOG2 = FMT == QF_FP8 ? 6 : 7;
    __shared__ float red[QM_WARPS][NG][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qq = lane & 3;
    const int r0 = blockIdx.x * 16, rl = min(r0 + g, m - 1), rh = min(r0 + g + 8, m - 1);
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    const uint8_t *wl = w + (size_t)rl * rbytes, *wh = w + (size_t)rh * rbytes;
    const int nch = (k + CH - 1) / CH;
    /* one scale a chunk and row (31: a row) */
    const bool chunk_scaled = CHUNKED || q.csh >= CH_LOG2;
    float c[NG][4];
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) c[j][i] = 0.0f;
    auto col_of = [&](int ch) { return ch * CH + qq * E; };
    auto load = [&](const uint8_t *wr, int ch) {
        int cb = col_of(ch);
        return ch < nch && cb < k ? ld_stream16(wr + (FMT == QF_FP8 ? cb : cb / 2))
                                  : make_uint4(0, 0, 0, 0);
    };
    uint4 cl = load(wl, warp), chh = load(wh, warp);
    pdl_trigger();
    pdl_wait();
    for (int ch = warp; ch < nch; ch += QM_WARPS) {
        uint4 nl = load(wl, ch + QM_WARPS), nh = load(wh, ch + QM_WARPS);
        /* mma.sync wants the whole warp: lanes past k multiply zeros of x */
        int cb = col_of(ch);
        bool in = cb < k;
        /* INT4's codes straight into pairs: a scale a chunk, the zero subtracted in bf16 */
        constexpr bool PAIRS = SPLIT && FMT == QF_INT4;
        const bool pairs = PAIRS && chunk_scaled;
        float fl[E], fh[E], t[NG][4];
        uint32_t zl = 0, zh = 0; /* 128 + the chunk's zero of rows g and g + 8, bf16x2 */
        if (pairs) {
            int cs = in ? cb : 0;
            float z0 = __ldg(q.zeros + (size_t)(rl >> q.rsh) * q.scols + (cs >> q.csh));
            float z1 = __ldg(q.zeros + (size_t)(rh >> q.rsh) * q.scols + (cs >> q.csh));
            zl = pack_bf16x2(128.0f + z0, 128.0f + z0);
            zh = pack_bf16x2(128.0f + z1, 128.0f + z1);
        } else {
            qrow<FMT>(cl, fl, rl, cb, k, q, !chunk_scaled);
            qrow<FMT>(chh, fh, rh, cb, k, q, !chunk_scaled);
        }
#pragma unroll
        for (int j = 0; j < NG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) t[j][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < E / 4; s++) {
            uint32_t a[4];
            if (!SPLIT) {
                a[0] = cvt_bf16x2(fl[4 * s], fl[4 * s + 1]);
                a[1] = cvt_bf16x2(fh[4 * s], fh[4 * s + 1]);
                a[2] = cvt_bf16x2(fl[4 * s + 2], fl[4 * s + 3]);
                a[3] = cvt_bf16x2(fh[4 * s + 2], fh[4 * s + 3]);
            } else if (pairs) {
                const uint32_t wl[4] = {cl.x, cl.y, cl.z, cl.w};
                const uint32_t wh[4] = {chh.x, chh.y, chh.z, chh.w};
                const int jj = 2 * (s & 1);
                a[0] = int4_pair(wl[s >> 1], jj, zl);
                a[1] = int4_pair(wh[s >> 1], jj, zh);
                a[2] = int4_pair(wl[s >> 1], jj + 1, zl);
                a[3] = int4_pair(wh[s >> 1], jj + 1, zh);
            } else {
                const int f = pair_first<FMT>(s), f2 = f + pair_next<FMT>(), d = pair_gap<FMT>();
                a[0] = cvt_bf16x2(fl[f], fl[f + d]);
                a[1] = cvt_bf16x2(fh[f], fh[f + d]);
                a[2] = cvt_bf16x2(fl[f2], fl[f2 + d]);
                a[3] = cvt_bf16x2(fh[f2], fh[f2 + d]);
            }
#pragma unroll
            for (int j = 0; j < NG; j++) {
                int xr = j * 8 + g;
                if (j * 8 >= n) break;
                uint32_t h0, l0, h1, l1;
                if (SPLIT) {
                    uint4 xv = xr < n && in ? __ldg(xs + (size_t)xr * (k / 4) + cb / 4 + s)
                                            : make_uint4(0, 0, 0, 0);
                    h0 = xv.x, l0 = xv.y, h1 = xv.z, l1 = xv.w;
                } else {
                    float4 xv = xr < n && in ? __ldg(reinterpret_cast<const float4 *>(
                                                   x + (size_t)xr * k + cb + 4 * s))
                                             : make_float4(0.f, 0.f, 0.f, 0.f);
                    split_bf16x2(xv.x, xv.y, h0, l0);
                    split_bf16x2(xv.z, xv.w, h1, l1);
                }
                mma_bf16_16816(t[j], a, h0, h1);
                mma_bf16_16816(t[j], a, l0, l1);
            }
        }
        float sl = 1.0f, sh = 1.0f; /* the chunk's scales of rows g and g + 8 */
        if (chunk_scaled) {
            int cs = in ? cb : 0;
            sl = __ldg(q.scales + (size_t)(rl >> q.rsh) * q.scols + (cs >> q.csh));
            sh = __ldg(q.scales + (size_t)(rh >> q.rsh) * q.scols + (cs >> q.csh));
        }
#pragma unroll
        for (int j = 0; j < NG; j++) {
            c[j][0] = fmaf(sl, t[j][0], c[j][0]);
            c[j][1] = fmaf(sl, t[j][1], c[j][1]);
            c[j][2] = fmaf(sh, t[j][2], c[j][2]);
            c[j][3] = fmaf(sh, t[j][3], c[j][3]);
        }
        cl = nl;
        chh = nh;
    }
    /* c[j][0..1]: row r0 + g, x rows 8j + 2qq, + 1; c[j][2..3]: row r0 + g + 8 */
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][j][i][lane] = c[j][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float v = red[0][j][i][lane] + red[1][j][i][lane] + red[2][j][i][lane] +
                      red[3][j][i][lane];
            int row = r0 + g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * qq + (i & 1);
            if (row < m && col < n)
                out[(size_t)col * m + row] =
                    v * row_factor(q, row) + (bias ? bf2f(bias[row]) : 0.0f);
        }
}

/* --- 16 RT weight rows a block, each x fragment loaded once for all RT tiles ---------------
 * atlas_qmmw<NG>x<RT>_int4: atlas_qmmq's path (x split once, INT4 codes straight into bf16x2
 * pairs, a scale a 128-column chunk) with RT tiles of 16 rows a block instead of one. At 16
 * rows qmmq waits on its x loads (ncu: long_scoreboard 59% of the stalls, bench/RESULTS.md):
 * each block reads all of x from L2, n k 4 bytes (256 KB at the 8B shapes, against 32 KB of
 * codes), and a lane loads 16 bytes of x a k step and column group for 2 of codes a row.
 * Here a lane loads its x fragments once a k step and multiplies them with the codes of RT
 * tiles (2 RT loads of codes in flight a lane a chunk), so x's traffic is RT times smaller.
 * (128 rows a block lost before the split and the bf16x2 pairs, when each block still split
 * x and dequantized one value at a time: bench/RESULTS.md.) */
template <int RT, int NG> __device__ __forceinline__ void zero_tiles(float (&v)[RT][NG][4]) {
#pragma unroll
    for (int t = 0; t < RT; t++)
#pragma unroll
        for (int j = 0; j < NG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) v[t][j][i] = 0.0f;
}

template <int NG, int RT>
__device__ __forceinline__ void qmmw_body(float *out, const uint8_t *w, const bf16_t *bias,
                                          int n, int m, int k, qargs q, const uint4 *xs) {
    constexpr int E = 32, CH = 4 * E;
    __shared__ float red[QM_WARPS][RT][NG][4][32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qq = lane & 3;
    const int r0 = blockIdx.x * 16 * RT;
    const size_t rbytes = (size_t)k / 2;
    const int nch = (k + CH - 1) / CH;
    int rl[RT], rh[RT];
#pragma unroll
    for (int t = 0; t < RT; t++) {
        rl[t] = min(r0 + 16 * t + g, m - 1);
        rh[t] = min(r0 + 16 * t + g + 8, m - 1);
    }
    float c[RT][NG][4];
    zero_tiles<RT, NG>(c);
    auto load = [&](int r, int ch) {
        int cb = ch * CH + qq * E;
        return ch < nch && cb < k ? ld_stream16(w + (size_t)r * rbytes + cb / 2)
                                  : make_uint4(0, 0, 0, 0);
    };
    uint4 cl[RT], chh[RT];
#pragma unroll
    for (int t = 0; t < RT; t++) {
        cl[t] = load(rl[t], warp);
        chh[t] = load(rh[t], warp);
    }
    pdl_trigger();
    pdl_wait();
    for (int ch = warp; ch < nch; ch += QM_WARPS) {
        uint4 nl[RT], nh[RT];
#pragma unroll
        for (int t = 0; t < RT; t++) {
            nl[t] = load(rl[t], ch + QM_WARPS);
            nh[t] = load(rh[t], ch + QM_WARPS);
        }
        const int cb = ch * CH + qq * E;
        const bool in = cb < k; /* mma.sync wants the whole warp: lanes past k multiply 0s */
        const int cs = in ? cb : 0;
        uint32_t zl[RT], zh[RT]; /* 128 + each tile's chunk zeros of rows g and g + 8 */
        size_t gl[RT], gh[RT];   /* and where their scales and zeros are in the grids */
#pragma unroll
        for (int t = 0; t < RT; t++) {
            gl[t] = (size_t)(rl[t] >> q.rsh) * q.scols + (cs >> q.csh);
            gh[t] = (size_t)(rh[t] >> q.rsh) * q.scols + (cs >> q.csh);
            float z0 = __ldg(q.zeros + gl[t]), z1 = __ldg(q.zeros + gh[t]);
            zl[t] = pack_bf16x2(128.0f + z0, 128.0f + z0);
            zh[t] = pack_bf16x2(128.0f + z1, 128.0f + z1);
        }
        float p[RT][NG][4]; /* this chunk's sums, unscaled */
        zero_tiles<RT, NG>(p);
#pragma unroll
        for (int s = 0; s < E / 4; s++) {
            uint4 xv[NG]; /* x rows 8j + g, this k step: (hi, lo) of its two pairs */
#pragma unroll
            for (int j = 0; j < NG; j++) {
                int xr = j * 8 + g;
                xv[j] = xr < n && in ? __ldg(xs + (size_t)xr * (k / 4) + cb / 4 + s)
                                     : make_uint4(0, 0, 0, 0);
            }
            const int jj = 2 * (s & 1);
#pragma unroll
            for (int t = 0; t < RT; t++) {
                const uint32_t wl[4] = {cl[t].x, cl[t].y, cl[t].z, cl[t].w};
                const uint32_t wh[4] = {chh[t].x, chh[t].y, chh[t].z, chh[t].w};
                uint32_t a[4] = {int4_pair(wl[s >> 1], jj, zl[t]), int4_pair(wh[s >> 1], jj, zh[t]),
                                 int4_pair(wl[s >> 1], jj + 1, zl[t]),
                                 int4_pair(wh[s >> 1], jj + 1, zh[t])};
#pragma unroll
                for (int j = 0; j < NG; j++) {
                    if (j * 8 >= n) break;
                    mma_bf16_16816(p[t][j], a, xv[j].x, xv[j].z);
                    mma_bf16_16816(p[t][j], a, xv[j].y, xv[j].w);
                }
            }
        }
#pragma unroll
        for (int t = 0; t < RT; t++) {
            float sl = __ldg(q.scales + gl[t]), sh = __ldg(q.scales + gh[t]);
#pragma unroll
            for (int j = 0; j < NG; j++) {
                c[t][j][0] = fmaf(sl, p[t][j][0], c[t][j][0]);
                c[t][j][1] = fmaf(sl, p[t][j][1], c[t][j][1]);
                c[t][j][2] = fmaf(sh, p[t][j][2], c[t][j][2]);
                c[t][j][3] = fmaf(sh, p[t][j][3], c[t][j][3]);
            }
            cl[t] = nl[t];
            chh[t] = nh[t];
        }
    }
    /* c[t][j][0..1]: row r0 + 16t + g, x rows 8j + 2qq, + 1; [2..3]: row r0 + 16t + g + 8 */
#pragma unroll
    for (int t = 0; t < RT; t++)
#pragma unroll
        for (int j = 0; j < NG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) red[warp][t][j][i][lane] = c[t][j][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int t = 0; t < RT; t++)
#pragma unroll
        for (int j = 0; j < NG; j++)
#pragma unroll
            for (int i = 0; i < 4; i++) {
                float v = red[0][t][j][i][lane] + red[1][t][j][i][lane] +
                          red[2][t][j][i][lane] + red[3][t][j][i][lane];
                int row = r0 + 16 * t + g + (i >= 2 ? 8 : 0), col = 8 * j + 2 * qq + (i & 1);
                if (row < m && col < n)
                    out[(size_t)col * m + row] =
                        v * row_factor(q, row) + (bias ? bf2f(bias[row]) : 0.0f);
            }
}

#endif
