/* kernels/quant.cu — matmul of quantized weights (backend/backend.h, atlas_wformat):
 *   atlas_qgemv1_<fmt>    out[1, m] = x[1, k] @ w[m, k]^T (+ bias) (decode at batch 1): the
 *                         packed bytes read once with streaming loads and dequantized in
 *                         registers, in fp32 (weight-only: the activations are not rounded);
 *                         atlas_qgemv8_int4g the same for 2..8 rows with act-order
 *   atlas_qmma<NG>_<fmt>  2..8 NG rows (serving steps) on the tensor cores, below
 *   atlas_qdequant_<fmt>  w as bf16 [m, k] into a scratch buffer, for the bf16 matmuls of
 *                         larger batches (prefill: compute-bound, so the extra pass is small)
 * fmt: fp8 (e4m3 codes [m, k]), int4 ([m, k/2] bytes, column 2j in the low nibble of byte j;
 * w = (q - zero) * scale), int4g (the same with GPTQ's act-order g_idx), fp4 (e2m1 codes packed
 * as int4; w = e2m1 * scale). Scales (and zeros) are float32 over the grid
 * [ceil(m / br), scols]: element (r, c) takes entry (r >> rsh) * scols + (c >> csh), a scale
 * covering 2^rsh rows and 2^csh >= 16 columns (a shift of 31: all of them). int4g instead
 * takes entry r * scols + g_idx[part(r) * k + c], where the rows of a fused weight's parts
 * (each with its own g_idx) begin at 0, p1 and p2. k % 16 == 0 (fp8) or k % 32 == 0. */
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#include "mma.cuh"

enum { QF_FP8 = 1, QF_INT4 = 2, QF_FP4 = 3 }; /* atlas_wformat's values */

/* A block of QG_THREADS threads owns QG_ROWS weight rows and spans k, each thread QG_ROWS
 * 16-byte loads a step, all issued before any is used; the activations a thread reads (its
 * columns of x) serve all the rows. */
enum { QG_ROWS = 4, QG_THREADS = 128, QG_WARPS = QG_THREADS / 32 };

/* The value of each OCP e2m1 code. */
__device__ __forceinline__ float e2m1_value(int c) {
    const float mag[8] = {0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f};
    return c & 8 ? -mag[c & 7] : mag[c & 7];
}

/* The e2m1 values in shared memory for the block (FP4 only; one barrier). */
template <int FMT> __device__ __forceinline__ void lut_init(float *lut) {
    if (FMT != QF_FP4) return;
    if (threadIdx.x < 16) lut[threadIdx.x] = e2m1_value(threadIdx.x);
    __syncthreads();
}

/* 4 e4m3 codes (one 32-bit word, the first in the low byte) as floats: every e4m3 value is a
 * half exactly, and sm_89+ converts two at a time in one instruction. */
__device__ __forceinline__ void fp8x4(uint32_t v, float *f) {
    __half2_raw lo = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v & 0xffffu), __NV_E4M3);
    __half2_raw hi = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)(v >> 16), __NV_E4M3);
    float2 a = __half22float2(*reinterpret_cast<__half2 *>(&lo));
    float2 b = __half22float2(*reinterpret_cast<__half2 *>(&hi));
    f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
}

/* Nibble i of v as a float 0..15: OR-ing it into the mantissa of 2^23 is exact. */
__device__ __forceinline__ float nib(uint32_t v, int i) {
    return __uint_as_float(0x4B000000u | ((v >> (4 * i)) & 15u)) - 8388608.0f;
}

/* The 16 codes of half h (columns 16h .. 16h + 15 of the load) as unscaled values: FP8 and
 * FP4 their values, INT4 q (0..15). FP8's load holds one half, the 4-bit ones two. */
template <int FMT>
__device__ __forceinline__ void codes16(const uint4 &u, int h, float *f, const float *lut) {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
    if (FMT == QF_FP8) {
#pragma unroll
        for (int i = 0; i < 4; i++) fp8x4(w[i], f + 4 * i);
    } else {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            uint32_t v = w[2 * h + i];
#pragma unroll
            for (int j = 0; j < 8; j++)
                f[8 * i + j] = FMT == QF_FP4 ? lut[(v >> (4 * j)) & 15u] : nib(v, j);
        }
    }
}

/* x[c, c + E) as floats (16-byte aligned: k and c are multiples of 16). */
template <int E>
__device__ __forceinline__ void load_x(float *xf, const float *x) {
#pragma unroll
    for (int i = 0; i < E / 4; i++) {
        float4 v = __ldg(reinterpret_cast<const float4 *>(x) + i);
        xf[4 * i] = v.x; xf[4 * i + 1] = v.y; xf[4 * i + 2] = v.z; xf[4 * i + 3] = v.w;
    }
}

struct qargs {
    const float *scales, *zeros;
    const int32_t *g_idx;
    int rsh, csh, scols, p1, p2;
};

/* Decode's fusions around one-row GEMVs (ops_cuda.c cuda_exec_fused), as kernels/gemv.cu's
 * for bf16, each on when its pointer is set: nw (with eps, h): the input is rmsnorm(x) * nw,
 * x being the residual stream (the block sums x^2 and scales its dot products at the end;
 * block 0 writes h, the norm's output); resid: the output is also added into resid; act: the
 * block's rows are gate rows 2b, 2b + 1 and up rows f + 2b, f + 2b + 1 (m = 2f) and
 * act[i] = act(gate i) * up i (gelu: GeLU-tanh, else silu; glu_mul) is written beside the
 * output. */
struct qfuse {
    const bf16_t *nw;
    float eps;
    float *h, *resid, *act;
    int gelu;
};

/* N: the most activation rows (n <= N). GIDX: INT4 with a g_idx (a scale and zero looked up a
 * column). */
template <int FMT, int N, bool GIDX>
__device__ __forceinline__ void qgemv_body(float *out, const float *x, const uint8_t *w,
                                           const bf16_t *bias, int n, int m, int k, qargs q,
                                           qfuse fx = qfuse{0, 0.0f, 0, 0, 0, 0}) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32; /* columns a 16-byte load holds */
    constexpr int HALVES = E / 16;
    __shared__ float lut[16];
    __shared__ float red[QG_WARPS][QG_ROWS][N];
    lut_init<FMT>(lut);
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    int rows[QG_ROWS]; /* the block's weight rows */
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++)
        rows[r] = fx.act ? (r >> 1) * (m / 2) + 2 * blockIdx.x + (r & 1) : blockIdx.x * QG_ROWS + r;
    const uint8_t *wr[QG_ROWS];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) wr[r] = w + (size_t)min(rows[r], m - 1) * rbytes;
    float ss = 0.0f; /* the norm fusion's sum of x^2 */
    float acc[QG_ROWS][N];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++)
#pragma unroll
        for (int j = 0; j < N; j++) acc[r][j] = 0.0f;

    int c = tid * E;
    uint4 cur[QG_ROWS];
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++) /* the weights do not depend on the previous kernel */
        cur[r] = c < k ? ld_stream16(wr[r] + (FMT == QF_FP8 ? c : c / 2)) : make_uint4(0, 0, 0, 0);
    pdl_trigger();
    pdl_wait();
    for (; c < k; c += QG_THREADS * E) {
        int cn = c + QG_THREADS * E;
        uint4 nxt[QG_ROWS];
#pragma unroll
        for (int r = 0; r < QG_ROWS; r++)
            nxt[r] = cn < k ? ld_stream16(wr[r] + (FMT == QF_FP8 ? cn : cn / 2))
                            : make_uint4(0, 0, 0, 0);
#pragma unroll
        for (int j = 0; j < N; j++) {
            if (j >= n) break;
            float xf[E];
            load_x<E>(xf, x + (size_t)j * k + c);
            if (fx.nw) { /* n = 1 */
#pragma unroll
                for (int i = 0; i < E; i++) {
                    ss += xf[i] * xf[i];
                    xf[i] *= bf2f(fx.nw[c + i]);
                }
            }
            float sx[HALVES];
#pragma unroll
            for (int h = 0; h < HALVES; h++) {
                sx[h] = 0.0f;
                if (FMT == QF_INT4 && !GIDX)
#pragma unroll
                    for (int i = 0; i < 16; i++) sx[h] += xf[16 * h + i];
            }
#pragma unroll
            for (int r = 0; r < QG_ROWS; r++) {
                int row = min(rows[r], m - 1);
#pragma unroll
                for (int h = 0; h < HALVES; h++) {
                    float f[16];
                    codes16<FMT>(cur[r], h, f, lut);
                    int cc = c + 16 * h;
                    if (GIDX) {
                        int part = (row >= q.p1) + (row >= q.p2);
                        const int32_t *gi = q.g_idx + (size_t)part * k + cc;
                        const float *sr = q.scales + (size_t)row * q.scols;
                        const float *zr = q.zeros + (size_t)row * q.scols;
                        float d = 0.0f;
#pragma unroll
                        for (int i = 0; i < 16; i++) {
                            int g = __ldg(gi + i);
                            d += (f[i] - __ldg(zr + g)) * __ldg(sr + g) * xf[16 * h + i];
                        }
                        acc[r][j] += d;
                    } else {
                        size_t si = (size_t)(row >> q.rsh) * q.scols + (cc >> q.csh);
                        float d = 0.0f;
#pragma unroll
                        for (int i = 0; i < 16; i++) d += f[i] * xf[16 * h + i];
                        if (FMT == QF_INT4) d -= __ldg(q.zeros + si) * sx[h];
                        acc[r][j] += __ldg(q.scales + si) * d;
                    }
                }
            }
        }
#pragma unroll
        for (int r = 0; r < QG_ROWS; r++) cur[r] = nxt[r];
    }
    /* rsqrt(mean(x^2) + eps) of the norm fusion (every thread gets it) */
    float scale = fx.nw ? rsqrtf(block_sum(ss) / (float)k + fx.eps) : 1.0f;
#pragma unroll
    for (int r = 0; r < QG_ROWS; r++)
#pragma unroll
        for (int j = 0; j < N; j++) {
            float s = warp_sum(acc[r][j]);
            if (lane == 0) red[warp][r][j] = s;
        }
    __syncthreads();
    if (warp == 0) {
        int r = lane / N, j = lane % N, row = r < QG_ROWS ? rows[r] : m;
        float s = 0.0f;
        if (lane < QG_ROWS * N) {
#pragma unroll
            for (int i = 0; i < QG_WARPS; i++) s += red[i][r][j];
            s = s * scale + (bias && row < m ? bf2f(bias[row]) : 0.0f);
        }
        if (lane < QG_ROWS * N && j < n && row < m) {
            out[(size_t)j * m + row] = s;
            if (fx.resid) fx.resid[row] += s;
        }
        if (fx.act) { /* N = 1: lanes 0, 1 hold gate rows 2b, 2b + 1; lanes 2, 3 their up rows */
            float u = __shfl_down_sync(0xffffffffu, s, 2);
            if (lane < 2 && rows[lane] < m / 2) fx.act[rows[lane]] = glu_mul(s, u, fx.gelu);
        }
    }
    if (fx.nw && fx.h && blockIdx.x == 0 && warp == 1) /* (warp 0 is busy above) */
        for (int i = lane * 4; i < k; i += 32 * 4) {
            float4 v = *reinterpret_cast<const float4 *>(x + i);
            v.x *= scale * bf2f(fx.nw[i]); v.y *= scale * bf2f(fx.nw[i + 1]);
            v.z *= scale * bf2f(fx.nw[i + 2]); v.w *= scale * bf2f(fx.nw[i + 3]);
            *reinterpret_cast<float4 *>(fx.h + i) = v;
        }
}

/* grid ceil(m / QG_ROWS), block QG_THREADS; N 1 for one row, else 8. */
#define ATLAS_QGEMV(NAME, FMT, N, GIDX)                                                           \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                      \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2) {                                                 \
        qgemv_body<FMT, N, GIDX>(out, x, w, bias, n, m, k,                                         \
                                 qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2});            \
    }
ATLAS_QGEMV(atlas_qgemv8_int4g, QF_INT4, 8, true) /* act-order's 2..8 rows (no qmma for it) */

/* One row, with the fusions of qfuse (NULL pointers: off): the arguments of atlas_qgemv, then
 * nw, eps, h, resid, act, gelu. grid ceil(m / QG_ROWS) (with act: m / QG_ROWS, m % 4 == 0). */
#define ATLAS_QGEMV1(NAME, FMT, GIDX)                                                             \
    extern "C" __global__ void __launch_bounds__(QG_THREADS)                                      \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2, const bf16_t *nw, float eps, float *h,            \
             float *resid, float *act, int gelu) {                                                 \
        qgemv_body<FMT, 1, GIDX>(out, x, w, bias, 1, m, k,                                         \
                                 qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2},             \
                                 qfuse{nw, eps, h, resid, act, gelu});                             \
    }
ATLAS_QGEMV1(atlas_qgemv1_fp8, QF_FP8, false)
ATLAS_QGEMV1(atlas_qgemv1_int4, QF_INT4, false)
ATLAS_QGEMV1(atlas_qgemv1_int4g, QF_INT4, true)
ATLAS_QGEMV1(atlas_qgemv1_fp4, QF_FP4, false)

/* The E (16 or 32) weights of one 16-byte load of row `row` from column c, dequantized. */
template <int FMT>
__device__ __forceinline__ void qrow(const uint4 &u, float *f, int row, int c, int k, qargs q,
                                     const float *lut) {
    constexpr int HALVES = FMT == QF_FP8 ? 1 : 2;
#pragma unroll
    for (int h = 0; h < HALVES; h++) {
        codes16<FMT>(u, h, f + 16 * h, lut);
        int cc = c + 16 * h;
        size_t si = (size_t)(row >> q.rsh) * q.scols + ((cc < k ? cc : 0) >> q.csh);
        float s = __ldg(q.scales + si), z = FMT == QF_INT4 ? __ldg(q.zeros + si) : 0.0f;
#pragma unroll
        for (int i = 0; i < 16; i++) f[16 * h + i] = (f[16 * h + i] - z) * s;
    }
}

/* w as bf16 [m, k]: a thread a 16-byte load of codes (grid-stride). */
template <int FMT, bool GIDX>
__device__ __forceinline__ void dequant_body(bf16_t *out, const uint8_t *w, int m, int k,
                                             qargs q) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    constexpr int HALVES = E / 16;
    __shared__ float lut[16];
    lut_init<FMT>(lut);
    pdl_wait(); /* the scratch may still be read by the previous matmul */
    const long long per_row = k / E, total = (long long)m * per_row;
    for (long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x; i < total;
         i += (long long)gridDim.x * blockDim.x) {
        int row = (int)(i / per_row), c0 = (int)(i % per_row) * E;
        uint4 u = ld_stream16(w + (size_t)row * (FMT == QF_FP8 ? k : k / 2) +
                              (FMT == QF_FP8 ? c0 : c0 / 2));
        float f[E];
        if (GIDX) { /* a scale and zero a column */
            const int32_t *gi = q.g_idx + (size_t)((row >= q.p1) + (row >= q.p2)) * k + c0;
#pragma unroll
            for (int h = 0; h < HALVES; h++) codes16<FMT>(u, h, f + 16 * h, lut);
#pragma unroll
            for (int j = 0; j < E; j++) {
                size_t si = (size_t)row * q.scols + __ldg(gi + j);
                f[j] = (f[j] - __ldg(q.zeros + si)) * __ldg(q.scales + si);
            }
        } else {
            qrow<FMT>(u, f, row, c0, k, q, lut);
        }
        uint4 *dst = reinterpret_cast<uint4 *>(out + (size_t)row * k + c0);
#pragma unroll
        for (int j = 0; j < E / 8; j++)
            dst[j] = make_uint4(pack_bf16x2(f[8 * j], f[8 * j + 1]),
                                pack_bf16x2(f[8 * j + 2], f[8 * j + 3]),
                                pack_bf16x2(f[8 * j + 4], f[8 * j + 5]),
                                pack_bf16x2(f[8 * j + 6], f[8 * j + 7]));
    }
    pdl_trigger();
}

/* grid-stride; any grid, block 256. */
#define ATLAS_QDEQUANT(NAME, FMT, GIDX)                                                           \
    extern "C" __global__ void __launch_bounds__(256)                                             \
        NAME(bf16_t *out, const uint8_t *w, int m, int k, const float *scales,                     \
             const float *zeros, const int32_t *g_idx, int rsh, int csh, int scols, int p1,        \
             int p2) {                                                                             \
        dequant_body<FMT, GIDX>(out, w, m, k,                                                      \
                                qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2});             \
    }
ATLAS_QDEQUANT(atlas_qdequant_fp8, QF_FP8, false)
ATLAS_QDEQUANT(atlas_qdequant_int4, QF_INT4, false)
ATLAS_QDEQUANT(atlas_qdequant_int4g, QF_INT4, true)
ATLAS_QDEQUANT(atlas_qdequant_fp4, QF_FP4, false)

/* --- 2 to 64 rows on the tensor cores ----------------------------------------------------------
 * atlas_qmma<NG>_<fmt>: out[n, m] = x[n, k] @ w^T (+ bias), n <= 8 NG, as atlas_gemv_mma
 * (kernels/gemv.cu) does for bf16: a block owns 16 weight rows and its 4 warps share k; each
 * lane loads 16 bytes of codes of rows g and g + 8 (g = lane / 4) a chunk, dequantizes them in
 * registers (scale applied in fp32, then rounded to bf16 as a bf16 checkpoint's weights are)
 * into the A fragments of mma.sync m16n8k16, and multiplies them with x rows g, g + 8, ... of
 * the same columns (x split into hi + lo bf16, as there). The k order inside a lane's columns
 * is permuted the same way for w and x. Every weight byte is read once whatever n is, so a
 * serving step of 16 or 64 sequences reads the packed bytes, not a bf16 copy. */
enum { QM_WARPS = 4 };

template <int FMT, int NG>
__device__ __forceinline__ void qmma_body(float *out, const float *x, const uint8_t *w,
                                          const bf16_t *bias, int n, int m, int k, qargs q) {
    constexpr int E = FMT == QF_FP8 ? 16 : 32;
    constexpr int CH = 4 * E; /* columns a warp takes a chunk */
    __shared__ float lut[16];
    __shared__ float red[QM_WARPS][NG][4][32];
    lut_init<FMT>(lut);
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, qq = lane & 3;
    const int r0 = blockIdx.x * 16, rl = min(r0 + g, m - 1), rh = min(r0 + g + 8, m - 1);
    const size_t rbytes = FMT == QF_FP8 ? (size_t)k : (size_t)k / 2;
    const uint8_t *wl = w + (size_t)rl * rbytes, *wh = w + (size_t)rh * rbytes;
    const int nch = (k + CH - 1) / CH;
    float c[NG][4], c2[NG][4];
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) c[j][i] = c2[j][i] = 0.0f;
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
        {
            float fl[E], fh[E];
            qrow<FMT>(cl, fl, rl, cb, k, q, lut);
            qrow<FMT>(chh, fh, rh, cb, k, q, lut);
#pragma unroll
            for (int s = 0; s < E / 4; s++) {
                uint32_t a[4] = {pack_bf16x2(fl[4 * s], fl[4 * s + 1]),
                                 pack_bf16x2(fh[4 * s], fh[4 * s + 1]),
                                 pack_bf16x2(fl[4 * s + 2], fl[4 * s + 3]),
                                 pack_bf16x2(fh[4 * s + 2], fh[4 * s + 3])};
#pragma unroll
                for (int j = 0; j < NG; j++) {
                    int xr = j * 8 + g;
                    if (j * 8 >= n) break;
                    float4 xv = xr < n && in ? __ldg(reinterpret_cast<const float4 *>(
                                             x + (size_t)xr * k + cb + 4 * s))
                                       : make_float4(0.f, 0.f, 0.f, 0.f);
                    uint32_t h0, l0, h1, l1;
                    split_bf16x2(xv.x, xv.y, h0, l0);
                    split_bf16x2(xv.z, xv.w, h1, l1);
                    mma_bf16_16816(c[j], a, h0, h1);
                    mma_bf16_16816(c2[j], a, l0, l1);
                }
            }
        }
        cl = nl;
        chh = nh;
    }
    /* c[j][0..1]: row r0 + g, x rows 8j + 2qq, + 1; c[j][2..3]: row r0 + g + 8 */
#pragma unroll
    for (int j = 0; j < NG; j++)
#pragma unroll
        for (int i = 0; i < 4; i++) red[warp][j][i][lane] = c[j][i] + c2[j][i];
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
                out[(size_t)col * m + row] = v + (bias ? bf2f(bias[row]) : 0.0f);
        }
}

/* grid ceil(m / 16), block 128; the arguments of atlas_qgemv (g_idx, p1, p2 unused). */
#define ATLAS_QMMA(NAME, FMT, NG)                                                                 \
    extern "C" __global__ void __launch_bounds__(QM_WARPS * 32)                                   \
        NAME(float *out, const float *x, const uint8_t *w, const bf16_t *bias, int n, int m,       \
             int k, const float *scales, const float *zeros, const int32_t *g_idx, int rsh,        \
             int csh, int scols, int p1, int p2) {                                                 \
        qmma_body<FMT, NG>(out, x, w, bias, n, m, k,                                               \
                           qargs{scales, zeros, g_idx, rsh, csh, scols, p1, p2});                  \
    }
#define ATLAS_QMMA_ALL(FMTNAME, FMT)                                                              \
    ATLAS_QMMA(atlas_qmma1_##FMTNAME, FMT, 1)                                                      \
    ATLAS_QMMA(atlas_qmma2_##FMTNAME, FMT, 2)                                                      \
    ATLAS_QMMA(atlas_qmma4_##FMTNAME, FMT, 4)                                                      \
    ATLAS_QMMA(atlas_qmma8_##FMTNAME, FMT, 8)
ATLAS_QMMA_ALL(fp8, QF_FP8)
ATLAS_QMMA_ALL(int4, QF_INT4)
ATLAS_QMMA_ALL(fp4, QF_FP4)
